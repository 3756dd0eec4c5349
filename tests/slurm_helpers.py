"""Helpers for the Slurm end-to-end tests and bench: the two local clusters (Slurm 22.05 from
resources/slurm/cluster.sh, 24.11 from resources/slurm/trixie.sh) and their detection, a PostgreSQL-backed Dagster home
(a fresh database per call on the server of resources/postgres/postgres.sh), and run-worker processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from pipelines.instance_yaml import dagster_yaml

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SH = REPO / "resources" / "slurm" / "cluster.sh"
TRIXIE_SH = REPO / "resources" / "slurm" / "trixie.sh"
PIPELINE = Path(__file__).resolve().parent / "slurm_pipeline.py"
PG_DIR = Path(os.environ.get("DAGSTER_GPU_PG_DIR", "/tmp/dagster-gpu-pg"))
PG_PORT = int(os.environ.get("DAGSTER_GPU_PG_PORT", "55432"))


#: Test-only variable naming the interpreter array tasks run (tests/slurm_pipeline.py puts it in the
#: executor's ``slurm.python`` and ``worker_python``): set for the 24.11 cluster, whose tasks run in a chroot.
WORKER_PYTHON_ENV = "DGPU_TEST_SLURM_PYTHON"


@dataclass(frozen=True)
class SlurmCluster:
    """One of the local test clusters: ``version`` (what ``sinfo -V`` must print, e.g. ``24.11``), the
    script that runs it, its state dir, the directory of client wrappers to put first on PATH (None: the
    host's own Slurm commands) and the interpreter its array tasks run (None: this one)."""

    version: str
    script: Path
    state_dir: Path
    bin_dir: Path | None = None
    worker_python: str | None = None

    @property
    def conf(self) -> str:
        return str(self.state_dir / "etc" / "slurm.conf")

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The variables a process needs to use this cluster (SLURM_CONF, PATH, the worker interpreter)."""
        base = dict(os.environ if base is None else base)
        out = {"SLURM_CONF": self.conf}
        path = [p for p in base.get("PATH", os.defpath).split(os.pathsep) if p and p not in WRAPPER_DIRS]
        out["PATH"] = os.pathsep.join(([str(self.bin_dir)] if self.bin_dir else []) + path)
        if self.worker_python:
            out[WORKER_PYTHON_ENV] = self.worker_python
        return out


#: resources/slurm/cluster.sh: Debian 12 bookworm's Slurm 22.05 on the host.
SLURM_22_05 = SlurmCluster("22.05", CLUSTER_SH, Path(os.environ.get("DAGSTER_GPU_SLURM_DIR", "/tmp/dagster-gpu-slurm")))
_TRIXIE_DIR = Path(os.environ.get("DAGSTER_GPU_SLURM_TRIXIE_DIR", "/tmp/dagster-gpu-slurm-2411"))
#: resources/slurm/trixie.sh: Debian 13 trixie's Slurm 24.11 in a chroot, its commands through wrappers.
SLURM_24_11 = SlurmCluster("24.11", TRIXIE_SH, _TRIXIE_DIR, _TRIXIE_DIR / "bin", str(_TRIXIE_DIR / "bin" / "worker-python"))
CLUSTERS = {c.version: c for c in (SLURM_22_05, SLURM_24_11)}
WRAPPER_DIRS = frozenset(str(c.bin_dir) for c in CLUSTERS.values() if c.bin_dir)


def tested_versions(env: dict[str, str] | None = None) -> list[str]:
    """The versions the ``slurm_cluster`` fixture runs each test on: ``DAGSTER_GPU_SLURM_VERSIONS``
    (comma-separated, e.g. ``22.05``), default all of :data:`CLUSTERS`. Raises ValueError naming an unknown one."""
    raw = (os.environ if env is None else env).get("DAGSTER_GPU_SLURM_VERSIONS", "").strip()
    versions = [v.strip() for v in raw.split(",") if v.strip()] if raw else sorted(CLUSTERS)
    unknown = [v for v in versions if v not in CLUSTERS]
    if unknown:
        raise ValueError(f"DAGSTER_GPU_SLURM_VERSIONS names {unknown}; the local clusters are {sorted(CLUSTERS)}")
    return versions


def on_slurm(version: str):
    """A mark that runs a test taking the ``slurm_cluster`` fixture on the cluster of ``version`` only (the id the
    fixture gives it, ``slurm-<version>``), instead of on each of :func:`tested_versions`."""
    import pytest

    return pytest.mark.parametrize("slurm_cluster", [pytest.param(version, id=f"slurm-{version}")], indirect=True)


def slurm_conf() -> str:
    return os.environ.get("SLURM_CONF") or str(Path(os.environ.get("DAGSTER_GPU_SLURM_DIR", "/tmp/dagster-gpu-slurm")) / "etc" / "slurm.conf")


def cluster_unavailable_reason(cluster: SlurmCluster | None = None) -> str | None:
    """None when the local Slurm cluster answers, else why not (for pytest.skip). ``cluster`` None: the one
    the environment names (SLURM_CONF, PATH); else that cluster, whose ``sinfo -V`` must be its version."""
    start = f"run {cluster.script.relative_to(REPO) if cluster else 'resources/slurm/cluster.sh'} start"
    env = {**os.environ, **(cluster.env() if cluster else {"SLURM_CONF": slurm_conf()})}
    if shutil.which("sbatch", path=env["PATH"]) is None:
        return f"Slurm is not installed ({start})"
    conf = env["SLURM_CONF"]
    if not Path(conf).exists():
        return f"no Slurm cluster config at {conf} ({start})"
    if cluster:
        cp = subprocess.run(["sinfo", "-V"], capture_output=True, text=True, env=env, timeout=20)
        if not cp.stdout.strip().endswith(f" {cluster.version}") and f" {cluster.version}." not in cp.stdout:
            return f"sinfo -V says {cp.stdout.strip() or cp.stderr.strip()!r}, not Slurm {cluster.version} ({start})"
    cp = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, env=env, timeout=20)
    if "is UP" not in cp.stdout:
        return f"the Slurm controller is not running (scontrol ping: {cp.stdout.strip() or cp.stderr.strip()}); {start}"
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
    (home / "dagster.yaml").write_text(dagster_yaml(db, max_runs=max_concurrent_runs, user="dagster", host="127.0.0.1",
                                                    port=PG_PORT, noop_compute_logs=True, extra=extra_yaml))
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


#: Run workers started by :func:`start_runs` in the current test; the ``slurm_cluster`` fixture kills those
#: still alive when the test ends (a test that failed half-way must not leave them holding GPUs).
STARTED: list[subprocess.Popen] = []


def start_runs(env: dict[str, str], keys, sleep_s: float = 0.0) -> list[subprocess.Popen]:
    """One run-worker process per partition key (as a backfill's runs are), all started at once."""
    procs = []
    for i, k in enumerate(keys):
        log = open(Path(env["DAGSTER_HOME"]) / f"run-{i:03d}.log", "wb")
        procs.append(
            subprocess.Popen([sys.executable, str(PIPELINE), "run", k, str(sleep_s)], env=env, stdout=log, stderr=subprocess.STDOUT)
        )
    STARTED.extend(procs)
    return procs


def kill_started() -> list[int]:
    """Kill the run workers :func:`start_runs` started that are still alive; returns their pids."""
    alive = [p for p in STARTED if p.poll() is None]
    for p in alive:
        p.kill()
    for p in alive:
        p.wait(timeout=30)
    STARTED.clear()
    return [p.pid for p in alive]


def cluster_jobs(cluster: SlurmCluster) -> list[str]:
    """Every job and array task the cluster's controller lists as not finished (squeue's default states:
    pending, running, suspended, completing, configuring...), one ``id state reason`` line each."""
    env = {**os.environ, **cluster.env()}
    cp = subprocess.run(["squeue", "--noheader", "--array", "-o", "%i %T %r"], capture_output=True, text=True, env=env, timeout=30)
    return [line.strip() for line in cp.stdout.splitlines() if line.strip()]


def gpus_in_use(cluster: SlurmCluster) -> int:
    """GPUs the cluster's nodes report allocated (``sinfo GresUsed``), whoever holds them."""
    from dagster_gpu.slurm.client import SlurmClient

    env = {**os.environ, **cluster.env()}
    client = SlurmClient(slurm_conf=cluster.conf, extra_env={"PATH": env["PATH"]})
    return client.gpu_capacity(None).used


def idle_cluster(cluster: SlurmCluster, timeout_s: float = 120.0) -> list[str]:
    """Before a test: make sure no job of an earlier test holds the cluster's GPUs. Waits up to half of
    ``timeout_s`` for what is left to end by itself (a cancelled task still COMPLETING while slurmd kills its
    processes), then cancels it and waits for the GPUs to be free. Returns the jobs found at the start (empty
    when the cluster was idle). Raises AssertionError naming the jobs and GPUs still held at ``timeout_s``."""
    found = cluster_jobs(cluster)
    if not found and gpus_in_use(cluster) == 0:
        return []
    env = {**os.environ, **cluster.env()}
    deadline = time.monotonic() + timeout_s
    cancel_at = time.monotonic() + timeout_s / 2
    cancelled = False
    while time.monotonic() < deadline:
        left = cluster_jobs(cluster)
        if not left and gpus_in_use(cluster) == 0:
            return found
        if left and not cancelled and time.monotonic() >= cancel_at:
            ids = sorted({line.split()[0].split("_")[0] for line in left})
            subprocess.run(["scancel", *ids], capture_output=True, text=True, env=env, timeout=30)
            cancelled = True
        time.sleep(1.0)
    raise AssertionError(
        f"Slurm {cluster.version}: jobs of an earlier test still hold the cluster after {timeout_s:.0f}s "
        f"(found {found}; now {cluster_jobs(cluster)}, {gpus_in_use(cluster)} GPUs in use)"
    )


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


def no_database_env(home: Path) -> dict[str, str]:
    """The environment that makes gpu_executor's Slurm tasks relay their events (``events: relay``) and that
    keeps them off the database: an ``env_files`` file (0600) the tasks load last, with a wrong
    ``DAGSTER_PG_PASSWORD`` and a ``DAGSTER_HOME`` that does not exist (a task that opened the instance would fail)."""
    f = home / "no-database.env"
    f.write_text("DAGSTER_PG_PASSWORD=not-the-password\nDAGSTER_HOME=/nonexistent/dagster-home\n")
    f.chmod(0o600)
    return {"DGPU_TEST_EVENTS": "relay", "DGPU_TEST_NO_DB_ENV_FILE": str(f)}


def relay_reports(instance, run_ids) -> list[dict]:
    """The metadata of each ``dagster-gpu relay: stored ...`` engine event of ``run_ids`` (one per relayed step attempt
    that ended), with its run id under ``_run_id``."""
    import dagster as dg

    out = []
    for run_id in run_ids:
        for r in instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT).records:
            entry = r.event_log_entry
            if (entry.message or "").startswith("dagster-gpu relay: stored"):
                md = entry.dagster_event.engine_event_data.metadata
                out.append({**{k: v.value for k, v in md.items()}, "_run_id": run_id})
    return out
