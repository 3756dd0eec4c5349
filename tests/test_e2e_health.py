"""gpu_executor health checks and termination with the local backend (real worker processes)."""

from __future__ import annotations

import signal
import threading
import time

import dagster as dg
import psutil
import pytest

from tests.conftest import REPO
from tests.process_helpers import alive

pytestmark = [pytest.mark.e2e]


def _sleepy_job():
    from tests.locations import e2e_location

    return e2e_location.sleepy_job


def _worker_pid(instance, run_id: str, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        recs = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_START).records
        starting = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_WORKER_STARTING).records
        if recs and starting:
            return int(starting[0].event_log_entry.dagster_event.engine_event_data.metadata["local/pid"].value)
        time.sleep(0.2)
    raise AssertionError("step never started")


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_GPU_TEST_CORPUS", str(tmp_path))
    monkeypatch.setenv("DAGSTER_GPU_TEST_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("DAGSTER_GPU_TEST_SLEEP", "120")
    monkeypatch.syspath_prepend(str(REPO))


RUN_CONFIG = {"execution": {"config": {"sleep_seconds": 0.2, "check_step_health_interval_seconds": 1, "retries": {"disabled": {}}}}}


def test_worker_killed_without_outcome_fails_step_with_exit_code(env):
    with dg.instance_for_test() as instance:
        run_id = []
        result = {}

        def go():
            r = dg.execute_job(dg.reconstructable(_sleepy_job()), instance=instance, tags={"dagster/partition": "a"}, run_config=RUN_CONFIG)
            result["r"] = r

        t = threading.Thread(target=go)
        t.start()
        deadline = time.monotonic() + 60
        while not run_id and time.monotonic() < deadline:
            recs = instance.get_run_records()
            if recs:
                run_id.append(recs[0].dagster_run.run_id)
            time.sleep(0.2)
        supervisor = _worker_pid(instance, run_id[0])
        worker = psutil.Process(supervisor).children()[0]
        worker.send_signal(signal.SIGKILL)
        t.join(timeout=120)
        r = result["r"]
        assert not r.success
        failures = [e for e in r.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
        assert len(failures) == 1
        msg = failures[0].step_failure_data.error.message
        assert "without the step recording success or failure" in msg
        assert "SIGKILL" in msg and "exit code -9" in msg
        assert "partition 'a'" in msg


def test_ui_terminate_kills_worker_process_group(env, tmp_path):
    """Terminate as the UI does it (run coordinator -> run launcher -> run worker interrupt -> terminate_step)."""
    from dagster_gpu.commands.backfill import DaemonProcess, submit_asset_backfill
    from tests.locations import e2e_location as loc
    from tests.test_e2e_local import _workspace

    with dg.instance_for_test(
        overrides={"run_coordinator": {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator",
                                       "config": {"dequeue_interval_seconds": 1}}}
    ) as instance, DaemonProcess(_workspace(tmp_path), log_file=tmp_path / "daemon.log"):
        backfill_id = submit_asset_backfill(instance, loc.defs, loc.sleepy.key, ["b"])
        deadline = time.monotonic() + 120
        run_id = None
        while run_id is None and time.monotonic() < deadline:
            recs = instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
            run_id = recs[0].dagster_run.run_id if recs else None
            time.sleep(0.5)
        assert run_id, "the daemon never launched the backfill's run"
        supervisor = _worker_pid(instance, run_id, timeout=120)
        group = [supervisor] + [c.pid for c in psutil.Process(supervisor).children(recursive=True)]
        assert len(group) >= 2
        instance.run_coordinator.cancel_run(run_id)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and instance.get_run_by_id(run_id).status != dg.DagsterRunStatus.CANCELED:
            time.sleep(0.5)
        assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.CANCELED
        time.sleep(1)
        alive_ = [p for p in group if alive(p)]
        assert alive_ == [], f"worker processes survived terminate: {alive_}"
        engine = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT).records
        assert any("Terminating the local worker of step sleepy" in (r.event_log_entry.dagster_event.message or "") for r in engine)
