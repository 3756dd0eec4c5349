"""A UI terminate cancels every array task even with ``run_monitoring.max_resume_run_attempts`` set.

Dagster's StepDelegatingExecutor does not forward a termination to the step handler when
``instance.run_will_resume(run_id)`` (run monitoring on, resume attempts left), whatever the reason the run
worker stops; without dagster_gpu.executor.user_terminate a terminated backfill left its Slurm array tasks
running. A crashed run worker (the run stays STARTED) keeps its tasks and is resumed:
tests/test_slurm_e2e.py::test_killed_run_worker_is_resumed_and_reattaches_to_its_task.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import slurm_helpers as H
from tests.waiting import wait_for as _wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.e2e, pytest.mark.postgres]

# Dagster accepts max_resume_run_attempts > 0 only with a launcher that can resume runs
MONITORING = """run_launcher:
  module: resumable_launcher
  class: ResumableRunLauncher
run_monitoring:
  enabled: true
  max_resume_run_attempts: 2
  poll_interval_seconds: 5
"""


@pytest.mark.exclusive  # under CPU contention a terminated task ended COMPLETED before its scancel landed (two-worker run)
@H.on_slurm("22.05")  # the fixture starts it on an idle cluster: tasks an earlier test left would hold its GPUs
def test_ui_terminate_with_resume_configured_cancels_every_array_task(slurm_cluster, monkeypatch):
    reason = H.postgres_unavailable_reason()
    if reason:
        pytest.skip(reason)
    import dagster as dg
    from dagster._core.execution.backfill import BulkActionStatus
    from dagster._core.storage.dagster_run import DagsterRunStatus, RunsFilter

    from dagster_gpu.commands.backfill import DaemonProcess, submit_asset_backfill
    from dagster_gpu.slurm.client import SlurmClient
    from tests.slurm_pipeline import defs

    home, env = H.make_dagster_home(extra_yaml=MONITORING)
    for k in ("DAGSTER_HOME", "DAGSTER_PG_PASSWORD", "SLURM_CONF", "DAGSTER_GPU_SLURM_SPOOL"):
        monkeypatch.setenv(k, env[k])
    env = {**env, "SLURM_TEST_THROTTLE": "2", "SLURM_TEST_WINDOW": "2", "SLURM_TEST_MAX_WINDOW": "10", "SLURM_TEST_RECONCILE_WAIT": "0"}
    keys = [f"p{i:03d}" for i in range(160, 163)]
    spool = Path(env["DAGSTER_GPU_SLURM_SPOOL"])
    client = SlurmClient(slurm_conf=H.slurm_conf())
    try:
        with dg.DagsterInstance.get() as instance:
            assert instance.run_monitoring_enabled and instance.run_monitoring_max_resume_run_attempts == 2
            with DaemonProcess(home / "workspace.yaml", env=env, log_file=home / "daemon.log"):
                bid = submit_asset_backfill(instance, defs, dg.AssetKey("trivial"), keys, tags={"test/sleep": "300"})

                def running_tasks():
                    ids = [b["array_job_id"] for b in H.spool_batches(spool)]
                    return [r for r in (client.squeue(ids) if ids else []) if r.state.name == "RUNNING"]

                _wait_for(lambda: len(running_tasks()) >= 2, 300, 2, "two running array tasks")
                runs = instance.get_runs(RunsFilter(tags={"dagster/backfill": bid}))
                assert all(instance.run_will_resume(r.run_id) for r in runs)  # Dagster would not forward a terminate
                # what the UI's "Terminate" does: cancel the backfill, then terminate every run of it
                instance.update_backfill(instance.get_backfill(bid).with_status(BulkActionStatus.CANCELING))
                for r in runs:
                    if not r.is_finished:
                        instance.run_coordinator.cancel_run(r.run_id)

                def all_ended():
                    rs = instance.get_runs(RunsFilter(tags={"dagster/backfill": bid}))
                    for r in rs:
                        if not r.is_finished and r.status != DagsterRunStatus.CANCELING:
                            instance.run_coordinator.cancel_run(r.run_id)
                    return rs if all(r.is_finished for r in rs) else None

                runs = _wait_for(all_ended, 300, 3, "every run of the backfill to end")
                ids = [b["array_job_id"] for b in H.spool_batches(spool)]

                def nothing_live():
                    return not [r for r in client.squeue(ids) if r.state.status.value in ("pending", "running", "requeued")]

                _wait_for(nothing_live, 60, 2, "no live array task")  # scancel'ed tasks pass through COMPLETING
                launched = 0
                for r in runs:
                    logs = [e.message or "" for e in instance.all_logs(r.run_id)]
                    assert not any(m.startswith("Detected run worker status") for m in logs), "a terminated run was resumed"
                    if any("Terminating the slurm worker of step trivial: the run was terminated by a user" in m for m in logs):
                        launched += 1
                        assert r.status == DagsterRunStatus.CANCELED, (r.run_id, r.status)
                assert launched >= 2  # the runs whose tasks ran were cancelled by dagster_gpu, not left running
                # every task was cancelled, the pending one too: without the fix the running ones ended ~10 s later
                # by Dagster's cancellation thread (COMPLETED) and the pending one started after the terminate
                states = {r.id.raw: r.state.name for r in client.sacct(ids)}
                assert len(states) >= 2 and set(states.values()) == {"CANCELLED"}, states
    finally:
        ids = [b["array_job_id"] for b in H.spool_batches(spool)]
        if ids:
            client.scancel([str(i) for i in ids])
