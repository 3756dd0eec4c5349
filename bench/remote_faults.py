"""Benchmark: transport faults during a ranged backfill run from off the cluster (SSH or slurmrestd, events relayed).

    eval "$(bash resources/slurm/trixie.sh env)"; export DGPU_TEST_SLURM_PYTHON=$DAGSTER_GPU_SLURM_WORKER_PYTHON
    bash resources/postgres/postgres.sh start; bash resources/ssh/sshd.sh start
    .venv/bin/python bench/remote_faults.py [--files 300] [--per-run 50] [--order ssh,rest]

Each variant is bench/ranged_backfill.py's ``run_backfill`` through gpu_executor's slurm backend on the 24.11 test
cluster, with ``events: relay`` and tasks that cannot open the instance (tests/slurm_helpers.py
``no_database_env``: every event comes back through the run workers' relay), as bench/remote_backfill.py's
``<transport>-relay`` variants. While it runs, faults fire once each when the backfill has materialized a given
fraction of its partitions (:data:`FAULTS`; a fraction, not a time, so a slow host moves them with the work):

========================= =====================================================================================
``ssh_master_kill``       the shared OpenSSH ControlMaster SIGKILLed (its socket left behind, stale)
``run_worker_kill``       one run worker SIGKILLed while its unit runs and its relay has stored part of the
                          channel; Dagster's run monitoring (the daemon's, ``max_resume_run_attempts``) sees it
                          failed and resumes the run, as it does with K8sRunLauncher where Dagster off the
                          cluster usually runs: the runs are launched by bench/process_launcher.py, which
                          behaves as K8sRunLauncher does (Dagster's DefaultRunLauncher marks the run failed instead)
``slurmrestd_restart``    slurmrestd stopped for :data:`RESTD_DOWN_S` seconds, then started
``token_expired_renewed`` the token file replaced by a token that has expired; a fresh one written
                          :data:`TOKEN_EXPIRED_S` seconds later (what a late renewal cron does)
========================= =====================================================================================

Counted after the backfill and its bills: partitions materialized exactly once, lost (no materialization) and
duplicated (more than one), steps that failed (STEP_FAILURE events), runs not successful, partitions without a
scheduler bill (an observation with ``bill/source`` ``sacct``), runs resumed by run monitoring, the run workers'
failed polls by cause (what the outage looked like to them), the relay's torn/refused lines and delays, and for
``ssh`` the TCP connections sshd accepted (a killed master is re-made: 2). Writes bench/results/remote_faults.json (``--out``) and, at the
default size, ``faults.remote.*`` to bench/results/summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

import dagster as dg  # noqa: E402
import rest_helpers as R  # noqa: E402
import slurm_helpers as H  # noqa: E402
import ssh_helpers as SSH  # noqa: E402
from make_corpus import make_corpus  # noqa: E402
from process_launcher import PID_TAG  # noqa: E402
from ranged_backfill import all_records, run_backfill  # noqa: E402
from remote_backfill import relay_figures, transport_env  # noqa: E402
from summary import merge_summary  # noqa: E402
from dagster_gpu.billing.keys import SOURCE, bill_value  # noqa: E402

#: the faults of each transport and the fraction of the backfill's partitions materialized when each fires
FAULTS: dict[str, dict[str, float]] = {
    "ssh": {"ssh_master_kill": 0.15, "run_worker_kill": 0.35},
    "rest": {"slurmrestd_restart": 0.15, "run_worker_kill": 0.35, "token_expired_renewed": 0.5},
}
RESTD_DOWN_S = 20.0
TOKEN_EXPIRED_S = 30.0
ASSET = dg.AssetKey("ranged_embeddings")
#: the instance: runs launched as separate processes, resumed by run monitoring (bench/process_launcher.py)
DAGSTER_YAML = """run_launcher:
  module: process_launcher
  class: ProcessRunLauncher
run_monitoring:
  enabled: true
  poll_interval_seconds: 5
  max_resume_run_attempts: 2
"""


def say(msg: str) -> None:
    print(f"[remote_faults {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Injector:
    """Fires the variant's faults from ``run_backfill``'s progress callback, each on its own thread (an outage
    must not hold up the poll), and records what each did."""

    def __init__(self, transport: str, socket: str | None, token: Path | None):
        self.transport, self.socket, self.token = transport, socket, token
        self.pending = dict(FAULTS[transport])
        self.records: list[dict] = []
        self.threads: list[threading.Thread] = []

    def __call__(self, instance, backfill_id: str, progress) -> None:
        done = progress.succeeded / max(progress.total, 1)
        for name, at in list(self.pending.items()):
            if done >= at:
                del self.pending[name]
                rec = {"fault": name, "at_fraction": at, "fired_at_fraction": round(done, 3), "fired_at": time.time()}
                self.records.append(rec)
                t = threading.Thread(target=self._fire, args=(name, rec, instance, backfill_id), daemon=True)
                t.start()
                self.threads.append(t)

    def _fire(self, name: str, rec: dict, instance, backfill_id: str) -> None:
        try:
            getattr(self, f"_{name}")(rec, instance, backfill_id)
        except Exception as e:  # noqa: BLE001 - a fault that could not fire is reported, never hidden
            rec["error"] = f"{type(e).__name__}: {e}"
        say(f"fault {name}: {json.dumps({k: v for k, v in rec.items() if k != 'fired_at'})}")

    def _ssh_master_kill(self, rec: dict, instance, backfill_id: str) -> None:
        cp = subprocess.run(["ssh", "-O", "check", "-S", self.socket, "dagster-gpu-bench"], capture_output=True, text=True)
        m = re.search(r"pid=(\d+)", cp.stderr)
        if not m:
            raise RuntimeError(f"no master on {self.socket}: {cp.stderr.strip()}")
        os.kill(int(m.group(1)), signal.SIGKILL)
        rec["master_pid"] = int(m.group(1))

    def _slurmrestd_restart(self, rec: dict, instance, backfill_id: str) -> None:
        subprocess.run(["bash", str(H.TRIXIE_SH), "stop-slurmrestd"], check=True, capture_output=True, timeout=60)
        time.sleep(RESTD_DOWN_S)
        subprocess.run(["bash", str(H.TRIXIE_SH), "start-slurmrestd"], check=True, capture_output=True, timeout=120)
        rec["down_s"] = round(time.time() - rec["fired_at"], 1)

    def _token_expired_renewed(self, rec: dict, instance, backfill_id: str) -> None:
        R.write_token(self.token, 1)  # Slurm's exp is whole seconds: expired a second or two from now
        time.sleep(TOKEN_EXPIRED_S)
        R.write_token(self.token, 4 * 3600)
        rec["expired_s"] = round(time.time() - rec["fired_at"], 1)

    def _run_worker_kill(self, rec: dict, instance, backfill_id: str) -> None:
        """The run of the backfill, still in progress, whose relay has stored the most materializations: its
        run worker (the ``dagster api execute_run`` process whose argv names the run) SIGKILLed, the run resumed."""
        started = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED], tags={"dagster/backfill": backfill_id}))
        stored = {r.run_id: len(instance.get_records_for_run(r.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records)
                  for r in started}
        candidates = [r for r in started if stored[r.run_id] > 0]
        if not candidates:
            raise RuntimeError(f"no run in progress with a relayed materialization (runs started: {len(started)})")
        run = max(candidates, key=lambda r: stored[r.run_id])
        pid = int(run.tags[PID_TAG])
        os.kill(pid, signal.SIGKILL)
        rec.update(run_id=run.run_id, run_worker_pid=pid, materializations_stored_before=stored[run.run_id])

    def join(self) -> None:
        for t in self.threads:
            t.join(timeout=300)


def resumes(home: str) -> dict[str, int]:
    """Run id -> how many times run monitoring resumed it, from its "Resuming run" engine events."""
    with dg.DagsterInstance.from_config(home) as instance:
        out = {}
        for r in instance.get_runs():
            n = sum(1 for e in instance.get_records_for_run(r.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT).records
                    if "Resuming run" in (e.event_log_entry.message or ""))
            if n:
                out[r.run_id] = n
    return out


def poll_failures(home: str) -> dict[str, int]:
    """The run workers' failed shared polls (their "slurm poll failed" warnings: states stay unknown, nothing
    fails), by cause: ``token`` (slurmrestd refused the token), ``unreachable`` (no connection), ``other``."""
    out = Counter()
    for log in (Path(home) / "run-workers").glob("*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if "slurm poll failed" in line:
                out["token" if "refused the token" in line else "unreachable" if "unreachable" in line else "other"] += 1
    return dict(out)


def outcome(home: str, keys: list[str]) -> dict:
    """Exactly-once, lost, duplicated, failed steps, unsuccessful runs and unbilled partitions of the backfill
    stored at DAGSTER_HOME ``home`` (read after it ended and its bills were written)."""
    with dg.DagsterInstance.from_config(home) as instance:
        mats = Counter(r.partition_key for r in all_records(instance.fetch_materializations, dg.AssetRecordsFilter(asset_key=ASSET)))
        billed = {r.partition_key for r in all_records(instance.fetch_observations, dg.AssetRecordsFilter(asset_key=ASSET))
                  if (v := bill_value(r.asset_observation.metadata, SOURCE)) is not None and v.value == "sacct"}
        runs = instance.get_runs()
        failures = sum(len(instance.get_records_for_run(r.run_id, of_type=dg.DagsterEventType.STEP_FAILURE).records) for r in runs)
        not_ok = [f"{r.run_id}: {r.status.value}" for r in runs if r.status != dg.DagsterRunStatus.SUCCESS]
    return {"materialized_once": sum(1 for k in keys if mats[k] == 1), "lost": sum(1 for k in keys if mats[k] == 0),
            "duplicated": sum(1 for k in keys if mats[k] > 1), "step_failures": failures, "runs_not_successful": not_ok,
            "unbilled": sum(1 for k in keys if k not in billed)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=300)
    ap.add_argument("--records", type=int, default=20)
    ap.add_argument("--per-run", type=int, default=50)
    ap.add_argument("--max-runs", type=int, default=8)
    ap.add_argument("--order", default="ssh,rest", help="transports, in the order they run")
    ap.add_argument("--out", default="remote_faults.json", help="the run's figures, under bench/results/")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "dagster-gpu-bench-remote-faults")
    a = ap.parse_args()
    reason = H.cluster_unavailable_reason() or H.postgres_unavailable_reason()
    if reason:
        sys.exit(f"cannot run: {reason}")
    # the daemon and the run workers import bench/process_launcher.py (DAGSTER_YAML's run_launcher)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO / "bench"), os.environ.get("PYTHONPATH", "")])
    transports = a.order.split(",")
    sshd = SSH.sshd_env() if "ssh" in transports else None
    corpus = a.workdir / "corpus"
    import shutil

    shutil.rmtree(corpus, ignore_errors=True)
    make_corpus(corpus, a.files, a.records)
    keys = sorted(p.name for p in corpus.iterdir())
    res: dict[str, dict] = {}
    for t in transports:
        env, socket = transport_env(t, sshd, a.workdir)
        env.update(H.no_database_env(a.workdir))
        token = Path(env["DGPU_TEST_REST_CREDENTIAL_FILE"]) if t == "rest" else None
        injector = Injector(t, socket, token)
        before = SSH.logins(sshd) if sshd else 0
        try:
            r = run_backfill(f"faults-{t}", corpus, keys, a.per_run, a.max_runs, a.workdir, extra_env=env,
                             on_progress=injector, extra_yaml=DAGSTER_YAML)
            injector.join()
        finally:
            if socket:
                subprocess.run(["ssh", "-O", "exit", "-S", socket, "dagster-gpu-bench"], capture_output=True)
        r.update(**outcome(r["home"], keys), **relay_figures(r["home"]), faults=injector.records,
                 faults_not_fired=sorted(injector.pending), resumes=resumes(r["home"]),
                 poll_failures=poll_failures(r["home"]))
        if t == "ssh":
            r["ssh_connections"] = SSH.logins(sshd) - before
        res[t] = r
        print(json.dumps(r), flush=True)
    fired = sum(1 for r in res.values() for f in r["faults"] if "error" not in f)
    summary = {"faults.remote.injected": fired,
               "faults.remote.partitions": len(keys) * len(res),
               "faults.remote.partitions_lost": sum(r["lost"] for r in res.values()),
               "faults.remote.duplicates": sum(r["duplicated"] for r in res.values()),
               "faults.remote.step_failures": sum(r["step_failures"] for r in res.values()),
               "faults.remote.unbilled_partitions": sum(r["unbilled"] for r in res.values())}
    print(json.dumps(summary), flush=True)
    (REPO / "bench" / "results" / a.out).write_text(
        json.dumps({"files": a.files, "per_run": a.per_run, "order": transports, **res, "summary": summary}, indent=1) + "\n")
    if a.files == 300 and a.per_run == 50 and not any(r["faults_not_fired"] for r in res.values()):
        merge_summary(summary)


if __name__ == "__main__":
    main()
