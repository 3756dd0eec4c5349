"""A RetryPolicy on the asset retries a step whose worker was SIGKILLed, for that partition only, and the
run ends SUCCESS: the local backend (a real worker process) and Slurm (a real array task on the local
cluster, next to another partition's task of the same job array)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import dagster as dg
import psutil
import pytest

from tests.conftest import REPO
from tests.waiting import wait_for

RUN_CONFIG = {"execution": {"config": {"sleep_seconds": 0.2, "check_step_health_interval_seconds": 1, "retries": {"enabled": {}}}}}


def _events(instance, run_id, kind):
    return [r.event_log_entry for r in instance.get_records_for_run(run_id, of_type=kind).records]


@pytest.mark.e2e
def test_local_sigkilled_worker_is_retried_for_its_partition_only(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_GPU_TEST_CORPUS", str(tmp_path))
    monkeypatch.setenv("DAGSTER_GPU_TEST_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("DAGSTER_GPU_TEST_SLEEP", "120")
    monkeypatch.setenv("DAGSTER_GPU_TEST_SLOW_FIRST", "a")
    monkeypatch.syspath_prepend(str(REPO))
    from tests.locations import e2e_location as loc

    with dg.instance_for_test() as instance:
        results = {}

        def go(key):
            results[key] = dg.execute_job(dg.reconstructable(loc.flaky_job), instance=instance,
                                          tags={"dagster/partition": key}, run_config=RUN_CONFIG)  # fmt: skip

        # partition a runs in a thread (its attempt 0 is killed); partition b's run comes after it
        threads = [threading.Thread(target=go, args=("a",))]
        threads[0].start()

        def run_a():
            recs = instance.get_run_records(dg.RunsFilter(tags={"dagster/partition": "a"}))
            return recs[0].dagster_run.run_id if recs else None

        run_id = wait_for(run_a, 60, poll_s=0.5, what="run a")

        def worker_of_attempt_0():
            if not _events(instance, run_id, dg.DagsterEventType.STEP_START):
                return None
            starting = _events(instance, run_id, dg.DagsterEventType.STEP_WORKER_STARTING)
            return int(starting[0].dagster_event.engine_event_data.metadata["local/pid"].value) if starting else None

        supervisor = wait_for(worker_of_attempt_0, 90, poll_s=0.5, what="attempt 0 of partition a running")
        worker = psutil.Process(supervisor).children()[0]
        killed_pid = worker.pid
        worker.send_signal(signal.SIGKILL)
        threads[0].join(timeout=240)
        go("b")
        assert results["a"].success and results["b"].success
        a_id, b_id = results["a"].run_id, results["b"].run_id
        assert instance.get_run_by_id(a_id).status == dg.DagsterRunStatus.SUCCESS
        retries = _events(instance, a_id, dg.DagsterEventType.STEP_UP_FOR_RETRY)
        assert len(retries) == 1
        msg = retries[0].dagster_event.event_specific_data.error.message
        assert "SIGKILL" in msg and "exit code -9" in msg and "partition 'a'" in msg
        assert len(_events(instance, a_id, dg.DagsterEventType.STEP_WORKER_STARTING)) == 2  # attempt 0, then the retry
        # partition b's run saw no failure and launched one worker
        assert _events(instance, b_id, dg.DagsterEventType.STEP_UP_FOR_RETRY) == []
        assert len(_events(instance, b_id, dg.DagsterEventType.STEP_WORKER_STARTING)) == 1
        mats = {}
        for key in ("a", "b"):
            recs = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("flaky"), asset_partitions=[key]), limit=10
            ).records
            mats[key] = [{k: v.value for k, v in r.asset_materialization.metadata.items()} for r in recs]
        assert [m["retry_number"] for m in mats["a"]] == [1] and mats["a"][0]["pid"] != killed_pid
        assert [m["retry_number"] for m in mats["b"]] == [0]


@pytest.mark.slurm
@pytest.mark.e2e
@pytest.mark.postgres
def test_slurm_sigkilled_step_worker_is_retried_as_a_new_task_for_its_partition_only():
    """Two runs share one job array; the step worker of one partition is SIGKILLed inside its array task.
    Its RetryPolicy launches one new array task for that partition only; both runs end SUCCESS and each
    partition is materialized once."""
    from dagster._core.event_api import AssetRecordsFilter
    from dagster._core.storage.dagster_run import RunsFilter

    from dagster_gpu.slurm.client import SlurmClient
    from tests import slurm_helpers as H

    reason = H.cluster_unavailable_reason() or H.postgres_unavailable_reason()
    if reason:
        pytest.skip(reason)
    home, env = H.make_dagster_home()
    pid_dir = home / "pids"
    pid_dir.mkdir()
    env = {**env, "SLURM_TEST_RETRIES": "1", "DGPU_TEST_SLOW_FIRST": "p150", "DGPU_TEST_PID_DIR": str(pid_dir),
           "SLURM_TEST_WINDOW": "3", "SLURM_TEST_MAX_WINDOW": "10", "SLURM_TEST_RECONCILE_WAIT": "0"}  # fmt: skip
    keys = ["p150", "p151"]
    old = {k: os.environ.get(k) for k in ("DAGSTER_HOME", "DAGSTER_PG_PASSWORD")}
    os.environ.update({k: env[k] for k in old})
    client = SlurmClient(slurm_conf=H.slurm_conf())
    spool = Path(env["DAGSTER_GPU_SLURM_SPOOL"])
    procs = H.start_runs(env, keys, sleep_s=2)
    try:
        pid_file = pid_dir / "p150.pid"
        wait_for(pid_file.exists, 240, poll_s=0.5, what="attempt 0 of p150 running in its array task")
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGKILL)  # the step worker inside the array task (this host is the compute node)
        codes = H.wait_all(procs, 400)
        assert codes == [0, 0], H.explain_failures(home, keys, codes)
        batches = H.spool_batches(spool)
        assert [b["tasks"] for b in batches] == [2, 1]  # both partitions in one array, then the retry alone
        acct = client.sacct([b["array_job_id"] for b in batches])
        first = {r.array_task_id: r for r in acct if r.array_job_id == batches[0]["array_job_id"]}
        assert sorted(str(r.state) for r in first.values()) == ["COMPLETED", "FAILED"]
        with dg.DagsterInstance.get() as inst:
            for key in keys:
                (run,) = inst.get_runs(RunsFilter(tags={"dagster/partition": key}))
                assert run.status == dg.DagsterRunStatus.SUCCESS
                retries = _events(inst, run.run_id, dg.DagsterEventType.STEP_UP_FOR_RETRY)
                recs = inst.fetch_materializations(AssetRecordsFilter(asset_key=dg.AssetKey("trivial"), asset_partitions=[key]), limit=10).records
                md = [{n: v.value for n, v in r.asset_materialization.metadata.items()} for r in recs]
                assert len(md) == 1, md
                if key == "p150":
                    assert len(retries) == 1 and f"{batches[0]['array_job_id']}_" in retries[0].dagster_event.event_specific_data.error.message
                    assert md[0]["test/retry_number"] == 1 and md[0]["slurm/array_job_id"] == batches[1]["array_job_id"]
                else:
                    assert retries == [] and md[0]["test/retry_number"] == 0
                    assert md[0]["slurm/array_job_id"] == batches[0]["array_job_id"]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        ids = [b["array_job_id"] for b in H.spool_batches(spool)]
        if ids:
            client.scancel([str(i) for i in ids])
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
