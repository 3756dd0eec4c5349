"""Benchmark (issue 10 §3): a ranged backfill with ``backend: auto`` across the local Slurm cluster and the
Kubernetes control plane while faults are injected, then the missing-partitions schedule's recovery, then
the count: partitions materialized exactly once, duplicated, lost; leaked Slurm jobs, pods, ResourceClaims,
templates, spool files and step-worker processes; work units without a scheduler bill; time to recover.

    resources/slurm/cluster.sh start; resources/k8s/cluster.sh start; resources/postgres/postgres.sh start
    .venv/bin/python bench/faults.py --partitions 200 --per-run 10 --seed 1 [--no-inject] [--window-s S]

One command: a corpus of ``--partitions`` fortune files (bench/make_corpus.py), a fresh PostgreSQL database
and DAGSTER_HOME (QueuedRunCoordinator, ``--max-runs``; run monitoring on), the code location
bench/faults_pipeline.py (embedding asset, ``max_partitions_per_run=--per-run``, RetryPolicy, the
missing-partitions schedule), dagster-daemon, one asset backfill, and the injector (bench/fault_inject.py)
firing each fault of bench/fault_plan.py once (the worker kill for 5 % of the work units) at a seeded random
moment within ``--window-s`` seconds of submission. The services are shared: every fault brings its
service back up; nothing is stopped at the end. The two Kubernetes faults (an image the registry does not
have; a claim the DRA driver refuses at NodePrepareResources) each take one queued run; for them the result
says whether every partition of that run failed with a reason naming the cause and was materialized exactly
once by the rerun (``run_faults``), how long each attempt took to fail and when the run's pods were gone.
The two preemption faults (``k8s_preempt``: kube-scheduler's; ``kueue_reclaim``: Kueue reclaims the MIG slices
LocalQueue ``batch`` borrowed, for an online pod) each take one queued run too; for them the result says whether
the run launched its unit again, materialized each of its partitions exactly once itself, and billed every pod
(``kueue_reclaim`` adds ``online_wait_s``: the online workload's admission delay). The Kueue fault needs Kueue in
the control plane (resources/k8s/cluster.sh starts it) and applies resources/k8s/kueue/example/mixed-cluster.yaml.

After the backfill ends: the missing-partitions schedule is started (``dagster schedule start``) and left
to request runs for ``partitions_to_rerun`` every minute until nothing is left to rerun or
``--recovery-timeout-s`` passes; then it is stopped, bills are waited for, the daemon is stopped and
leaks are counted. Writes ``--out`` (default bench/results/faults.json) and, for a run with every fault, the
``faults.*`` keys of bench/results/summary.json (``faults.partitions``: its size); prints a JSON line per
phase and the tables.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import dagster as dg  # noqa: E402
import psutil  # noqa: E402
from dagster._core.execution.backfill import BulkActionStatus  # noqa: E402

from dagster_gpu.billing.keys import SOURCE, bill_value  # noqa: E402
from dagster_gpu.commands.backfill import BackfillRuns, DaemonProcess, backfill_progress, submit_asset_backfill  # noqa: E402
import k8s_backfill  # noqa: E402
from fault_inject import InjectContext, Injector  # noqa: E402
from fault_inject import MISSING_IMAGE  # noqa: E402
from fault_plan import (FAULTS, PREEMPT_FAULTS, RUN_FAULTS, attempt_seconds, fault_table, first_after, kills_for, plan_faults,  # noqa: E402
                        preempt_fault_outcome, run_fault_outcome, summary_keys, tally)
from make_corpus import make_corpus  # noqa: E402
from summary import merge_summary  # noqa: E402

PIPELINE = REPO / "bench" / "faults_pipeline.py"
K8S_DIR = Path(os.environ.get("DAGSTER_GPU_K8S_DIR", "/tmp/dagster-gpu-k8s"))
SCHEDULE = "fault_embeddings_missing_schedule"
_FINISHED = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
_DONE = {BulkActionStatus.COMPLETED, BulkActionStatus.COMPLETED_SUCCESS, BulkActionStatus.COMPLETED_FAILED,
         BulkActionStatus.FAILED, BulkActionStatus.CANCELED}


def say(msg: str) -> None:
    print(f"[faults {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def retrying(fn, what: str, timeout_s: float = 180.0):
    """``fn()``, retried every 2 s while it raises (PostgreSQL, slurmctld or the apiserver restarting)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            if time.monotonic() > deadline:
                raise
            say(f"{what}: {type(e).__name__}: {str(e)[:160]}; retrying")
            time.sleep(2)


# ----------------------------------------------------------------------------------------------- set-up
def make_home(pg: dict, max_runs: int) -> Path:
    """A fresh PostgreSQL database and DAGSTER_HOME (run queue of ``max_runs``, run monitoring on, the
    password an env reference) with a workspace.yaml loading bench/faults_pipeline.py."""
    return k8s_backfill.make_home(pg, max_runs, name="faults", pipeline=PIPELINE, extra_yaml=RUN_MONITORING)


#: run monitoring on; the code server may take 10 min to start (on a 2-core host loaded by other work its
#: imports took over Dagster's default 180 s; the backfill daemon then could not load the asset and failed
#: the backfill, cancelling its runs)
RUN_MONITORING = """run_monitoring:
  enabled: true
  start_timeout_seconds: 300
  poll_interval_seconds: 10
code_servers:
  local_startup_timeout: 600
"""


class Daemons:
    """dagster-daemon, restarted from the main thread (a daemon started by a short-lived thread would get
    its PR_SET_PDEATHSIG when that thread ends). ``kill_and_wait`` is called by the injector; ``tick`` by the
    main loop, which also restarts a daemon that exited on its own (recorded in ``unexpected_exits``)."""

    def __init__(self, workspace: Path, env: dict, log_dir: Path):
        self.workspace, self.env, self.log_dir = workspace, env, log_dir
        self.generation = 0
        self.current: DaemonProcess | None = None
        self.orphans: list[psutil.Process] = []
        self.unexpected_exits: list[dict] = []
        self._want_restart = threading.Event()
        self._restarted = threading.Event()

    def start(self) -> None:
        self.generation += 1
        d = DaemonProcess(self.workspace, env=self.env, log_file=self.log_dir / f"daemon-{self.generation}.log")
        d.__enter__()
        self.current = d
        say(f"dagster-daemon #{self.generation} started (pid {d.proc.pid})")

    def kill_and_wait(self) -> int:
        """SIGKILL the daemon (its code server and run workers are left alone, as a crash leaves them) and
        block until the main loop started a new one; returns the new pid."""
        assert self.current and self.current.proc
        try:
            self.orphans += psutil.Process(self.current.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        self._restarted.clear()
        self._want_restart.set()
        os.kill(self.current.proc.pid, signal.SIGKILL)
        if not self._restarted.wait(300):
            raise RuntimeError("the main loop did not restart dagster-daemon within 300 s")
        return self.current.proc.pid

    def tick(self) -> None:
        d = self.current
        if d is None or d.proc is None:
            return
        if self._want_restart.is_set():
            d.proc.wait()
            time.sleep(2)
            self.start()
            self._want_restart.clear()
            self._restarted.set()
            return
        code = d.proc.poll()
        if code is not None:
            self.unexpected_exits.append({"generation": self.generation, "exit_code": code, "at": time.time()})
            say(f"dagster-daemon #{self.generation} exited on its own (code {code}); starting another")
            self.start()

    def close(self) -> None:
        if self.current:
            self.current.__exit__(None, None, None)
        for p in self.orphans:
            try:
                if p.is_running():
                    p.terminate()
            except psutil.NoSuchProcess:
                pass
        _gone, alive = psutil.wait_procs([p for p in self.orphans if p.is_running()], timeout=10)
        for p in alive:
            p.kill()


# ----------------------------------------------------------------------------------------------- facts
def failure_reason(instance: dg.DagsterInstance, run_id: str, key: str) -> str | None:
    """Why run ``run_id`` failed partition ``key``: the line of its step failure naming the key, else the
    step failure's first line, else the run failure's message; None when the run recorded no reason."""
    recs = instance.get_records_for_run(run_id, of_type={dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE}).records
    step, run = None, None
    for r in recs:
        ev = r.event_log_entry.dagster_event
        if ev is None:
            continue
        if ev.event_type == dg.DagsterEventType.STEP_FAILURE:
            data = ev.step_failure_data
            msg = (data.user_failure_data.description if data.user_failure_data and data.user_failure_data.description
                   else (data.error.message if data.error else ""))
            step = msg or step
        elif ev.message:
            run = ev.message
    if step:
        lines = step.strip().splitlines()
        return next((ln[len(key) + 2:] for ln in lines if ln.startswith(f"{key}: ")), lines[0] if lines else step)
    return run


def backfill_end_states(instance, bid: str, pdef: str) -> dict[str, tuple[str, str | None, str]]:
    """partition key -> (state, failure reason or None, run id) of the backfill run that covered it last."""
    out = {}
    for key, (st, run) in BackfillRuns(instance, bid, pdef).partition_states().items():
        out[key] = (st, failure_reason(instance, run.run_id, key) if st == "failed" else None, run.run_id)
    return out


def step_attempts(instance, run_id: str) -> tuple[list[float], list[str]]:
    """Run ``run_id``'s step attempts: seconds from each step-worker launch to the step's failure or retry
    request, and the error message of each failed attempt (oldest first)."""
    kinds = {dg.DagsterEventType.STEP_WORKER_STARTING, dg.DagsterEventType.STEP_FAILURE,
             dg.DagsterEventType.STEP_UP_FOR_RETRY}
    recs = [r for r in instance.get_records_for_run(run_id, of_type=kinds).records if r.event_log_entry.dagster_event]
    errors = []
    for r in sorted(recs, key=lambda r: r.storage_id):
        ev = r.event_log_entry.dagster_event
        data = ev.step_failure_data if ev.event_type == dg.DagsterEventType.STEP_FAILURE else (
            ev.event_specific_data if ev.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY else None)
        if data is not None:
            errors.append(data.error.message if getattr(data, "error", None) else (ev.message or ""))
    secs = attempt_seconds([(r.event_log_entry.dagster_event.event_type_value, r.event_log_entry.timestamp) for r in recs])
    return secs, errors


def launched_backends(instance, run_id: str) -> list[str]:
    """The backend of each step-worker launch of run ``run_id``, in order."""
    recs = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_WORKER_STARTING).records
    out = []
    for r in recs:
        ev = r.event_log_entry.dagster_event
        md = ev.engine_event_data.metadata if ev and ev.engine_event_data else {}
        if "dagster_gpu/backend" in md:
            out.append(md["dagster_gpu/backend"].value)
    return out


def runs_in_flight(instance, runs_filter: dg.RunsFilter) -> list[dg.DagsterRun]:
    return [r.dagster_run for r in instance.get_run_records(runs_filter) if r.dagster_run.status not in _FINISHED]


def materializations(instance, asset_key) -> list[tuple[str, str, float]]:
    """(partition, run id, timestamp) of every materialization event of the asset."""
    recs = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=asset_key), limit=10000).records
    return [(r.asset_materialization.partition, r.run_id, r.timestamp) for r in recs]


def units_launched(instance) -> dict[str, dict]:
    """Every work unit any run of this instance launched: unit id (``<array job id>_<array task id>`` of
    the Slurm array task, or the pod name) -> backend, run id, step key."""
    out = {}
    for rec in instance.get_run_records():
        run_id = rec.dagster_run.run_id
        for r in instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_WORKER_STARTING).records:
            ev = r.event_log_entry.dagster_event
            md = ev.engine_event_data.metadata if ev and ev.engine_event_data else {}
            if "dagster_gpu/handle" not in md:
                continue
            handle, backend = md["dagster_gpu/handle"].value, md["dagster_gpu/backend"].value
            uid = f"{handle['array_job_id']}_{handle['array_task_id']}" if backend == "slurm" else str(handle.get("pod"))
            out[uid] = {"backend": backend, "run_id": run_id, "step_key": ev.step_key}
    return out


def billed_units(instance, asset_key) -> dict[str, str]:
    """unit id (``<array job id>_<array task id>``, or the pod name) -> bill/source of the scheduler-bill
    observations (sacct, pod-interval)."""
    out = {}
    recs = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=asset_key), limit=10000).records
    for r in recs:
        md = {k: v.value for k, v in r.asset_observation.metadata.items()}
        src = bill_value(md, SOURCE)
        if src == "sacct":
            uid = f"{md.get('slurm/array_job_id')}_{md.get('slurm/array_task_id')}"
        else:
            uid = md.get("k8s/pod") if src == "pod-interval" else None
        if uid is not None:
            out[str(uid)] = src
    return out


def spool_array_ids(spool: Path) -> list[int]:
    ids = []
    for d in sorted((spool / "batches").glob("*")):
        f = d / "submitted.json"
        if f.exists():
            ids.append(int(json.loads(f.read_text())["array_job_id"]))
    return ids


def leaks(instance, spool: Path, slurm, extra_job_ids: list[int]) -> dict[str, list[str]]:
    """What this benchmark left behind: Slurm jobs not final (its job arrays and preemptor jobs), pods,
    ResourceClaims and ResourceClaimTemplates labelled with one of its runs, spool files (pending launches,
    unread results, job arrays never marked done) and step-worker processes of its runs."""
    from dagster_gpu.instance.step_args import step_args_from_env
    from dagster_gpu.k8s import manifests as m
    from tests.k8s_helpers import executor_api, labelled

    ids = spool_array_ids(spool) + list(extra_job_ids)
    jobs = [r.id.raw for r in slurm.squeue(ids) if not r.state.final] if ids else []
    run_ids = {r.dagster_run.run_id for r in instance.get_run_records()}
    api = executor_api()
    k8s: dict[str, list[str]] = {"pods": [], "claims": [], "templates": []}
    for run_id in sorted(run_ids):
        for kind, names in labelled(api, m.run_selector(run_id)).items():
            k8s[kind] += names
    active = [d.name for d in sorted((spool / "batches").glob("*")) if (d / "submitted.json").exists() and not (d / "done").exists()]
    procs = []
    for p in psutil.process_iter(["cmdline"]):
        if "execute_step" in (p.info.get("cmdline") or []):
            try:
                a = step_args_from_env(p.environ())
            except (psutil.AccessDenied, psutil.NoSuchProcess):
                continue
            if a is not None and a.run_id in run_ids:
                procs.append(str(p.pid))
    return {"slurm_jobs": jobs, **k8s,
            "spool_pending": sorted(p.name for p in (spool / "pending").glob("*.json")),
            "spool_results": sorted(p.name for p in (spool / "results").glob("*.json")),
            "spool_batches_not_done": active, "worker_processes": procs}


def pods_of_run(run_id: str) -> list[str]:
    """Pods, ResourceClaims and ResourceClaimTemplates still labelled with run ``run_id``."""
    from dagster_gpu.k8s import manifests as m
    from tests.k8s_helpers import executor_api, labelled

    with executor_api() as api:
        return [n for names in labelled(api, m.run_selector(run_id)).values() for n in names]


def preempted_tasks(slurm, array_ids: list[int]) -> list[str]:
    """Our array tasks sacct shows PREEMPTED (requeued by slurmctld when GraceTime ended) or REQUEUED (the worker
    stopped on its warning signal and requeued itself, dagster_gpu.slurm.self_requeue) at least once."""
    rows = slurm.sacct(array_ids) if array_ids else []
    return sorted({r.id.raw for r in rows if r.state.name in ("PREEMPTED", "REQUEUED")})


def schedule_cli(action: str, workspace: Path, env: dict, log: Path) -> None:
    with open(log, "ab") as out:
        subprocess.run([sys.executable, "-m", "dagster", "schedule", action, SCHEDULE, "-w", str(workspace)],
                       env=env, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=600)


# ----------------------------------------------------------------------------------------------- main
def main() -> None:  # noqa: C901 - one benchmark, phase by phase
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=200)
    ap.add_argument("--per-run", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--records", type=int, default=20, help="fortune records per corpus file")
    ap.add_argument("--max-runs", type=int, default=6, help="run queue limit (max_concurrent_runs)")
    ap.add_argument("--window-s", type=float, default=None,
                    help="faults fire within this many seconds of submission (default: 1.2 s per partition + 60)")
    ap.add_argument("--no-inject", action="store_true", help="no faults (a baseline)")
    ap.add_argument("--retries", type=int, default=2, help="the asset's RetryPolicy max_retries")
    ap.add_argument("--only", default="", help="comma-separated subset of the faults (debugging; default: all)")
    ap.add_argument("--deadline-s", type=float, default=45.0,
                    help="the steps' dagster-gpu/deadline-seconds: tight, so a step goes to Slurm while it has a free "
                         "GPU and otherwise to the earliest finish (a Kubernetes pod)")
    ap.add_argument("--slurm-time-limit", default="00:20:00", help="sbatch --time of the array tasks")
    ap.add_argument("--slurm-throttle", type=int, default=0,
                    help="the slurm backend's array throttle, which the policy also respects (0: GPUs in the slurm partition)")
    ap.add_argument("--create-timeout-s", type=float, default=60.0,
                    help="the Kubernetes section's create_timeout_seconds (a bound pod whose container has not "
                         "started: ErrImagePull / ImagePullBackOff fail the step after this)")
    ap.add_argument("--timeout-s", type=float, default=5400.0, help="longest wait for the backfill")
    ap.add_argument("--recovery-timeout-s", type=float, default=1500.0, help="longest wait for the recovery")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "faults.json")
    a = ap.parse_args()

    from dagster_gpu.slurm.client import SlurmClient
    from tests import slurm_helpers as SH
    from tests.conftest import pg_settings
    from tests.k8s_helpers import cluster_skip_reason

    reason = SH.cluster_unavailable_reason() or SH.postgres_unavailable_reason() or cluster_skip_reason()
    if reason:
        sys.exit(f"cannot run: {reason}")
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="dagster-faults-work-"))
    make_corpus(workdir / "corpus", a.partitions, a.records)
    keys = sorted(p.name for p in (workdir / "corpus").iterdir())
    pg = pg_settings()
    k8s_backfill.ensure_pg_secret(pg)
    home = make_home(pg, a.max_runs)
    spool = home / "slurm-spool"
    env = {**{k: v for k, v in pg.items() if k != "DAGSTER_PG_PASSWORD_FILE"},
           "DAGSTER_HOME": str(home), "SLURM_CONF": SH.slurm_conf(), "DAGSTER_GPU_SLURM_SPOOL": str(spool),
           "DAGSTER_GPU_K8S_KUBECONFIG": str(K8S_DIR / "executor.kubeconfig"),
           "DAGSTER_GPU_K8S_LOG": str(home / "k8s-backend.log"),
           "FAULTS_CORPUS": str(workdir / "corpus"), "FAULTS_OUTPUT": str(workdir / "out"),
           "FAULTS_PER_RUN": str(a.per_run), "FAULTS_RETRIES": str(a.retries), "FAULTS_DEADLINE_S": f"{a.deadline_s:g}",
           "FAULTS_SLURM_TIME_LIMIT": a.slurm_time_limit, "FAULTS_STATE": str(home / "fault-state.json"),
           "K8S_TEST_CREATE_TIMEOUT": f"{a.create_timeout_s:g}",
           "SLURM_TEST_WINDOW": "2", "SLURM_TEST_MAX_WINDOW": "10", "SLURM_TEST_TARGET": "0", "SLURM_TEST_POLL": "2",
           "SLURM_TEST_RECONCILE_WAIT": "60", "K8S_TEST_PENDING_TIMEOUT": "3600",
           # the array tasks run in the preemptible QOS (GraceTime 20 s, resources/lib/slurm_cluster.sh) and ask for a
           # warning signal: slurm_preempt's high-QOS job preempts them as online work would
           "SLURM_TEST_QOS": "preemptible", "SLURM_TEST_SIGNAL_LEAD": "15",
           "DAGSTER_GRPC_TIMEOUT_SECONDS": "300", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    if a.slurm_throttle:
        env["SLURM_TEST_THROTTLE"] = str(a.slurm_throttle)
    os.environ.update(env)
    env = dict(os.environ)
    import faults_pipeline as fp

    asset, pdef = fp.fault_embeddings, fp.fault_embeddings.partitions_def.name
    slurm = SlurmClient(slurm_conf=SH.slurm_conf())
    window = a.window_s or 1.2 * a.partitions + 60
    runs_expected = -(-a.partitions // a.per_run)
    only = tuple(x.strip() for x in a.only.split(",") if x.strip()) or FAULTS
    plan = [] if a.no_inject else plan_faults(a.seed, window, kills_for(runs_expected), faults=only)
    say(f"home {home}, workdir {workdir}; {a.partitions} partitions in runs of {a.per_run}; "
        f"plan: {[(f.label, f.at_s) for f in plan]}")

    instance = dg.DagsterInstance.get()
    instance.add_dynamic_partitions(pdef, keys)
    daemons = Daemons(home / "workspace.yaml", env, home)
    daemons.start()
    active = threading.Event()
    t0 = time.time()
    bid = submit_asset_backfill(instance, fp.defs, asset.key, keys, title=f"faults-seed{a.seed}")
    active.set()
    ctx = InjectContext(t0=t0, log_dir=home, slurm=slurm, our_array_job_ids=lambda: spool_array_ids(spool),
                        our_run_ids=lambda: {r.dagster_run.run_id for r in instance.get_run_records()},
                        restart_daemon=daemons.kill_and_wait, active=active, say=say, seed=a.seed,
                        queued_run_ids=lambda: [r.dagster_run.run_id for r in instance.get_run_records(
                            dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED], tags={"dagster/backfill": bid}))],
                        add_run_tags=instance.add_run_tags,
                        run_status=lambda run_id: instance.get_run_by_id(run_id).status.value,
                        pods_of_run=pods_of_run, state_file=Path(env["FAULTS_STATE"]))
    injector = Injector(ctx, plan)
    injector.start()

    # ------------------------------------------------------------------ the backfill, under faults
    runs = BackfillRuns(instance, bid, pdef)
    last_line, i = "", 0
    status = "REQUESTED"
    try:
        while True:
            daemons.tick()
            i += 1
            if i % 3 == 0:
                try:
                    p = backfill_progress(instance, bid, len(keys), runs)
                    inflight = runs_in_flight(instance, dg.RunsFilter.for_backfill(bid))
                except Exception as e:  # noqa: BLE001 - PostgreSQL restarting
                    say(f"progress: {type(e).__name__}: {str(e)[:120]}")
                    p = None
                if p is not None:
                    status = p.status
                    line = f"backfill {p.status}: {p.succeeded} ok, {p.failed} failed, {p.running} running, {p.runs} runs"
                    if line != last_line:
                        say(f"{line} ({time.time() - t0:.0f} s)")
                        last_line = line
                    if BulkActionStatus(p.status) in _DONE and p.running == 0 and not inflight:
                        break
            if time.time() - t0 > a.timeout_s:
                raise TimeoutError(f"backfill {bid} not done after {a.timeout_s:.0f} s: {last_line}")
            time.sleep(1)
    finally:
        backfill_end = time.time()
        active.clear()
        injector.abort()
    makespan = backfill_end - t0
    say(f"backfill ended ({status}) after {makespan:.0f} s; waiting for the injector to undo outages")
    while any(t.is_alive() for t in injector._threads):
        daemons.tick()
        time.sleep(1)
    end_states = retrying(lambda: backfill_end_states(instance, bid, pdef), "backfill states")

    # ------------------------------------------------------------------ recovery by the schedule
    from dagster_gpu.partitions.status import partitions_to_rerun

    todo = retrying(lambda: partitions_to_rerun(instance, asset), "partitions_to_rerun")
    say(f"after the backfill: {len(todo)} partition(s) to rerun: {todo[:10]}")
    recovery_s, ticks = (0.0 if not todo else None), 0
    if todo:
        schedule_cli("start", home / "workspace.yaml", env, home / "schedule.log")
        sched = dg.RunsFilter(tags={"dagster/schedule_name": SCHEDULE})
        while time.time() - backfill_end < a.recovery_timeout_s:
            daemons.tick()
            time.sleep(5)
            try:
                todo = partitions_to_rerun(instance, asset)
                inflight = runs_in_flight(instance, sched)
                ticks = len(instance.get_run_records(sched))
            except Exception as e:  # noqa: BLE001
                say(f"recovery poll: {type(e).__name__}: {str(e)[:120]}")
                continue
            if not todo and not inflight:
                recovery_s = time.time() - backfill_end
                break
        schedule_cli("stop", home / "workspace.yaml", env, home / "schedule.log")
        say(f"recovery: {len(todo)} left after {time.time() - backfill_end:.0f} s, {ticks} schedule run(s)")

    # ------------------------------------------------------------------ bills, then the daemon stops
    bill_deadline = time.time() + 300
    while True:
        daemons.tick()
        units = retrying(lambda: units_launched(instance), "units")
        billed = retrying(lambda: billed_units(instance, asset.key), "bills")
        unbilled = sorted(set(units) - set(billed))
        if not unbilled or time.time() > bill_deadline:
            break
        time.sleep(5)
    daemons.close()
    say(f"daemon stopped; {len(units)} unit(s), {len(unbilled)} without a scheduler bill")

    # ------------------------------------------------------------------ leaks (after a grace period)
    preemptors = [r["preemptor_job_id"] for r in injector.records if r.get("preemptor_job_id")]
    leak_deadline = time.time() + 120
    while True:
        left = leaks(instance, spool, slurm, preemptors)
        if not any(left.values()) or time.time() > leak_deadline:
            break
        time.sleep(5)
    leaked = sum(len(v) for v in left.values())
    units = units_launched(instance)
    billed = billed_units(instance, asset.key)
    unbilled = sorted(set(units) - set(billed))

    # ------------------------------------------------------------------ count
    mats = materializations(instance, asset.key)
    outcome = tally(keys, [(k, r) for k, r, _ in mats], {k: (st, why) for k, (st, why, _run) in end_states.items()})
    run_faults = []
    for r in injector.records:
        name = r["fault"]
        if name in PREEMPT_FAULTS:
            pods = [u for u, v in units.items() if v["run_id"] == r.get("run_id") and v["backend"] == "kubernetes"]
            res = preempt_fault_outcome(r.get("run_id"), end_states, [(k, run) for k, run, _ in mats], pods, billed,
                                        r.get("disruption"), fault=name)
            res.update(pods=pods, victim_pod=r.get("victim_pod"), run_status=r.get("run_status"),
                       online_wait_s=r.get("online_wait_s"))
            run_faults.append(res)
            continue
        if name not in RUN_FAULTS:
            continue
        secs, errors = step_attempts(instance, r["run_id"]) if r.get("run_id") else ([], [])
        res = run_fault_outcome(name, r.get("run_id"), end_states, [(k, run) for k, run, _ in mats], errors,
                                must=(MISSING_IMAGE,) if name == "image_pull_fail" else ())
        if r.get("run_id"):
            res["attempt_s"], res["attempt_errors"] = secs, [e[:600] for e in errors]
            res["backends"] = launched_backends(instance, r["run_id"])
            res["pods_gone_s"] = r.get("pods_gone_s")
        run_faults.append(res)
    # a pod that never started a container (the image pull and DRA prepare faults' attempts) is billed as
    # nothing, which writes no observation (dagster_gpu.k8s.backend: UnitBill.nothing): those runs' units are left out
    faulted_runs = {r.get("run_id") for r in injector.records if r["fault"] in RUN_FAULTS}
    unbilled_not_run_faults = [u for u in unbilled if units[u]["run_id"] not in faulted_runs]
    stamps = sorted(t for _, _, t in mats)
    records = sorted(injector.records, key=lambda r: (r["at_s"] is None, r["at_s"] or r["planned_at_s"]))
    for r in records:
        r["next_materialization_s"] = first_after(stamps, r.get("back_at"))
    injected = sum(1 for r in records if r["injected"])
    all_runs = [r.dagster_run for r in instance.get_run_records()]
    by_status: dict[str, int] = {}
    for r in all_runs:
        by_status[r.status.value] = by_status.get(r.status.value, 0) + 1
    retries = sum(len(instance.get_records_for_run(r.run_id, of_type=dg.DagsterEventType.STEP_UP_FOR_RETRY).records)
                  for r in all_runs)
    backend_units: dict[str, int] = {}
    for u in units.values():
        backend_units[u["backend"]] = backend_units.get(u["backend"], 0) + 1
    final_bf = instance.get_backfill(bid)
    result = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date": dt.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
        "cpus": os.cpu_count(), "load_avg_at_end": os.getloadavg(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
        "home": str(home), "window_s": window,
        "backfill": {"id": bid, "status": final_bf.status.value if final_bf else None, "makespan_s": round(makespan, 1),
                     "runs": len(BackfillRuns(instance, bid, pdef).runs())},
        "runs_by_status": by_status, "step_retries": retries, "units_by_backend": backend_units,
        "daemon_generations": daemons.generation, "daemon_unexpected_exits": daemons.unexpected_exits,
        "faults": records, "faults_injected": injected,
        "preempted_tasks": preempted_tasks(slurm, spool_array_ids(spool)),
        "outcome": {**vars(outcome), "partitions_lost": outcome.partitions_lost},
        "recovery_s": None if recovery_s is None else round(recovery_s, 1), "recovery_runs": ticks,
        "run_faults": run_faults,
        "leaks": left, "leaked_objects": leaked,
        "units": len(units), "units_without_bill": {u: units[u] for u in unbilled},
        "summary": summary_keys(injected, outcome, leaked, run_faults, len(unbilled_not_run_faults)),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(fault_table(records))
    print()
    print("| faults injected | partitions | materialized once | failed with reason → recovered | lost | duplicated | "
          "leaked objects | units without bill | backfill makespan (s) | time to recover (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {injected} | {a.partitions} | {outcome.materialized_once} | {len(outcome.failed_with_reason)} → "
          f"{len(outcome.recovered)} | {outcome.partitions_lost} | {len(outcome.duplicated)} | {leaked} | {len(unbilled)} | "
          f"{makespan:.0f} | {'–' if recovery_s is None else f'{recovery_s:.0f}'} |")
    for rf in run_faults:
        if rf["fault"] in PREEMPT_FAULTS:
            wait = f", the online workload admitted after {rf['online_wait_s']} s" if rf.get("online_wait_s") is not None else ""
            print(f"{rf['fault']}: run {str(rf['run_id'])[:8]} ({rf.get('run_status')}), {rf['partitions']} partitions; "
                  f"victim {rf.get('victim_pod')} ({rf['disruption']}{wait}); {rf['launches']} launches "
                  f"{rf.get('pods')}, {rf['unbilled_launches']} without a bill; {rf['by_run']} materialized once by "
                  f"the run, {rf['failed']} failed; ok={rf['ok']}")
            continue
        print(f"{rf['fault']}: run {str(rf['run_id'])[:8]} on {rf.get('backends')}, {rf['partitions']} partitions; "
              f"{rf['named_attempts']} of {rf['attempts']} failed attempts named the cause (after {rf.get('attempt_s')} s); "
              f"{rf['failed_with_named_reason']} left failed naming it; {rf['materialized_once']} materialized once "
              f"({rf['by_retry']} by a retry, {rf['by_rerun']} by the rerun); pods gone {rf.get('pods_gone_s')} s after; "
              f"ok={rf['ok']}; reason: {(rf['reason'] or '')[:400]}")
    print(json.dumps(result["summary"]))
    say(f"wrote {a.out}")
    if not a.no_inject and only == FAULTS:
        merge_summary({**result["summary"], "faults.partitions": a.partitions})
        say("merged the faults.* keys into bench/results/summary.json")


if __name__ == "__main__":
    main()
