"""Helpers for the Slurm end-to-end tests and bench: cluster detection, a PostgreSQL-backed Dagster home
(a fresh database per call on the server of resources/postgres/postgres.sh), and run-worker processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SH = REPO / "resources" / "slurm" / "cluster.sh"
PIPELINE = Path(__file__).resolve().parent / "slurm_pipeline.py"
PG_DIR = Path(os.environ.get("DAGSTER_GPU_PG_DIR", "/tmp/dagster-gpu-pg"))
PG_PORT = int(os.environ.get("DAGSTER_GPU_PG_PORT", "55432"))


def slurm_conf() -> str:
    return os.environ.get("SLURM_CONF") or str(Path(os.environ.get("DAGSTER_GPU_SLURM_DIR", "/tmp/dagster-gpu-slurm")) / "etc" / "slurm.conf")


def cluster_unavailable_reason() -> str | None:
    """None when the local Slurm cluster answers, else why not (for pytest.skip)."""
    if shutil.which("sbatch") is None:
        return "Slurm is not installed (run resources/slurm/cluster.sh start)"
    conf = slurm_conf()
    if not Path(conf).exists():
        return f"no Slurm cluster config at {conf} (run resources/slurm/cluster.sh start)"
    env = {**os.environ, "SLURM_CONF": conf}
    cp = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, env=env, timeout=20)
    if "is UP" not in cp.stdout:
        return f"the Slurm controller is not running (scontrol ping: {cp.stdout.strip() or cp.stderr.strip()}); run resources/slurm/cluster.sh start"
    cp = subprocess.run(["sinfo", "--noheader", "-o", "%T"], capture_output=True, text=True, env=env, timeout=20)
    if not any(s.strip().rstrip("*~") in ("idle", "mixed", "allocated", "completing") for s in cp.stdout.splitlines()):
        return f"no usable Slurm node (sinfo: {cp.stdout.strip()})"
    return None


def postgres_unavailable_reason() -> str | None:
    if not (PG_DIR / "password").exists():
        return f"PostgreSQL not started (no {PG_DIR}/password; run resources/postgres/postgres.sh start)"
    cp = subprocess.run(["psql", "-h", str(PG_DIR), "-p", str(PG_PORT), "-U", "postgres", "-qtAc", "select 1"], capture_output=True, text=True)
    if cp.returncode != 0:
        return f"PostgreSQL not reachable: {cp.stderr.strip()}"
    return None


def make_dagster_home(max_concurrent_runs: int = 50, extra_yaml: str = "") -> tuple[Path, dict[str, str]]:
    """A temp DAGSTER_HOME on a fresh PostgreSQL database (``extra_yaml`` appended to its dagster.yaml,
    e.g. a ``run_monitoring:`` section); returns (home, env to run processes with)."""
    db = f"dagster_slurm_{uuid.uuid4().hex[:10]}"
    subprocess.run(
        ["psql", "-h", str(PG_DIR), "-p", str(PG_PORT), "-U", "postgres", "-qtAc", f"CREATE DATABASE {db} OWNER dagster"],
        check=True,
        capture_output=True,
    )
    home = Path(tempfile.mkdtemp(prefix="dagster-slurm-home-"))
    (home / "dagster.yaml").write_text(
        f"""storage:
  postgres:
    postgres_db:
      username: dagster
      password: {{env: DAGSTER_PG_PASSWORD}}
      hostname: 127.0.0.1
      port: {PG_PORT}
      db_name: {db}
      scheme: postgresql+psycopg2
run_coordinator:
  module: dagster._core.run_coordinator.queued_run_coordinator
  class: QueuedRunCoordinator
  config: {{max_concurrent_runs: {max_concurrent_runs}, dequeue_interval_seconds: 1}}
compute_logs:
  module: dagster._core.storage.noop_compute_log_manager
  class: NoOpComputeLogManager
telemetry: {{enabled: false}}
"""
        + extra_yaml
    )
    (home / "workspace.yaml").write_text(f"load_from:\n  - python_file:\n      relative_path: {PIPELINE}\n      location_name: slurm_tests\n")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "DAGSTER_PG_PASSWORD": (PG_DIR / "password").read_text().strip(),
        "SLURM_CONF": slurm_conf(),
        "DAGSTER_GPU_SLURM_SPOOL": str(home / "slurm-spool"),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    # Create the instance's tables now, as a deployment's webserver or `dagster instance migrate` has
    # before any run starts: Dagster's PostgreSQL storages race when several processes create them at
    # once (`relation "instance_info" already exists`, recorded from a run of 8 concurrent run workers).
    subprocess.run(
        [sys.executable, "-c", "import dagster as dg\nwith dg.DagsterInstance.get() as i: i.get_runs(limit=1)"],
        env=env, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return home, env


def start_runs(env: dict[str, str], keys, sleep_s: float = 0.0) -> list[subprocess.Popen]:
    """One run-worker process per partition key (as a backfill's runs are), all started at once."""
    procs = []
    for i, k in enumerate(keys):
        log = open(Path(env["DAGSTER_HOME"]) / f"run-{i:03d}.log", "wb")
        procs.append(
            subprocess.Popen([sys.executable, str(PIPELINE), "run", k, str(sleep_s)], env=env, stdout=log, stderr=subprocess.STDOUT)
        )
    return procs


def wait_all(procs, timeout_s: float) -> list[int | None]:
    deadline = time.time() + timeout_s
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            pass
    return [p.poll() for p in procs]


def explain_failures(home: Path, keys, codes) -> str:
    """For every run worker that did not exit 0: its partition, the error events its run recorded
    (step failures, engine errors) and the tail of its log, so a failed assertion says why."""
    import dagster as dg
    from dagster._core.events import DagsterEventType

    failed = [(i, k, c) for i, (k, c) in enumerate(zip(keys, codes)) if c != 0]
    if not failed:
        return ""
    errors: dict[str, list[str]] = {}
    with dg.DagsterInstance.get() as inst:
        for run in inst.get_runs():
            key = run.tags.get("dagster/partition")
            for rec in inst.get_records_for_run(run.run_id).records:
                ev = rec.event_log_entry.dagster_event
                if ev and ev.event_type in (DagsterEventType.STEP_FAILURE, DagsterEventType.RUN_FAILURE, DagsterEventType.ENGINE_EVENT):
                    err = getattr(ev.event_specific_data, "error", None)
                    if ev.event_type != DagsterEventType.ENGINE_EVENT or err is not None:
                        errors.setdefault(key, []).append(f"{ev.event_type_value}: {ev.message or ''} {err.to_string() if err else ''}"[:3000])
    out = []
    for i, k, c in failed:
        log = Path(home) / f"run-{i:03d}.log"
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
        out.append(f"--- run worker {i} (partition {k!r}) exited {c}\nerrors: {errors.get(k, [])}\nlog tail:\n{tail}")
    return "\n".join(out)


def spool_batches(spool: Path) -> list[dict]:
    """submitted.json of every job array in a spool, oldest first."""
    import json

    out = []
    for d in sorted((spool / "batches").glob("*")):
        f = d / "submitted.json"
        if f.exists():
            out.append({"batch": d.name, **json.loads(f.read_text())})
    return out
