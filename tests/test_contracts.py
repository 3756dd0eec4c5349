"""The backend contract (dagster_gpu.contracts): importable without Dagster, and its values."""

from __future__ import annotations

import subprocess
import sys

from dagster_gpu.contracts import Backend, StepLaunch, UnitBill, WorkerState, WorkerStatus, describe_partitions
from dagster_gpu.executor.bill_writer import unit_rate
from dagster_gpu.policy.placement import Placement
from dagster_gpu.core.request import GpuRequest


def test_importing_the_contract_imports_no_dagster():
    code = "import dagster_gpu.contracts, sys; assert 'dagster' not in sys.modules, sorted(m for m in sys.modules if m.startswith('dagster'))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_describe_partitions_names_one_a_range_or_none():
    assert describe_partitions(("p003",)) == "partition 'p003'"
    assert describe_partitions(("p001", "p002", "p003")) == "3 partitions 'p001'…'p003'"
    assert describe_partitions(()) == "unpartitioned run"
    assert describe_partitions(["b", "a"]) == "2 partitions 'b'…'a'"  # the order given: a range's own order
    assert describe_partitions(("doc 1's.txt",)) == "partition \"doc 1's.txt\""  # repr: unambiguous quoting


def test_a_launch_carries_every_key_of_its_range():
    launch = StepLaunch(run_id="r", step_key="s", partition_keys=("p001", "p002", "p003"), attempt=0, argv=("python",),
                        env={}, request=GpuRequest(), placement=Placement(backend="local", reason="test"))
    assert launch.partition_keys == ("p001", "p002", "p003") and not hasattr(launch, "partition_key")


class _Minimal(Backend):
    name = "minimal"

    def launch(self, launch):
        return {"id": 1}

    def state(self, handle):
        return WorkerState(WorkerStatus.SUCCEEDED, exit_code=0)

    def terminate(self, handle):
        pass


def test_backend_defaults_bill_nothing_and_release_to_the_caller():
    b = _Minimal()
    bill = b.accounting({"id": 1})
    assert bill.empty and bill.metadata == {} and bill.note == "the minimal backend has no scheduler accounting"
    assert b.elect_bill_writer({"id": 1}) is True and list(b.unsettled()) == [] and b.handle_metadata({"id": 1}) == {"id": 1}


def test_unit_rate_is_the_bills_own_rate_else_its_rate_table():
    fixed = UnitBill(gpu_seconds=3.0, rate_usd_per_gpu_hour=3.6, metadata={})
    assert unit_rate(fixed, "mig-1g.10gb") == 3.6
    table = UnitBill(gpu_seconds=3.0, rate_usd_per_gpu_hour=None, metadata={}, rates={"default": 2.0, "cpu": 0.1})
    assert unit_rate(table, "cpu") == 0.1 and unit_rate(table, None) == 2.0
    assert unit_rate(UnitBill(1.0, None, {}, rates={"cpu": 0.1}), "gpu") == 0.0  # no rate, no default: billed at 0


def test_step_context_is_read_and_patched_through_one_json_form():
    from dagster_gpu.contracts import STEP_CONTEXT_ENV, read_step_context, with_step_context
    from dagster_gpu.policy.placement import Placement
    from dagster_gpu.worker.context import StepContext

    ctx = StepContext(backend="slurm", placement=Placement(backend="slurm", reason="test"), rates={"a100": 2.5},
                      gpu_count=2, extra={"partitions_def": "corpus"})
    env = {"OTHER": "x", **ctx.to_env()}
    patched = with_step_context(env, device_fraction=0.25, slurm_request={"gres": "--gres=gpu:2", "gpus": 0.5})
    assert env[STEP_CONTEXT_ENV] == ctx.to_env()[STEP_CONTEXT_ENV]  # the input is not changed
    raw = read_step_context(patched)
    assert (raw["gpu_count"], raw["device_fraction"], raw["slurm_request"]["gpus"], raw["extra"]) == (
        2, 0.25, 0.5, {"partitions_def": "corpus"})
    back = StepContext.from_env(patched)  # the worker reads what a backend patched
    assert (back.backend, back.gpu_count, back.device_fraction, dict(back.rates)) == ("slurm", 2, 0.25, {"a100": 2.5})
    # an environment without a step context (a step run in process) stays without one
    assert with_step_context({"OTHER": "x"}, device_fraction=0.5) == {"OTHER": "x"}
    assert read_step_context({}) == {}
