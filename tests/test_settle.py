"""The backend contract after a worker ends, without a cluster: ``state`` only reads, ``accounting`` returns
the scheduler's bill, ``elect_bill_writer`` lets exactly one caller write it, and the settler drives them.

Slurm runs on a client that answers squeue/sacct with outputs recorded on the local cluster
(``tests/data/slurm``); Kubernetes on a fake API holding one pod object.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import subprocess
import time
from pathlib import Path

import pytest
from kubernetes.client import (V1Container, V1ContainerState, V1ContainerStateTerminated, V1ContainerStatus,
                               V1EnvVar, V1ObjectMeta, V1Pod, V1PodResourceClaimStatus, V1PodSpec, V1PodStatus)

from dagster_gpu.contracts import UnitBill, WorkerStatus
from dagster_gpu.k8s.backend import KubernetesBackend
from dagster_gpu.local.backend import LocalBackend
from dagster_gpu.slurm.backend import SlurmBackend, SlurmSettings
from dagster_gpu.executor.bill_writer import unit_rate
from dagster_gpu.executor.settle import Settler
from dagster_gpu.core.jsonfile import write_json
from dagster_gpu.k8s import manifests as m
from dagster_gpu.slurm.client import SlurmClient, SlurmRejected
from dagster_gpu.slurm.parse import parse_sacct

DATA = Path(__file__).parent / "data" / "slurm"


class _Recorder:
    """A bill writer that records what it was given."""

    def __init__(self):
        self.bills: list[UnitBill] = []

    def __call__(self, bill: UnitBill) -> int:
        self.bills.append(bill)
        return 1


# -- Slurm ------------------------------------------------------------------------------------------------
class _RecordedSlurm(SlurmClient):
    """Answers squeue and sacct with recorded outputs; records every command (scancel included)."""

    def _run_once(self, argv, ok_codes=(0,), forward_env=False):
        self.argvs.append(list(argv))
        out = {"squeue": self.squeue_text, "sacct": self.sacct_text}.get(argv[0], "")
        if out.startswith("slurm_load_jobs error"):  # a recorded failure (squeue_runaway.txt: its stderr)
            raise SlurmRejected(list(argv), 1, out.strip(), out)
        return subprocess.CompletedProcess(list(argv), 0, out, "")


def _slurm(tmp_path, squeue: str, sacct: str, **kw) -> tuple[SlurmBackend, _RecordedSlurm]:
    client = _RecordedSlurm()
    client.argvs, client.squeue_text, client.sacct_text = [], (DATA / squeue).read_text(), (DATA / sacct).read_text()
    backend = SlurmBackend(SlurmSettings(spool_dir=str(tmp_path / "spool"), poll_interval_seconds=60.0, **kw), client=client)
    return backend, client


def _batch(backend: SlurmBackend, array_job_id: int, tasks: int, done: bool = False, submitted_at: float | None = None) -> str:
    """A submitted job array in the spool, as the coalescer leaves it; each task's env names its index.
    ``submitted_at``: our clock after sbatch returned (default: a second after the recorded Submit)."""
    batch = f"b{array_job_id}"
    bdir = backend.spool.batch_dir(batch)
    bdir.mkdir(parents=True)
    ctx = json.dumps({"rates": {"NVIDIA A100-SXM4-80GB": 3.6, "default": 3.6}})
    write_json(bdir / "manifest.json", {"tasks": [{"argv": ["true"], "env": {"TASK": str(i), "DAGSTER_GPU_STEP_CONTEXT": ctx}}
                                                  for i in range(tasks)]})
    # our clock when sbatch returned: a second after the Submit time Slurm recorded for the array
    if submitted_at is None:
        submitted_at = min(r.submit for r in parse_sacct(backend.client.sacct_text) if r.id.job_id == array_job_id).timestamp() + 1
    write_json(bdir / "submitted.json", {"array_job_id": array_job_id, "cluster": None, "tasks": tasks,
                                         "submitted_at": submitted_at})
    if done:
        write_json(bdir / "done", {"at": time.time()})
    return batch


def _slurm_handle(backend: SlurmBackend, batch: str, array_job_id: int, task: int) -> dict:
    submitted = json.loads((backend.spool.batch_dir(batch) / "submitted.json").read_text())["submitted_at"]
    return {"job_id": f"{array_job_id}_{task}", "cluster": None, "array_job_id": array_job_id, "array_task_id": task,
            "batch": batch, "submitted_at": submitted}


def test_slurm_state_of_an_ended_task_has_no_side_effect_and_accounting_returns_its_sacct_bill(tmp_path):
    backend, client = _slurm(tmp_path, "squeue_array_done.txt", "sacct_all.txt")
    batch = _batch(backend, 29, 10)
    h = _slurm_handle(backend, batch, 29, 0)
    first, second = backend.state(h), backend.state(h)
    assert first == second and first.status == WorkerStatus.SUCCEEDED and not first.abandoned
    assert {a[0] for a in client.argvs} == {"squeue", "sacct"}  # no scancel
    assert not (backend.spool.batch_dir(batch) / "reconciled").exists()  # no bill written or claimed
    bill = backend.accounting(h)
    assert bill is not None and not bill.empty
    assert bill.gpu_seconds == 3.0  # ElapsedRaw 3 x gres/gpu=1
    assert bill.match == ("slurm/job_id", "34")  # the job id of task 29_0 (SLURM_JOB_ID in the worker)
    assert bill.metadata["billing/source"] == "sacct" and bill.metadata["slurm/state"] == "COMPLETED"
    assert unit_rate(bill, None) == 3.6 and bill.env["TASK"] == "0"
    assert backend.accounting(h) == bill  # reading again changes nothing
    assert backend.elect_bill_writer(h) is True and backend.elect_bill_writer(h) is False  # exactly one writer
    assert (backend.spool.batch_dir(batch) / "reconciled" / "0.json").exists()


def test_slurm_settler_writes_each_task_bill_once_and_the_sweep_finds_other_processes_tasks(tmp_path):
    backend, client = _slurm(tmp_path, "squeue_array_done.txt", "sacct_all.txt")
    batch = _batch(backend, 29, 10, done=True)
    rec = _Recorder()
    settler = Settler(write=rec)
    assert settler.settle(backend, _slurm_handle(backend, batch, 29, 3)) is True
    assert [b.env["TASK"] for b in rec.bills] == ["3"]
    assert settler.settle(backend, _slurm_handle(backend, batch, 29, 3)) is True and len(rec.bills) == 1  # released already
    # the other nine tasks were launched by a process that exited: the sweep settles them
    assert len(backend.unsettled()) == 9
    assert settler.sweep(backend) == 9
    assert sorted(int(b.env["TASK"]) for b in rec.bills) == list(range(10))
    assert sum(b.gpu_seconds for b in rec.bills) == 30.0
    assert (backend.spool.batch_dir(batch) / "reconciled" / "all").exists() and backend.unsettled() == []
    assert not any(a[0] == "scancel" for a in client.argvs)


def test_a_relayed_units_channel_is_read_before_its_bill_and_a_failed_read_defers_the_bill(tmp_path):
    """A relayed step's materializations reach the instance only when the run worker reads the channel: the
    settler calls the unit's ``before_bill`` (the relay pump, forced) once the task ended and before it takes
    the bill, so the bill is split over them. A read that fails leaves the unit unbilled and unclaimed, for the
    next pass; a unit a sweep finds runs every hook still registered (its listed handle need not match)."""
    backend, _client = _slurm(tmp_path, "squeue_array_done.txt", "sacct_all.txt")
    batch = _batch(backend, 29, 10, done=True)
    order: list[str] = []
    rec = _Recorder()
    settler = Settler(write=lambda bill: (order.append(f"bill {bill.env['TASK']}"), rec(bill))[1], background=False)
    fail = [True]

    def pump(task: str):
        def hook():
            order.append(f"read {task}")
            if task == "4" and fail[0]:
                fail[0] = False
                raise OSError("ssh: connection to the login node dropped")
        return hook

    settler.track(backend, _slurm_handle(backend, batch, 29, 3), pump("3"))
    settler.track(backend, _slurm_handle(backend, batch, 29, 4), pump("4"))
    assert settler.settle(backend, _slurm_handle(backend, batch, 29, 3)) is True
    assert order == ["read 3", "bill 3"]
    assert settler.settle(backend, _slurm_handle(backend, batch, 29, 4)) is False  # the read failed: no bill, no claim
    assert not (backend.spool.batch_dir(batch) / "reconciled" / "4.json").exists()
    assert settler.settle(backend, _slurm_handle(backend, batch, 29, 4)) is True
    assert order == ["read 3", "bill 3", "read 4", "read 4", "bill 4"]
    # a sweep's unit: the hooks of units still tracked here are run first (none is left: both were billed)
    settler.track(backend, _slurm_handle(backend, batch, 29, 5), pump("5"))
    order.clear()
    assert settler.settle(backend, {**_slurm_handle(backend, batch, 29, 5), "log_file": "as listed"}, ended=True) is True
    assert order == ["read 5", "bill 5"]


def test_a_sweep_leaves_a_relayed_unit_of_a_running_run_to_its_own_run_worker(tmp_path):
    """Another run worker's sweep (at its exit, or the bills sensor) finds a relayed unit of a run that is still going:
    that unit's materializations reach the instance only when its own run worker reads the channel, so a bill
    written now would be split as if nothing were materialized. The sweep leaves it, unclaimed; once the run has
    finished, a sweep bills it (its run worker may be gone). Seen in CI as a unit of the ssh relay test with no
    bill: another run worker's exit sweep took it first, and the run had no asset to put the share on."""
    import dagster as dg

    from dagster_gpu.executor.bill_writer import ObservationWriter
    from dagster_gpu.relay.channel import RELAY_ENV
    from dagster_gpu.instance.step_args import ENV_VAR, encode_step_args
    from dagster._grpc.types import ExecuteStepArgs

    backend, _client = _slurm(tmp_path, "squeue_array_done.txt", "sacct_all.txt")
    batch = _batch(backend, 29, 10, done=True)
    with dg.instance_for_test() as instance:
        from tests.test_compat_paths import noop_job

        run = instance.create_run_for_job(noop_job, status=dg.DagsterRunStatus.STARTED)
        args = ExecuteStepArgs(job_origin=dg.reconstructable(noop_job).get_python_origin(), run_id=run.run_id,
                               step_keys_to_execute=["noop"], instance_ref=instance.get_ref())
        env = {ENV_VAR: encode_step_args(args), RELAY_ENV: '{"channel": "/spool/relay/c.jsonl", "seed": ""}'}
        writer = ObservationWriter()
        relayed = UnitBill(gpu_seconds=3.0, rate_usd_per_gpu_hour=1.0, metadata={}, env=env)
        direct = UnitBill(gpu_seconds=3.0, rate_usd_per_gpu_hour=1.0, metadata={}, env={ENV_VAR: env[ENV_VAR]})
        assert writer.ready(direct) is True and writer.ready(relayed) is False  # the run is STARTED
        rec = _Recorder()
        settler = Settler(write=rec, background=False, ready=lambda bill: writer.ready(relayed))
        assert settler.settle(backend, _slurm_handle(backend, batch, 29, 7), ended=True) is False
        assert not (backend.spool.batch_dir(batch) / "reconciled" / "7.json").exists() and rec.bills == []
        # its own run worker, which tracks it with its relay hook, bills it whatever the run's state
        own = Settler(write=rec, background=False, ready=lambda bill: False)
        own.track(backend, _slurm_handle(backend, batch, 29, 7), lambda: None)
        assert own.settle(backend, _slurm_handle(backend, batch, 29, 7)) is True and len(rec.bills) == 1
        instance.report_run_failed(instance.get_run_by_id(run.run_id))
        assert writer.ready(relayed) is True  # the run ended: a sweep may bill what is left
        assert settler.settle(backend, _slurm_handle(backend, batch, 29, 8), ended=True) is True
        writer.close()


def test_the_sweep_polls_for_job_arrays_no_process_saw_end(tmp_path):
    """Every run worker exited while sacct had no final records (slurmdbd down), so no poll marked the job
    array done; the bills sensor's sweep is then the only process left to poll, and it must."""
    backend, client = _slurm(tmp_path, "squeue_array_done.txt", "sacct_all.txt")
    batch = _batch(backend, 29, 10)  # not marked done
    rec = _Recorder()
    assert len(backend.unsettled()) == 10
    assert (backend.spool.batch_dir(batch) / "done").exists()
    assert [a[0] for a in client.argvs] == ["squeue", "sacct"]  # one poll serves the marking and the bills
    assert Settler(write=rec).sweep(backend) == 10
    assert sum(b.gpu_seconds for b in rec.bills) == 30.0
    polls = [a for a in client.argvs if a[0] != "scontrol"]  # scontrol show config: once per client, for the bills
    assert backend.unsettled() == [] and len(polls) == 2  # nothing active: no more polls


class _FlakyWriter(_Recorder):
    """Fails the first ``failures`` writes (the Dagster storage restarting), then records."""

    def __init__(self, failures: int):
        super().__init__()
        self.failures = failures

    def __call__(self, bill: UnitBill) -> int:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("server closed the connection unexpectedly")
        return super().__call__(bill)


def test_a_bill_whose_write_failed_after_the_release_is_written_on_the_next_pass(tmp_path):
    backend, _ = _slurm(tmp_path, "squeue_array_done.txt", "sacct_all.txt")
    batch = _batch(backend, 29, 10, done=True)
    rec = _FlakyWriter(failures=2)
    settler = Settler(write=rec)
    assert settler.settle(backend, _slurm_handle(backend, batch, 29, 3)) is False  # released, the write failed
    assert settler.tracked() == 1 and rec.bills == []
    assert Settler(write=_Recorder()).settle(backend, _slurm_handle(backend, batch, 29, 3)) is True  # nobody else bills it
    assert settler.sweep(backend) == 8  # 9 unsettled, the first write fails: that one is kept and tracked
    assert settler.tracked() == 2 and len(rec.bills) == 8
    assert settler.pass_once() == 0  # both owed bills written, without asking Slurm or releasing again
    assert sorted(int(b.env["TASK"]) for b in rec.bills) == list(range(10))
    assert sum(b.gpu_seconds for b in rec.bills) == 30.0


def test_a_bill_whose_write_keeps_failing_logs_its_traceback_once_then_one_debug_line_a_pass(tmp_path, caplog):
    backend, _ = _slurm(tmp_path, "squeue_array_done.txt", "sacct_all.txt")
    batch = _batch(backend, 29, 10, done=True)
    rec = _FlakyWriter(failures=3)
    settler = Settler(write=rec)
    handle = _slurm_handle(backend, batch, 29, 3)
    with caplog.at_level(logging.DEBUG, logger="dagster_gpu.executor.settle"):
        assert settler.settle(backend, handle) is False
        assert settler.settle(backend, handle) is False
        assert settler.settle(backend, handle) is False
        assert settler.settle(backend, handle) is True
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    assert [(r.levelno, r.exc_info is not None) for r in failed] == [(logging.ERROR, True), (logging.DEBUG, False),
                                                                      (logging.DEBUG, False)]
    assert "server closed the connection unexpectedly" in failed[1].getMessage()
    assert len(rec.bills) == 1


def test_slurm_task_over_its_wait_limit_is_abandoned_by_state_and_cancelled_by_the_settler(tmp_path):
    backend, client = _slurm(tmp_path, "squeue_held.txt", "sacct_held.txt", wait_limits_seconds={"held": 60.0})
    batch = _batch(backend, 35, 3)
    h = _slurm_handle(backend, batch, 35, 1)  # SPECIAL_EXIT, requeued in held state
    assert backend.state(h).status == WorkerStatus.REQUEUED  # within its limit
    wait, _ = backend._waiting_since[(35, 1)]
    backend._waiting_since[(35, 1)] = (wait, time.time() - 120)  # seen held for two minutes
    first, second = backend.state(h), backend.state(h)
    assert first == second and first.status == WorkerStatus.FAILED and first.abandoned
    assert "wait_limits_seconds.held = 60 s, so the task is cancelled" in first.message
    assert not any(a[0] == "scancel" for a in client.argvs)  # state cancels nothing
    rec = _Recorder()
    settler = Settler(write=rec)
    assert settler.settle(backend, h) is False  # cancelled; its bill comes once sacct has the final record
    assert settler.settle(backend, h) is False
    assert [a for a in client.argvs if a[0] == "scancel"] == [["scancel", "35_1"]]  # once
    assert rec.bills == []


def test_a_runaway_slurm_task_fails_its_step_after_its_limit_and_is_billed_once_sacct_has_its_end(tmp_path):
    """Recorded on a Slurm cluster whose controller lost a job array (tests/data/slurm/record_runaway_fixtures.py):
    squeue says "Invalid job id specified", sacct still has both tasks RUNNING; then an administrator's
    ``sacctmgr show runawayjobs`` fix makes them COMPLETED with no elapsed time."""
    aid = json.loads((DATA / "runaway_jobs.json").read_text())["runaway_array"]
    backend, client = _slurm(tmp_path, "squeue_runaway.txt", "sacct_runaway.txt", wait_limits_seconds={"runaway": 60.0})
    batch = _batch(backend, aid, 2)
    h = _slurm_handle(backend, batch, aid, 0)
    st = backend.state(h)
    assert (st.status, st.message) == (WorkerStatus.RUNNING, f"Slurm array task {aid}_0 is RUNNING (sacct)")
    wait, _ = backend._waiting_since[(aid, 0)]
    assert wait == "runaway"
    backend._waiting_since[(aid, 0)] = (wait, time.time() - 120)  # seen so for two minutes
    failed = backend.state(h)
    assert failed.status == WorkerStatus.FAILED and not failed.abandoned  # the controller has nothing to cancel
    assert failed.message.startswith(
        f"Slurm array task {aid}_0 is RUNNING in sacct but unknown to the controller (squeue) for 120 s, over the "
        "Slurm backend's wait_limits_seconds.runaway = 60 s: it ended while slurmdbd was behind, or slurmctld lost "
        "it (a runaway job: sacctmgr show runawayjobs)")
    rec = _Recorder()
    settler = Settler(write=rec)
    assert settler.settle(backend, h) is False and rec.bills == []  # no bill while sacct has no end
    assert not any(a[0] == "scancel" for a in client.argvs)
    client.sacct_text = (DATA / "sacct_runaway_fixed.txt").read_text()
    backend.spool.poll_file.unlink()  # the next poll asks Slurm again
    fixed = backend.state(h)
    assert (fixed.status, fixed.exit_code) == (WorkerStatus.SUCCEEDED, 0) and (aid, 0) not in backend._waiting_since
    assert settler.settle(backend, h) is True  # settled with what Slurm billed: 0 s (End = Start)
    assert [(b.gpu_seconds, b.metadata["slurm/job_id"]) for b in rec.bills] == [(0.0, "3")]


def test_a_reused_job_id_bills_only_our_job_arrays_tasks(tmp_path):
    """Recorded (record_runaway_fixtures.py): slurmctld lost its state and numbered jobs from 1 again, so our
    job array got the id of one it had ended (CANCELLED after running); sacct lists both under one id."""
    ids = json.loads((DATA / "runaway_jobs.json").read_text())
    aid = ids["reused_array"]
    backend, client = _slurm(tmp_path, "squeue_runaway.txt", "sacct_reused_id.txt")
    batch = _batch(backend, aid, 2, submitted_at=ids["reused_id_submitted_at"])
    assert backend.state(_slurm_handle(backend, batch, aid, 0)).status == WorkerStatus.SUCCEEDED
    assert backend.accounting(_slurm_handle(backend, batch, aid, 0)).gpu_seconds == 4.0  # ours alone: 4 s x 1 GPU
    rec = _Recorder()
    assert len(backend.unsettled()) == 2 and Settler(write=rec).sweep(backend) == 2
    assert sorted((b.env["TASK"], b.gpu_seconds) for b in rec.bills) == [("0", 4.0), ("1", 4.0)]


# -- Kubernetes ---------------------------------------------------------------------------------------------
UID = "9b1f4a52-0d43-4c3e-9a47-6f00e1a2c3d4"
T0 = dt.datetime(2026, 11, 30, 15, 0, 0, tzinfo=dt.timezone.utc)


class _Watch:
    def start(self):
        pass

    def get(self, uid):
        return {"devices": ["gpu.nvidia.com/gpu-node-0/gpu-1"]} if uid == UID else None


class _Kube:
    """One Succeeded step pod that ran 100 s on a whole GPU; records deletes."""

    namespace = "ns"

    def __init__(self):
        term = V1ContainerStateTerminated(exit_code=0, reason="Completed", started_at=T0,
                                          finished_at=T0 + dt.timedelta(seconds=100))
        self.pod = V1Pod(
            metadata=V1ObjectMeta(name="p", namespace="ns", uid=UID, labels={m.LABEL_MANAGED_BY: m.MANAGED_BY}),
            spec=V1PodSpec(containers=[V1Container(name="step", env=[V1EnvVar(name="TASK", value="pod")])],
                           node_name="gpu-node-0"),
            status=V1PodStatus(phase="Succeeded",
                               resource_claim_statuses=[V1PodResourceClaimStatus(name=m.REQUEST_NAME, resource_claim_name="p-gpu-x")],
                               container_statuses=[V1ContainerStatus(name="step", image="x", image_id="", ready=False,
                                                                     restart_count=0, state=V1ContainerState(terminated=term))]))
        self.deleted: list[str] = []

    def read_pod(self, name):
        return self.pod

    def list_pods(self, selector):
        return [self.pod] if self.pod is not None else []

    def delete_pod(self, name, uid=None):
        self.deleted.append(name)
        gone, self.pod = self.pod is None, None
        return not gone


def _k8s(**kw) -> tuple[KubernetesBackend, _Kube]:
    kube = _Kube()
    b = KubernetesBackend(kube, m.PodSettings(namespace="ns", secret_env=()), rates={"NVIDIA A100-SXM4-80GB": 3.6, "default": 1.0}, **kw)
    b.claims = _Watch()
    return b, kube


HANDLE = {"namespace": "ns", "pod": "p", "pod_uid": UID, "template": "p", "device_type": "NVIDIA A100-SXM4-80GB",
          "device_fraction": 1.0, "product": "NVIDIA A100-SXM4-80GB", "launched_at": T0.timestamp()}


def test_k8s_state_of_an_ended_pod_deletes_nothing_and_accounting_returns_its_pod_interval_bill():
    b, kube = _k8s()
    first, second = b.state(HANDLE), b.state(HANDLE)
    assert first == second and (first.status, first.exit_code) == (WorkerStatus.SUCCEEDED, 0)
    assert kube.deleted == [] and kube.pod is not None
    bill = b.accounting(HANDLE)
    assert bill is not None and not bill.empty
    assert bill.gpu_seconds == 100.0 and bill.rate_usd_per_gpu_hour == 3.6
    assert bill.metadata["billing/source"] == "pod-interval" and bill.metadata["k8s/resource_claim"] == "p-gpu-x"
    assert bill.metadata["k8s/allocated_devices"] == "gpu.nvidia.com/gpu-node-0/gpu-1"
    assert bill.match == ("k8s/pod", "p") and bill.env == {"TASK": "pod"}
    assert b.elect_bill_writer(HANDLE) is True and kube.deleted == ["p"]
    assert b.elect_bill_writer(HANDLE) is False and kube.deleted == ["p"]
    assert b.state(HANDLE) == first and b.accounting(HANDLE) == bill  # remembered after the pod is gone


def test_k8s_settler_bills_once_even_when_another_process_deleted_the_pod_first():
    b, kube = _k8s()
    rec = _Recorder()
    assert Settler(write=rec).settle(b, HANDLE) is True
    assert [x.gpu_seconds for x in rec.bills] == [100.0] and kube.deleted == ["p"]
    other, kube2 = _k8s()  # another orchestrating process read the same pod end, but its delete comes second
    assert other.state(HANDLE).status == WorkerStatus.SUCCEEDED
    kube2.pod = None
    rec2 = _Recorder()
    assert Settler(write=rec2).settle(other, HANDLE) is True and rec2.bills == []


def test_k8s_sweep_settles_ended_pods_of_any_process_after_the_grace():
    b, kube = _k8s(sweep_grace_s=0.0)
    rec = _Recorder()
    settler = Settler(write=rec)
    assert settler.sweep(b) == 1 and [x.env for x in rec.bills] == [{"TASK": "pod"}] and kube.deleted == ["p"]
    assert settler.sweep(b) == 0
    late, _ = _k8s(sweep_grace_s=-1)
    assert late.unsettled() == []


# -- local ------------------------------------------------------------------------------------------------
def _local_worker(backend: LocalBackend, seconds: float, ctx: str) -> tuple[dict, UnitBill | None]:
    """Launch a worker that sleeps ``seconds``; (its handle, the accounting asked while it ran)."""
    import sys

    from dagster_gpu.contracts import StepLaunch
    from dagster_gpu.policy.placement import Placement
    from dagster_gpu.core.request import GpuRequest

    h = backend.launch(StepLaunch(
        run_id="r1", step_key="s", partition_keys=(), attempt=0, argv=(sys.executable, "-c", f"import time; time.sleep({seconds})"),
        env={"DAGSTER_GPU_STEP_CONTEXT": ctx, "DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS": "x", "SECRET": "s3cr3t"},
        request=GpuRequest(), placement=Placement(backend="local", reason="test")))
    early = backend.accounting(h)
    deadline = time.monotonic() + 60  # waiting for the process, not a speed assertion
    while backend.state(h).status == WorkerStatus.RUNNING and time.monotonic() < deadline:
        time.sleep(0.05)
    return h, early


def test_local_backend_bills_its_worker_process_once_and_only_in_the_launching_process(tmp_path):
    from dagster_gpu.telemetry.nvml import list_gpus

    ctx = json.dumps({"rates": {"cpu": 0.05, "default": 1.0}})
    backend = LocalBackend(tmp_path)
    h, early = _local_worker(backend, 1.5, ctx)
    assert early is None  # still running
    bill = backend.accounting(h)
    status = json.loads(Path(h["status_file"]).read_text())
    assert bill.wall_seconds == pytest.approx(status["finished"] - h["create_time"]) and bill.wall_seconds >= 1.5
    assert (bill.metadata["billing/source"], bill.metadata["local/unit"], bill.match) == ("process", h["unit"], ("local/unit", h["unit"]))
    assert bill.env == {"DAGSTER_GPU_STEP_CONTEXT": ctx, "DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS": "x"}  # no other variable
    assert bill.rates == {"cpu": 0.05, "default": 1.0} and bill.device_type == (None if list_gpus() else "cpu")
    assert backend.elect_bill_writer(h) is True and backend.elect_bill_writer(h) is False  # once
    assert backend.accounting(h).empty  # released: nothing left to bill here
    assert LocalBackend(tmp_path).accounting(h).empty  # another process cannot bill it


@pytest.mark.parametrize("names, device_type", [
    ([], "cpu"), (["NVIDIA H200"] * 2, "NVIDIA H200"), (["NVIDIA H200", "NVIDIA A100-SXM4-80GB"], None)])
def test_a_local_process_bill_names_this_hosts_device_type_for_a_unit_that_materialized_nothing(tmp_path, names, device_type):
    from tests.test_telemetry import FakeNvml

    nvml = FakeNvml([{"uuid": f"GPU-{i}", "name": n, "util": [0], "mem_mib": [0]} for i, n in enumerate(names)])
    backend = LocalBackend(tmp_path, nvml=nvml)
    h, _ = _local_worker(backend, 0.1, json.dumps({"rates": {"default": 1.0}}))
    assert backend.accounting(h).device_type == device_type
    assert [p.device for p in backend.policy_state().pools] == sorted(set(names))


def test_a_process_bill_is_priced_at_the_units_devices_and_split_over_its_partitions():
    """write_unit_bill on a real instance with a bill that counted no devices (local): wall seconds × the
    materializations' billing/devices; the partition the unit failed gets what the others did not measure."""
    import dagster as dg
    from dagster._core.instance_for_test import instance_for_test

    from dagster_gpu.billing.keys import what_billed
    from dagster_gpu.executor.bill_writer import write_unit_bill

    @dg.asset(partitions_def=dg.DynamicPartitionsDefinition(name="p"), backfill_policy=dg.BackfillPolicy.single_run())
    def emb(context):
        for pk, secs in (("a", 6.0), ("b", 2.0)):
            context.log_event(dg.AssetMaterialization("emb", partition=pk, metadata={
                "billing/gpu_seconds": secs, "billing/devices": 2.0, "billing/device_type": "NVIDIA H200", "local/unit": "u1"}))
        raise dg.Failure("c: its file is gone")

    with instance_for_test() as instance:
        instance.add_dynamic_partitions("p", ["a", "b", "c"])
        run = dg.materialize([emb], instance=instance, raise_on_error=False,
                             tags={"dagster/asset_partition_range_start": "a", "dagster/asset_partition_range_end": "c"})
        bill = UnitBill(gpu_seconds=0.0, rate_usd_per_gpu_hour=None, rates={"NVIDIA H200": 3.6, "default": 1.0},
                        metadata={"billing/source": "process"}, match=("local/unit", "u1"), wall_seconds=5.0, device_type="cpu")
        assert write_unit_bill(instance, run.run_id, "emb", "p", bill) == 3
        got = {r.asset_observation.partition: {k: v.value for k, v in r.asset_observation.metadata.items()}
               for r in instance.fetch_observations(dg.AssetRecordsFilter(asset_key=dg.AssetKey("emb")), limit=10).records}
    assert {k: o["bill/gpu_seconds"] for k, o in got.items()} == pytest.approx({"a": 6.0, "b": 2.0, "c": 2.0})  # 5 s x 2
    assert {o["bill/unit_gpu_seconds"] for o in got.values()} == {10.0}
    assert {o["bill/rate_usd_per_gpu_hour"] for o in got.values()} == {3.6}  # the materializations' device type
    assert "not materialized" in got["c"]["bill/note"]
    # the partition page tells the scheduler's bill from the worker's measurement, in words
    assert {o["bill/what"] for o in got.values()} == {what_billed(got["a"]["bill/source"])}
    assert got["a"]["bill/what"].startswith(f"the scheduler's bill ({got['a']['bill/source']})")
    # the bill's keys are its own: none replaces the materialization's measured billing/* on the partition page
    assert not [k for o in got.values() for k in o if k.startswith("billing/")]


def test_a_bill_is_rounded_as_the_materialization_and_a_cpu_step_is_billed_in_cpu_seconds():
    """write_unit_bill on a real instance: 4 significant digits (as the worker's metadata), unit-wide figures
    named unit; a step that asked for no GPU (the vector index, ``GpuRequest(count=0)``) in CPU-seconds."""
    import dagster as dg
    from dagster._core.instance_for_test import instance_for_test

    from dagster_gpu.worker.context import StepContext
    from dagster_gpu.executor.bill_writer import write_unit_bill
    from dagster_gpu.instance.bills import billed_share
    from dagster_gpu.policy.placement import Placement

    @dg.asset(partitions_def=dg.DynamicPartitionsDefinition(name="p"), backfill_policy=dg.BackfillPolicy.single_run())
    def idx(context) -> None:
        for pk in ("a", "b", "c"):
            context.log_event(dg.AssetMaterialization("idx", partition=pk, metadata={"local/unit": "u1"}))

    def bills(gpu_count):
        env = StepContext(backend="local", placement=Placement("local", "forced"), rates={"cpu": 0.05, "default": 1.0},
                          gpu_count=gpu_count).to_env()
        bill = UnitBill(gpu_seconds=0.0, rate_usd_per_gpu_hour=None, rates={"cpu": 0.05, "default": 1.0}, env=env,
                        metadata={"billing/source": "process", "local/unit": "u1", "local/unit_wall_seconds": 1042.0829971957237},
                        match=("local/unit", "u1"), wall_seconds=1042.0829971957237, device_type="cpu")
        with instance_for_test() as instance:
            instance.add_dynamic_partitions("p", ["a", "b", "c"])
            run = dg.materialize([idx], instance=instance, tags={"dagster/asset_partition_range_start": "a",
                                                                 "dagster/asset_partition_range_end": "c"})
            assert write_unit_bill(instance, run.run_id, "idx", "p", bill) == 3
            share = billed_share(instance, dg.AssetKey("idx"), "a", ("local/unit", "u1"))
            return share, {r.asset_observation.partition: {k: v.value for k, v in r.asset_observation.metadata.items()}
                           for r in instance.fetch_observations(dg.AssetRecordsFilter(asset_key=dg.AssetKey("idx")),
                                                                limit=10).records}

    share, cpu = bills(0)
    a = cpu["a"]
    assert a["bill/unit_cpu_seconds"] == 1042.0 and a["local/unit_wall_seconds"] == 1042.0  # 4 significant digits
    assert a["bill/cpu_seconds"] == 347.4 and a["bill/rate_usd_per_cpu_hour"] == 0.05  # 1042.08 / 3
    assert a["bill/cost_usd"] == 0.004824  # 347.36 s x 0.05 USD/h
    assert not [k for k in a if "gpu" in k]
    assert (share.gpu_seconds, share.cost_usd, share.source) == (347.4, 0.004824, "process")  # read back
    _, gpu = bills(1)
    assert gpu["a"]["bill/gpu_seconds"] == 347.4 and "bill/cpu_seconds" not in gpu["a"]


def test_a_step_that_asked_for_a_gpu_but_ran_on_the_cpu_is_billed_in_cpu_seconds():
    """An embedding asset with ``ComputeSpec(device="cpu")`` asks for a GPU (its step context's ``gpu_count`` 1)
    but its materializations say ``billing/device_type`` ``cpu``: its bill is in CPU-seconds, as the index's."""
    import dagster as dg
    from dagster._core.instance_for_test import instance_for_test

    from dagster_gpu.executor.bill_writer import ran_on_cpu, write_unit_bill
    from dagster_gpu.policy.placement import Placement
    from dagster_gpu.worker.context import StepContext

    @dg.asset(partitions_def=dg.DynamicPartitionsDefinition(name="p"), backfill_policy=dg.BackfillPolicy.single_run(),
              output_required=False)  # its own materializations only, as the embedding asset's unit logs them
    def emb(context):
        for pk in ("a", "b"):
            context.log_event(dg.AssetMaterialization("emb", partition=pk, metadata={
                "local/unit": "u1", "billing/gpu_seconds": 3.0, "billing/device_type": "cpu"}))
        yield from ()

    env = StepContext(backend="local", placement=Placement("local", "forced"), rates={"cpu": 0.05, "default": 1.0},
                      gpu_count=1).to_env()
    bill = UnitBill(gpu_seconds=0.0, rate_usd_per_gpu_hour=None, rates={"cpu": 0.05, "default": 1.0}, env=env,
                    metadata={"billing/source": "process", "local/unit": "u1"}, match=("local/unit", "u1"),
                    wall_seconds=8.0, device_type="cpu")
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("p", ["a", "b"])
        run = dg.materialize([emb], instance=instance, tags={"dagster/asset_partition_range_start": "a",
                                                             "dagster/asset_partition_range_end": "b"})
        assert write_unit_bill(instance, run.run_id, "emb", "p", bill) == 2
        got = {r.asset_observation.partition: {k: v.value for k, v in r.asset_observation.metadata.items()}
               for r in instance.fetch_observations(dg.AssetRecordsFilter(asset_key=dg.AssetKey("emb")), limit=10).records}
    assert got["a"].get("bill/cpu_seconds") == 4.0, got["a"]
    assert got["a"]["bill/unit_cpu_seconds"] == 8.0
    assert got["a"]["bill/rate_usd_per_cpu_hour"] == 0.05 and not [k for k in got["a"] if "gpu" in k]
    assert ran_on_cpu(0, "NVIDIA H200") and ran_on_cpu(1, "cpu") and not ran_on_cpu(1, "NVIDIA H200")
    assert not ran_on_cpu(1, None)
    # a scheduler's bill counts the GPUs it allocated, whatever device the worker then used (a GPU node's worker
    # falling back to the CPU is still billed its allocated GPU-seconds); a step with no GPU is CPU either way
    assert not ran_on_cpu(1, "cpu", scheduler_counted=True) and ran_on_cpu(0, "cpu", scheduler_counted=True)


@pytest.mark.parametrize("empty", [True, False])
def test_observation_writer_writes_nothing_for_an_empty_bill_or_a_bill_naming_no_step(empty):
    from dagster_gpu.executor.bill_writer import ObservationWriter

    bill = UnitBill.nothing("never ran") if empty else UnitBill(1.0, 1.0, {}, env={"TASK": "x"})
    assert ObservationWriter().write(bill) == 0


def test_unit_bills_sensor_bills_units_no_run_worker_billed(tmp_path):
    """The sensor is the sweep that comes after the last run worker gave up waiting (slurmdbd was down)."""
    import dagster as dg

    from dagster_gpu.definitions.bills_sensor import unit_bills_sensor

    backend, client = _slurm(tmp_path, "squeue_array_done.txt", "sacct_all.txt")
    batch = _batch(backend, 29, 10)  # no poll saw it end: sacct failed until the run workers had exited
    rec = _Recorder()
    sensor = unit_bills_sensor({"slurm": {}}, backends=lambda ctx: [backend], settler=lambda: Settler(write=rec))
    with dg.instance_for_test() as instance:
        first = sensor(dg.build_sensor_context(instance=instance))
        again = sensor(dg.build_sensor_context(instance=instance))
    assert first.skip_message == "units billed this tick: slurm: 10"
    assert again.skip_message == "units billed this tick: slurm: 0"  # each unit billed once
    assert sorted(int(b.env["TASK"]) for b in rec.bills) == list(range(10))
    assert (backend.spool.batch_dir(batch) / "reconciled" / "all").exists()


def test_unit_bills_sensor_builds_the_configured_remote_backends(tmp_path):
    from dagster_gpu.definitions.bills_sensor import remote_backends

    built = remote_backends({"slurm": {"spool_dir": str(tmp_path / "spool")}}, tmp_path)
    assert [b.name for b in built] == ["slurm"]  # local is on by default but bills nothing
    assert remote_backends({"local": {}}, tmp_path) == []


def test_a_bills_settings_keep_their_value_and_its_measured_figures_are_rounded():
    """observation_metadata rounds what was measured, as the materialization does, and leaves the step's settings
    (worker.metadata.SETTING_KEYS) whole: a MIG 1g.10gb slice is 1/7 of its GPU on the bill as on the claim."""
    from dagster_gpu.executor.bill_writer import observation_metadata

    md = observation_metadata({"billing/gpu_seconds": 12.345678, "gpu/device_fraction": 1 / 7,
                               "billing/rate_usd_per_gpu_hour": 1.23456789, "k8s/running_seconds": 86.41975}, cpu=False)
    assert md == {"bill/gpu_seconds": 12.35, "gpu/device_fraction": 1 / 7, "bill/rate_usd_per_gpu_hour": 1.23456789,
                  "k8s/running_seconds": 86.42}
