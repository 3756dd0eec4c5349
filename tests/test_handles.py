"""The local, Slurm and Kubernetes backends' typed handles: the JSON form the executor stores in the event log (so a resumed
run re-attaches) and the forms recorded by earlier versions."""

from __future__ import annotations

import json

import pytest

from dagster_gpu.k8s.handle import PodHandle
from dagster_gpu.local.backend import LocalHandle
from dagster_gpu.slurm.handle import SlurmHandle


def test_slurm_handle_round_trips_through_json_and_names_its_task():
    h = SlurmHandle(array_job_id=812, array_task_id=3, batch="20261202T073427-67ad46c1", submitted_at=1764660000.5,
                    tasks_in_array=8, log_file="/spool/batches/b/3.out", spool="/spool", cluster="east")
    stored = json.loads(json.dumps(h.to_handle()))
    assert stored["job_id"] == "812_3"
    assert SlurmHandle.from_handle(stored) == h


def test_slurm_handle_reads_a_handle_without_the_optional_fields():
    # a handle of a unit on the default cluster, recorded before submitted_at and the spool were stored
    h = SlurmHandle.from_handle({"job_id": "5_0", "array_job_id": "5", "array_task_id": 0, "batch": "b", "cluster": None})
    assert (h.job_id, h.submitted_at, h.tasks_in_array, h.log_file, h.cluster) == ("5_0", 0.0, 0, "", None)
    with pytest.raises(KeyError):
        SlurmHandle.from_handle({"array_job_id": 5, "array_task_id": 0})  # no batch: not a Slurm handle


def test_local_handle_round_trips_and_reads_one_without_a_unit():
    h = LocalHandle(pid=4242, create_time=1764660000.25, status_file="/l/u.status.json", log_file="/l/u.log",
                    host="vm", unit="run-step-1")
    assert LocalHandle.from_handle(json.loads(json.dumps(h.to_handle()))) == h
    old = LocalHandle.from_handle({"pid": 7, "create_time": 1.0, "status_file": "s", "log_file": "l"})
    assert (old.unit, old.host, old.start_ticks) == ("", "", None)
    ticked = LocalHandle(pid=4242, create_time=1.0, status_file="s", log_file="l", start_ticks=123456)
    assert LocalHandle.from_handle(json.loads(json.dumps(ticked.to_handle()))) == ticked


def test_a_local_worker_stays_itself_when_the_wall_clock_is_stepped():
    """psutil's create_time() is boot time (``/proc/stat`` btime, recomputed from the wall clock) plus the start
    ticks: a clock step moves it, and a worker that still ran was once reported gone. The start ticks do not
    move; they still tell a reused pid apart."""
    import subprocess
    import sys

    import psutil

    from dagster_gpu.local.backend import _alive, start_ticks

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ticks, created = start_ticks(proc.pid), psutil.Process(proc.pid).create_time()
        assert ticks is not None and ticks > 0
        # what the handle recorded before a step of the wall clock by 5 s
        assert _alive(proc.pid, created + 5.0, ticks)
        assert not _alive(proc.pid, created + 5.0)  # the create time alone was fooled (a handle without ticks)
        assert not _alive(proc.pid, created, ticks + 1)  # another process with this pid
        assert _alive(proc.pid, created)
    finally:
        proc.kill()
        proc.wait()
    assert not _alive(proc.pid, created, ticks)


def test_pod_handle_round_trips_through_json():
    h = PodHandle(namespace="ns", pod="dgpu-embed-1a2b", pod_uid="0d6f-uid", template="dgpu-embed-1a2b",
                  device_class="gpu.nvidia.com", device_type="mig-1g.10gb", device_fraction=1 / 7,
                  product="NVIDIA A100-SXM4-80GB", sharing="TimeSlicing", device_request='{"deviceType": "mig-1g.10gb"}',
                  placement_device="mig-1g.10gb", launched_at=1764660000.5, partition_key="doc 1/ä.txt")
    assert PodHandle.from_handle(json.loads(json.dumps(h.to_handle()))) == h


def test_pod_handle_reads_the_minimal_and_the_null_forms():
    # a handle with only the pod's identity (the fields a bill needs default to an unpriced claim-less pod)
    h = PodHandle.from_handle({"namespace": "ns", "pod": "p", "pod_uid": "u", "product": None, "launched_at": None})
    assert (h.device_type, h.device_fraction, h.product, h.template, h.launched_at) == ("default", 0.0, "", "", 0.0)
    with pytest.raises(KeyError, match="pod_uid"):
        PodHandle.from_handle({"namespace": "ns", "pod": "p"})  # no uid: a later pod of the same name is not it
    with pytest.raises(KeyError):
        PodHandle.from_handle({"array_job_id": 5, "array_task_id": 0, "batch": "b"})  # a Slurm handle
