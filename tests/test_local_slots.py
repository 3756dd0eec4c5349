"""The host-wide limit on local units (dagster_gpu.local.slots): real LocalBackend workers, real flock(2) locks."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from dagster_gpu.contracts import StepLaunch, WorkerStatus
from dagster_gpu.core.request import GpuRequest
from dagster_gpu.local import slots
from dagster_gpu.local.backend import LocalBackend, build_backend
from dagster_gpu.policy.placement import Placement

# each unit records when it ran: [start, end] (wall seconds), then sleeps so that two units would overlap
UNIT = ("import json, sys, time; t0 = time.time(); time.sleep(1.5); "
        "open(sys.argv[1], 'w').write(json.dumps([t0, time.time()]))")


def _launch(run: str, out: Path) -> StepLaunch:
    return StepLaunch(run_id=run, step_key="embed", partition_keys=(), attempt=0,
                      argv=(sys.executable, "-c", UNIT, str(out)), env={},
                      request=GpuRequest(), placement=Placement(backend="local", reason="test"))


def _wait_ended(backend: LocalBackend, handle, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s  # waiting for the process, not a speed assertion
    while (st := backend.state(handle)).status == WorkerStatus.RUNNING and time.monotonic() < deadline:
        time.sleep(0.05)
    return st


def test_units_beyond_the_limit_wait_for_a_slot_and_say_so(tmp_path):
    backend = LocalBackend(tmp_path / "logs", max_units=1, slots_dir=tmp_path / "slots")
    a = backend.launch(_launch("ra", tmp_path / "a.json"))
    time.sleep(0.3)  # a holds the one slot (its supervisor takes it before its worker starts)
    b = backend.launch(_launch("rb", tmp_path / "b.json"))
    assert _wait_ended(backend, a).status == WorkerStatus.SUCCEEDED
    assert _wait_ended(backend, b).status == WorkerStatus.SUCCEEDED
    ran_a = json.loads((tmp_path / "a.json").read_text())
    ran_b = json.loads((tmp_path / "b.json").read_text())
    assert ran_b[0] >= ran_a[1] - 0.05  # b's worker started once a's had ended: never side by side
    log_b = Path(b["log_file"]).read_text()
    assert ("dagster-gpu: waiting for a local unit slot: all 1 of this host's are held by other units "
            f"(local.max_units; {tmp_path / 'slots'})") in log_b
    assert "dagster-gpu: local unit slot 0 of 1 taken after" in log_b
    assert "waiting" not in Path(a["log_file"]).read_text()  # a free slot: no line


def test_two_slots_run_two_units_side_by_side(tmp_path):
    backend = LocalBackend(tmp_path / "logs", max_units=2, slots_dir=tmp_path / "slots")
    hs = [backend.launch(_launch(f"r{i}", tmp_path / f"{i}.json")) for i in range(2)]
    assert all(_wait_ended(backend, h).status == WorkerStatus.SUCCEEDED for h in hs)
    (s0, e0), (s1, e1) = (json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2))
    assert s1 < e0 and s0 < e1  # overlapping
    assert not any("waiting" in Path(h["log_file"]).read_text() for h in hs)


def test_a_unit_stopped_while_waiting_never_starts(tmp_path):
    directory = tmp_path / "slots"
    held = slots.try_acquire(1, directory)  # another unit of the host holds the only slot
    assert held is not None and held[0] == 0
    try:
        backend = LocalBackend(tmp_path / "logs", max_units=1, slots_dir=directory, terminate_grace_s=5)
        h = backend.launch(_launch("rw", tmp_path / "w.json"))
        deadline = time.monotonic() + 30
        while "waiting for a local unit slot" not in Path(h["log_file"]).read_text():
            assert time.monotonic() < deadline, "the unit never said it waits"
            time.sleep(0.05)
        backend.terminate(h)
        st = _wait_ended(backend, h)
        assert (st.status, st.exit_code) == (WorkerStatus.FAILED, -signal.SIGTERM)
        assert "stopped by SIGTERM while waiting for a local unit slot" in st.message
        assert not (tmp_path / "w.json").exists()
    finally:
        os.close(held[1])


def test_the_default_limit_is_the_hosts_cores_and_zero_is_none(tmp_path):
    backend = build_backend(None, {}, tmp_path / "logs")
    assert backend.max_units == len(os.sched_getaffinity(0)) == slots.host_cores()
    assert build_backend({"max_units": 0}, {}, tmp_path / "logs").max_units == 0
    with pytest.raises(ValueError, match="local.max_units must be an integer >= 0"):
        LocalBackend(tmp_path / "logs", max_units=-1)
    with pytest.raises(ValueError, match="DAGSTER_GPU_LOCAL_SLOTS='x:/tmp'"):
        slots.parse_env("x:/tmp")
