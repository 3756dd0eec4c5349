"""End-to-end tests of gpu_executor's slurm backend on the local Slurm clusters (fixture ``slurm_cluster``:
22.05 and 24.11). The paths every backfill takes (eight runs coalesced into one sbatch, polling, sacct bills;
the controller's start estimate) run on both versions; each other behaviour runs on one of them, the two
versions taking turns (:data:`ON_2205`, :data:`ON_2411`), for CI time: what differs between the versions is
the text of their outputs, which the recorded outputs of both (tests/data/slurm, tests/data/slurm/v24.11)
cover in tests/test_slurm_parse.py and tests/test_slurm_versions.py.

Needs ``resources/slurm/cluster.sh start``, ``resources/slurm/trixie.sh start`` and
``resources/postgres/postgres.sh start``; each test skips with the reason when its cluster or PostgreSQL
is not running. Every run is a real Dagster run in its own run-worker
process (started together, or launched by dagster-daemon for a backfill) with a PostgreSQL instance;
its step runs as a Slurm array task on the cluster. The asset is trivial (sleeps ``test/sleep`` s).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests import slurm_helpers as H
from tests.resume_helpers import launch_handle, resume_and_check_reattached
from tests.waiting import wait_for as _wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.e2e, pytest.mark.postgres]
ON_2205, ON_2411 = H.on_slurm("22.05"), H.on_slurm("24.11")


@pytest.fixture(scope="module", autouse=True)
def _require_postgres():
    reason = H.postgres_unavailable_reason()  # each cluster: fixture slurm_cluster
    if reason:
        pytest.skip(reason)


@pytest.fixture
def home(slurm_cluster, monkeypatch):
    home, env = H.make_dagster_home()
    for k, v in env.items():
        if os.environ.get(k) != v:
            monkeypatch.setenv(k, v)
    return home, env


def _client():
    from dagster_gpu.slurm.client import SlurmClient

    return SlurmClient(slurm_conf=H.slurm_conf())


def _materializations(keys):
    import dagster as dg
    from dagster._core.event_api import AssetRecordsFilter

    out = {}
    with dg.DagsterInstance.get() as inst:
        for k in keys:
            recs = inst.fetch_materializations(
                AssetRecordsFilter(asset_key=dg.AssetKey("trivial"), asset_partitions=[k]), limit=10
            ).records
            out[k] = [{n: v.value for n, v in r.asset_materialization.metadata.items()} for r in recs]
    return out


def _observations(keys):
    import dagster as dg
    from dagster._core.event_api import AssetRecordsFilter

    with dg.DagsterInstance.get() as inst:
        return {
            k: [
                {n: v.value for n, v in r.asset_observation.metadata.items()}
                for r in inst.fetch_observations(AssetRecordsFilter(asset_key=dg.AssetKey("trivial"), asset_partitions=[k]), limit=10).records
            ]
            for k in keys
        }


def _all_observed(keys):
    o = _observations(keys)
    return o if all(o[k] for k in keys) else None


def _max_concurrency(acct_rows) -> int:
    events = []
    for r in acct_rows:
        if r.start and r.end:
            events += [(r.start.timestamp(), 1), (r.end.timestamp(), -1)]
    events.sort(key=lambda e: (e[0], e[1]))  # an end and a start in the same second do not overlap
    cur = peak = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


def _cluster_state(client, spool: Path) -> str:
    """What the controller says of the test's job arrays (every task, with sacct's start and end) and of the
    whole cluster (jobs not finished, GPUs in use): why a wait for running tasks did not end."""
    ids = [b["array_job_id"] for b in H.spool_batches(spool)]
    acct = [(r.id.raw, str(r.state), r.start, r.end) for r in client.sacct(ids)] if ids else []
    cluster = H.CLUSTERS[client.run(["sinfo", "-V"]).stdout.split()[-1].rsplit(".", 1)[0]]
    return f"test's tasks (sacct): {acct}\ncluster's jobs (squeue): {H.cluster_jobs(cluster)}; GPUs in use: {H.gpus_in_use(cluster)}"


# --------------------------------------------------------------------------------------------------
def test_eight_concurrent_runs_share_one_sbatch(home):
    home_dir, env = home
    keys = [f"p{i:03d}" for i in range(7)] + [H_WEIRD]
    pwned = Path("/tmp/pwned")
    pwned.unlink(missing_ok=True)
    procs = H.start_runs(env, keys)
    codes = H.wait_all(procs, 300)
    assert codes == [0] * 8, f"run workers exited {codes}; logs in {home_dir}\n{H.explain_failures(home_dir, keys, codes)}"
    batches = H.spool_batches(Path(env["DAGSTER_GPU_SLURM_SPOOL"]))
    print(f"8 runs -> {len(batches)} sbatch call(s): {[b['tasks'] for b in batches]}")
    assert 1 <= len(batches) <= 2 and sum(b["tasks"] for b in batches) == 8
    mats = _materializations(keys)
    for k in keys:
        assert len(mats[k]) == 1, f"{k!r} materialized {len(mats[k])} times"
        md = mats[k][0]
        assert md["test/partition_key"] == k
        assert md["slurm/array_job_id"] in {b["array_job_id"] for b in batches}
        assert isinstance(md["slurm/array_task_id"], int) and md["slurm/job_id"]
        assert md["test/cuda_visible_devices"] in {"0", "1", "2", "3"}
    assert not pwned.exists(), "a partition key reached a shell"
    # shared hosts (issue 13): nobody else can list the spool or read a step's manifest or log
    spool = Path(env["DAGSTER_GPU_SLURM_SPOOL"])
    files = [p for b in batches for p in (spool / "batches" / b["batch"]).iterdir() if p.name == "manifest.json" or p.suffix == ".out"]
    modes = {str(p.relative_to(spool)): oct(p.stat().st_mode & 0o7777) for p in files}
    assert len(files) == len(batches) + 8 and set(modes.values()) == {"0o600"}, modes
    dirs = [spool, spool / "batches", *(spool / "batches" / b["batch"] for b in batches)]
    assert {oct(d.stat().st_mode & 0o7777) for d in dirs} == {"0o700"}
    # sacct billing observations (reported by the run workers before they exit)
    obs = _wait_for(lambda: _all_observed(keys), 60, what="sacct observations")
    for k in keys:
        o = obs[k][0]
        assert o["bill/source"] == "sacct" and o["slurm/state"] == "COMPLETED"
        assert o["bill/gpu_seconds"] == o["slurm/elapsed_seconds"] * 1.0 and "gres/gpu=1" in o["slurm/alloc_tres"]


H_WEIRD = "p it's \"$(touch /tmp/pwned)\"; `x` & y"


# 22.05 only: the longest Slurm e2e test (the daemon creates the backfill's runs one by one, ~10 s apart here)
# checks the backfill hold and the array throttle, which the 24.11 runs of the other tests (eight runs in one
# sbatch, terminate mid-backfill) and the recorded 24.11 outputs (tests/data/slurm/v24.11) cover there. A
# throttle of 2 on a cluster of 4 GPUs: the GPUs alone would let 4 tasks of one array run at once.
@ON_2205
def test_backfill_8_partitions_throttle_2(home):
    import dagster as dg

    from dagster_gpu.commands.backfill import DaemonProcess, submit_asset_backfill, wait_for_backfill
    from tests.slurm_pipeline import defs

    home_dir, env = home
    # the daemon creates a backfill's runs one by one (8-25 s apart on a loaded 2-CPU host): the backfill hold
    # gathers 10 launches per array (coalesce_target_tasks) while launches come less than 60 s apart
    env = {**env, "SLURM_TEST_THROTTLE": "2", "SLURM_TEST_WINDOW": "2", "SLURM_TEST_MAX_WINDOW": "60"}
    # on 2 shared CPUs the daemon's code server times out (60 s) spawning many run workers at once: fewer
    # concurrent runs and a longer gRPC timeout keep Dagster's own run launching from failing runs
    env["DAGSTER_GRPC_TIMEOUT_SECONDS"] = "300"
    yaml = home_dir / "dagster.yaml"
    yaml.write_text(yaml.read_text().replace("max_concurrent_runs: 50", "max_concurrent_runs: 20"))
    keys = [f"p{i:03d}" for i in range(8)]
    with dg.DagsterInstance.get() as instance:
        with DaemonProcess(home_dir / "workspace.yaml", env=env, log_file=home_dir / "daemon.log") as d:
            bid = submit_asset_backfill(instance, defs, dg.AssetKey("trivial"), keys, title="slurm-8",
                                        tags={"test/sleep": "10"})
            prog = wait_for_backfill(instance, bid, len(keys), timeout_s=1200, poll_s=2, daemon=d)
    assert prog.succeeded == 8 and prog.failed == 0, prog
    batches = H.spool_batches(Path(env["DAGSTER_GPU_SLURM_SPOOL"]))
    ids = [b["array_job_id"] for b in batches]
    acct = _client().sacct(ids)
    arrays_in_sacct = sorted({r.array_job_id for r in acct})
    print(f"8-partition backfill: {len(arrays_in_sacct)} array jobs in sacct (tasks per sbatch: {[b['tasks'] for b in batches]})")
    assert sum(b["tasks"] for b in batches) == 8
    assert len(arrays_in_sacct) == len(batches) <= 2, "fewer than 4 partitions per sbatch on average"
    peaks = {a: _max_concurrency([r for r in acct if r.array_job_id == a]) for a in arrays_in_sacct}
    print(f"peak concurrent tasks per array: {peaks}")
    assert max(peaks.values()) == 2, "the throttle, not the 4 GPUs or the arrivals, held each array to 2"
    mats = _materializations(keys)
    assert all(len(mats[k]) == 1 and mats[k][0]["slurm/array_job_id"] in ids for k in keys)


@ON_2411
def test_terminate_mid_backfill(home):
    import dagster as dg
    from dagster._core.execution.backfill import BulkActionStatus
    from dagster._core.storage.dagster_run import DagsterRunStatus, RunsFilter

    from dagster_gpu.commands.backfill import DaemonProcess, submit_asset_backfill
    from tests.slurm_pipeline import defs

    home_dir, env = home
    env = {**env, "SLURM_TEST_THROTTLE": "2", "SLURM_TEST_WINDOW": "2", "SLURM_TEST_MAX_WINDOW": "10"}
    keys = [f"p{i:03d}" for i in range(8)]
    spool = Path(env["DAGSTER_GPU_SLURM_SPOOL"])
    client = _client()
    with dg.DagsterInstance.get() as instance:
        with DaemonProcess(home_dir / "workspace.yaml", env=env, log_file=home_dir / "daemon.log"):
            bid = submit_asset_backfill(instance, defs, dg.AssetKey("trivial"), keys, tags={"test/sleep": "120"})

            def running_tasks():
                ids = [b["array_job_id"] for b in H.spool_batches(spool)]
                rows = client.squeue(ids) if ids else []
                return [r for r in rows if r.state.name == "RUNNING"]

            _wait_for(lambda: len(running_tasks()) >= 2, 240, 2, "two running array tasks")
            # What the UI's "Terminate" of a backfill does (dagster-graphql cancel_partition_backfill): mark it
            # CANCELING; the backfill daemon then terminates its runs (dagster._core.execution.backfill.
            # cancel_backfill_runs_and_cancellation_complete) at its next iteration (every 30 s), and marks it
            # CANCELED one iteration after they ended (not waited for here). The test does not terminate the runs
            # itself as well: two terminates of one run race in Dagster (DefaultRunLauncher.terminate reads
            # is_finished, then reports CANCELING), and a run that became CANCELED in between goes back to
            # CANCELING and is marked FAILURE when its process exits (recorded here: CANCELED, CANCELING,
            # "unexpectedly exited with code 0", FAILURE).
            instance.update_backfill(instance.get_backfill(bid).with_status(BulkActionStatus.CANCELING))

            def all_ended():
                rs = instance.get_runs(RunsFilter(tags={"dagster/backfill": bid}))
                return rs if all(r.is_finished for r in rs) else None

            runs = _wait_for(all_ended, 400, 3, "every run of the backfill to end")
    ids = [b["array_job_id"] for b in H.spool_batches(spool)]
    assert ids, "nothing was submitted"
    live = [r for r in client.squeue(ids) if r.state.status.value in ("pending", "running", "requeued")]
    assert live == [], f"tasks still queued after terminate: {[(r.id.raw, str(r.state)) for r in live]}"
    statuses = {r.status for r in runs}
    print(f"run statuses after terminate: {sorted(s.value for s in statuses)}")
    assert DagsterRunStatus.CANCELED in statuses
    with dg.DagsterInstance.get() as instance:
        for r in runs:
            launched = any(
                e.dagster_event and e.dagster_event.event_type_value == "STEP_WORKER_STARTING" for e in instance.all_logs(r.run_id)
            )
            # a run whose step reached Slurm ends CANCELED; Dagster itself marks FAILURE a run terminated while
            # its run worker was still starting ("started a new run worker while ... CANCELING")
            if launched:
                assert r.status in (DagsterRunStatus.CANCELED, DagsterRunStatus.SUCCESS), (r.run_id, r.status, [
                    (e.dagster_event.event_type_value, e.dagster_event.message) for e in instance.all_logs(r.run_id) if e.dagster_event])
            else:
                assert r.status in (DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE), (r.run_id, r.status)
    cancelled = [r for r in client.sacct(ids) if r.state.name == "CANCELLED"]
    assert cancelled, "no array task was cancelled"


# 24.11 only, for CI time: a requeued task waits out Slurm's requeue delay (PENDING on BeginTime for
# cred_expire + 1 s: 31 s on the test clusters, resources/slurm/slurm.conf.in; about 2 min at Slurm's default, as
# tests/data/slurm/requeue recorded on 22.05); 22.05's requeue as sacct and squeue show it is covered by that
# recorded trace (tests/test_slurm_parse.py).
@ON_2411
def test_preempted_task_is_requeued_and_materializes_once(home):
    home_dir, env = home
    client = _client()
    keys = [f"p{i:03d}" for i in range(4)]
    # 4 tasks hold the 4 GPUs: 60 s each, so that all 4 run at once even when the run workers reach Slurm
    # tens of seconds apart (4 Python start-ups on a loaded 2-core CI host)
    procs = H.start_runs(env, keys, sleep_s=60)
    spool = Path(env["DAGSTER_GPU_SLURM_SPOOL"])

    def four_running():
        ids = [b["array_job_id"] for b in H.spool_batches(spool)]
        rows = [r for r in client.squeue(ids) if r.state.name == "RUNNING"] if ids else []
        return rows if len(rows) == 4 else None

    _wait_for(four_running, 240, 1, "four running array tasks", why=lambda: _cluster_state(client, spool))
    cp = subprocess.run(
        ["sbatch", "--parsable", "--account=research", "--qos=high", "--gres=gpu:1", "--output=/dev/null", "--wrap=sleep 3"],
        capture_output=True, text=True, env=client.env(), check=True,
    )  # fmt: skip
    hi = int(cp.stdout.strip())
    codes = H.wait_all(procs, 600)
    assert codes == [0] * 4, f"run workers exited {codes}; logs in {home_dir}\n{H.explain_failures(home_dir, keys, codes)}"
    ids = [b["array_job_id"] for b in H.spool_batches(spool)]
    acct = client.sacct(ids)
    preempted = [r for r in acct if r.state.name == "PREEMPTED"]
    print(f"high-QOS job {hi} preempted {[r.id.raw for r in preempted]}")
    assert len(preempted) >= 1
    mats = _materializations(keys)
    assert all(len(mats[k]) == 1 for k in keys), {k: len(v) for k, v in mats.items()}
    victim = preempted[0].id
    obs = _wait_for(lambda: _all_observed(keys), 90, 2, "sacct observations")
    vk = next(k for k in keys if mats[k][0]["slurm/array_task_id"] == victim.task_id and mats[k][0]["slurm/array_job_id"] == victim.job_id)
    o = obs[vk][0]
    assert o["slurm/attempts"] == 2 and o["slurm/attempt_states"].startswith("PREEMPTED"), (
        obs[vk], mats[vk], [(r.id.raw, str(r.state), r.submit, r.start, r.end) for r in client.sacct(ids)])
    # both attempts billed: the preempted one's seconds and the completed one's (60 s of sleep), 1 GPU each,
    # as sacct --duplicates lists them
    attempts = [r for r in client.sacct(ids) if (r.id.job_id, r.id.task_id) == (victim.job_id, victim.task_id) and r.start and r.end]
    elapsed = sum((r.end - r.start).total_seconds() for r in attempts)
    assert len(attempts) == 2 and elapsed >= 60, [(r.id.raw, str(r.state), r.start, r.end) for r in attempts]
    assert abs(o["bill/gpu_seconds"] - elapsed) <= 1, (o, elapsed)


@ON_2205
def test_external_scancel_fails_exactly_that_step(home):
    home_dir, env = home
    client = _client()
    keys = [f"p{i:03d}" for i in range(3)]
    procs = H.start_runs(env, keys, sleep_s=45)  # long enough for all 3 to run at once on a loaded host
    spool = Path(env["DAGSTER_GPU_SLURM_SPOOL"])

    def running():
        ids = [b["array_job_id"] for b in H.spool_batches(spool)]
        rows = [r for r in client.squeue(ids) if r.state.name == "RUNNING"] if ids else []
        return rows if len(rows) == 3 else None

    rows = _wait_for(running, 240, 1, "three running array tasks", why=lambda: _cluster_state(client, spool))
    victim = rows[0]
    client.scancel([f"{victim.array_job_id}_{victim.array_task_id}"])
    codes = H.wait_all(procs, 300)
    assert sorted(codes) == [0, 0, 1], codes
    import dagster as dg
    from dagster._core.storage.dagster_run import DagsterRunStatus

    with dg.DagsterInstance.get() as inst:
        runs = inst.get_runs()
        failed = [r for r in runs if r.status == DagsterRunStatus.FAILURE]
        assert len(failed) == 1
        msgs = [
            e.dagster_event.event_specific_data.error.message
            for e in inst.all_logs(failed[0].run_id)
            if e.dagster_event and e.dagster_event.event_type_value == "STEP_FAILURE"
        ]
    print(f"failure message: {msgs}")
    assert any("CANCELLED" in m and f"{victim.array_job_id}_{victim.array_task_id}" in m for m in msgs)
    mats = _materializations(keys)
    assert sum(len(v) for v in mats.values()) == 2


@pytest.fixture
def small_max_array_size(slurm_cluster):
    env = {**os.environ, "DAGSTER_GPU_SLURM_MAX_ARRAY_SIZE": "101"}
    subprocess.run(["bash", str(slurm_cluster.script), "restart"], env=env, check=True, timeout=180)
    try:
        yield 101
    finally:
        env["DAGSTER_GPU_SLURM_MAX_ARRAY_SIZE"] = "1001"
        subprocess.run(["bash", str(slurm_cluster.script), "restart"], env=env, check=True, timeout=180)


def test_policy_state_reads_the_controller_start_estimate_when_gpus_are_busy(slurm_cluster, tmp_path):
    """Four 3-minute jobs hold the 4 GPUs: the cost policy's Slurm state shows no free GPU and the
    controller's own estimate (sbatch --test-only) of when one more task would start."""
    from dagster_gpu.slurm.backend import SlurmBackend, SlurmSettings

    client = _client()
    backend = SlurmBackend(SlurmSettings(slurm_conf=H.slurm_conf(), account="research", spool_dir=str(tmp_path / "spool")))
    idle = backend.policy_state().pools[0]
    assert (idle.total, idle.free, idle.start_estimate_s) == (4, 4, None)  # free GPUs: no estimate asked
    hold = tmp_path / "hold.sh"
    hold.write_text("#!/bin/sh\nsleep 300\n")
    ids = [client.submit(hold, ["--account=research", "--gres=gpu:1", "--time=3", "--output=/dev/null"]) for _ in range(4)]
    try:
        _wait_for(lambda: sum(r.state.name == "RUNNING" for r in client.squeue(ids)) == 4, 120, 1, "4 running jobs")
        t0 = time.time()
        pool = backend.policy_state().pools[0]
        print(f"busy cluster: free {pool.free}/{pool.total}, pending {pool.pending}, start estimate {pool.start_estimate_s} s")
        assert pool.free == 0 and pool.total == 4
        # the running jobs end at their 3-minute limit: the estimate is that limit minus their age
        assert pool.start_estimate_s is not None and 60 <= pool.start_estimate_s <= 180 + (time.time() - t0)
    finally:
        client.scancel([str(i) for i in ids])


@ON_2205
def test_150_launches_chunked_by_max_array_size(home, small_max_array_size):
    """150 launches from 150 threads into the coalescer on a cluster with MaxArraySize=101: valid arrays
    (at most 101 tasks, indices 0..100), and every task runs (the tasks run a trivial command)."""
    from dagster_gpu.slurm.client import SlurmClient
    from dagster_gpu.slurm.coalescer import ArrayCoalescer, TaskRequest
    from dagster_gpu.slurm.window import WindowRule
    from dagster_gpu.slurm.spool import Spool
    import concurrent.futures as cf
    import sys

    home_dir, env = home
    client = SlurmClient(slurm_conf=H.slurm_conf())
    assert client.max_array_size() == small_max_array_size
    spool = Spool(env["DAGSTER_GPU_SLURM_SPOOL"])
    out = home_dir / "touched"
    out.mkdir()

    def launch(i: int):
        co = ArrayCoalescer(spool, client, python=os.environ.get(H.WORKER_PYTHON_ENV, sys.executable),
                            rule=WindowRule(window_s=2.0, max_window_s=30.0))
        req = TaskRequest(
            options=("--account=research", "--gres=shard:1"),
            throttle=8,
            argv=("/usr/bin/touch", str(out / f"t{i:03d} 'q'")),
            env={},
            run_id=f"run-{i}",
            step_key="trivial",
            partition_keys=(f"p{i:03d}",),
        )
        return co.submit(req)

    with cf.ThreadPoolExecutor(max_workers=150) as ex:  # 150 launches in flight at once
        assigned = list(ex.map(launch, range(150)))
    batches = H.spool_batches(Path(env["DAGSTER_GPU_SLURM_SPOOL"]))
    sizes = sorted(b["tasks"] for b in batches)
    print(f"150 launches -> arrays of {sizes}")
    assert sum(sizes) == 150 and max(sizes) <= small_max_array_size and len(batches) >= 2
    assert all(a.array_task_id < small_max_array_size for a in assigned)
    ids = [b["array_job_id"] for b in batches]
    _wait_for(lambda: client.wait_gone(ids, 5), 400, 1, "all 150 tasks to finish")
    assert len(list(out.iterdir())) == 150

    def all_completed():  # slurmdbd receives job records asynchronously: allow it a moment
        rows = client.sacct(ids)
        return rows if sum(r.state.name == "COMPLETED" for r in rows) == 150 else None

    try:
        _wait_for(all_completed, 90, 2, "150 COMPLETED records in sacct")
    except AssertionError:
        from collections import Counter

        raise AssertionError(f"sacct states: {Counter(str(r.state) for r in client.sacct(ids))}") from None


def _start_one_run(env, key: str, sleep_s: float):
    """A run worker for partition ``key`` whose step sleeps ``sleep_s``: (process, run, launch handle)."""
    import dagster as dg
    from dagster._core.storage.dagster_run import RunsFilter

    proc = H.start_runs(env, [key], sleep_s=sleep_s)[0]
    with dg.DagsterInstance.get() as inst:
        run = _wait_for(lambda: next(iter(inst.get_runs(RunsFilter(tags={"dagster/partition": key}))), None), 120,
                        what="the run")
        return proc, run, _wait_for(lambda: launch_handle(inst, run.run_id), 120, what="the step's launch")


@ON_2411
@pytest.mark.parametrize("events", ["direct", "relay"])
def test_killed_run_worker_is_resumed_and_reattaches_to_its_task(home, events, monkeypatch):
    """The orchestrating process dies (SIGKILL, as on a host restart) while its step runs as an array task:
    the task keeps running; the run, resumed as Dagster's run monitoring resumes it (``dagster api
    resume_run``), re-attaches to that task by the handle in its event log instead of launching another,
    and the partition materializes once. ``relay``: the task cannot open the instance; the killed run worker
    had stored part of its channel, the resumed one reads the channel from the start and stores every event
    exactly once."""
    import dagster as dg
    from dagster._core.storage.dagster_run import DagsterRunStatus

    home_dir, env = home
    if events == "relay":
        for k, v in H.no_database_env(home_dir).items():
            env[k] = v
            monkeypatch.setenv(k, v)
    key = "p190"
    proc, run, handle = _start_one_run(env, key, 25)
    client = _client()
    job_id = f"{handle['array_job_id']}_{handle['array_task_id']}"
    _wait_for(lambda: any(r.state.name == "RUNNING" for r in client.squeue([int(handle["array_job_id"])])), 60,
              what=f"task {job_id} running")
    proc.kill()
    proc.wait(timeout=30)
    with dg.DagsterInstance.get() as inst:
        assert inst.get_run_by_id(run.run_id).status == DagsterRunStatus.STARTED  # nobody marked it ended
        assert any(r.state.name == "RUNNING" for r in client.squeue([int(handle["array_job_id"])])), "the task was cancelled"
        resume_and_check_reattached(inst, run, home_dir / "resume.log", env=env)
    batches = H.spool_batches(Path(env["DAGSTER_GPU_SLURM_SPOOL"]))
    assert [b["tasks"] for b in batches] == [1]  # one sbatch, one task: never relaunched
    mats = _materializations([key])[key]
    assert len(mats) == 1 and f"{mats[0]['slurm/array_job_id']}_{mats[0]['slurm/array_task_id']}" == job_id
    obs = _wait_for(lambda: _all_observed([key]), 60, what="the sacct observation from the resumed process")[key]
    assert obs[0]["bill/source"] == "sacct" and obs[0]["slurm/state"] == "COMPLETED"
    assert obs[0]["slurm/elapsed_seconds"] >= 25
    if events == "relay":
        from dagster_gpu.relay.channel import event_key

        assert mats[0]["test/dagster_home"] == "/nonexistent/dagster-home"
        with dg.DagsterInstance.get() as inst:
            entries = [r.event_log_entry for r in inst.get_records_for_run(run.run_id).records]
            reports = H.relay_reports(inst, [run.run_id])
        worker = [event_key(e) for e in entries if e.step_key == "trivial"]
        assert len(worker) == len(set(worker)), "an event was stored twice"
        types = [e.dagster_event.event_type_value for e in entries if e.dagster_event and e.step_key == "trivial"]
        assert types.count("STEP_START") == 1 and types.count("STEP_SUCCESS") == 1 and types.count("ASSET_MATERIALIZATION") == 1
        assert len(reports) == 1 and reports[0]["dagster_gpu/relay_materializations"] == 1


@ON_2205
def test_sigterm_to_the_run_worker_leaves_its_task_running(home):
    """A SIGTERM to the orchestrating process (a restart, not a user's terminate) cancels no task: the
    task runs to COMPLETED, its partition materializes, and the run's log says the worker was left running."""
    import signal

    import dagster as dg
    from dagster._core.events import DagsterEventType

    _, env = home
    key = "p191"
    proc, run, handle = _start_one_run(env, key, 15)
    client = _client()
    aid = int(handle["array_job_id"])
    # once the step's body runs (STEP_START): before that, Dagster's step worker skips a run that its
    # interrupted run worker has meanwhile marked failed ("treating as failure"), whatever the executor does
    with dg.DagsterInstance.get() as inst:
        _wait_for(lambda: inst.get_records_for_run(run.run_id, of_type=DagsterEventType.STEP_START).records, 120,
                  what="the step to start")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    with dg.DagsterInstance.get() as inst:
        logs = [e.message or "" for e in inst.all_logs(run.run_id)]
    assert any("Leaving the slurm worker of step trivial running" in m for m in logs), logs[-5:]
    acct = _wait_for(lambda: [r for r in client.sacct([aid]) if r.state.name == "COMPLETED"] or None, 90,
                     what=f"task {aid}_0 to complete")
    assert len(acct) == 1 and acct[0].array_task_id == 0
    assert acct[0].elapsed_s >= 15, acct[0]  # the step's whole sleep: it was not cut short
    mats = _materializations([key])[key]
    assert len(mats) == 1 and mats[0]["slurm/array_job_id"] == aid
