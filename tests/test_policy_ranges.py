"""Ranged steps (issue 8): the range's size, largest-first order and the units plan_range forms, by hand."""

import pytest

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.policy import (
    DeviceGroup, GpuRequest, KubernetesState, NoFeasiblePlacement, RuntimeModel, SlurmState, Snapshot, StepSize,
    choose_placement, decide, plan_largest_first, plan_range,
)
from dagster_gpu.policy.ranges import assign_units

A100 = "NVIDIA A100-SXM4-80GB"
# rows / 100 = seconds of work on a full A100; each partition adds 1 s inside a unit
MODEL = RuntimeModel(texts_per_second=100.0, n_history=3, per_partition_s=1.0)


def snap(slurm_free=2, k8s_free=2, slurm_est=None, throttle=None):
    s = SlurmState(pools=(DeviceGroup(A100, A100, 80.0, slurm_free, 2, 0, slurm_est),), launch_latency_s=5.0,
                   billed_overhead_s=20.0, array_throttle=throttle)
    k = KubernetesState(pools=(DeviceGroup(A100, A100, 80.0, k8s_free, 2),), launch_latency_s=10.0,
                        billed_overhead_s=30.0)
    return Snapshot(rate_card=RateCard.load(), slurm=s, kubernetes=k)


def rows(*work_s):
    return [StepSize(rows=int(w * 100)) for w in work_s]


def test_range_size_totals_and_errors():
    r = StepSize.for_range([100, StepSize(bytes=50, rows=7), None])
    assert (r.bytes, r.rows, r.n_partitions) == (None, None, 3)  # one unknown partition: no total
    assert [p.bytes for p in r.parts] == [100, 50, None]
    r2 = StepSize.for_range([StepSize(bytes=10, rows=1), StepSize(bytes=20, rows=2)])
    assert (r2.bytes, r2.rows) == (30, 3) and StepSize(bytes=5).parts == (StepSize(bytes=5),)
    # rows of a range: each partition resolved on its own (5,000 rows; 200 bytes x 0.005; typical 10,000)
    m = RuntimeModel()
    assert m.rows(StepSize.for_range([StepSize(rows=5000), 2_000_000, None])) == pytest.approx(5000 + 10000 + 10000)
    with pytest.raises(ValueError, match="at least one partition"):
        StepSize.for_range([])
    with pytest.raises(ValueError, match="item 1 has negative bytes -3"):
        StepSize.for_range([1, -3])
    with pytest.raises(ValueError, match="item 0 is str"):
        StepSize.for_range(["12"])
    with pytest.raises(ValueError, match="item 0 is itself a range"):
        StepSize.for_range([r2])


def test_largest_first_order_keeps_ties_in_range_order():
    assert plan_largest_first([10, 300, None, 300, 0]) == (2, 1, 3, 0, 4)  # None = 10,000 fallback rows
    assert plan_largest_first(StepSize.for_range(rows(1, 5, 3)), MODEL) == (1, 2, 0)


def test_one_unit_pays_one_start_up_and_each_partition_its_overhead():
    # the whole range as one unit: Slurm 20 s start-up + 3 x 1 s + (10 + 20 + 30) s of work
    p = decide(GpuRequest(), StepSize.for_range(rows(10, 20, 30)), snap(), model=MODEL)
    s = p.alternatives[0]
    assert p.backend == "slurm" and s.runtime_s == pytest.approx(83.0)
    assert s.cost_usd == pytest.approx(1.2 * 83 / 3600)
    assert choose_placement(GpuRequest(), [1000, 2000, 3000], snap(), history=MODEL).chosen.runtime_s == \
        pytest.approx(20 + 3 * 1 + 6000 * MODEL.rows_per_byte / 100)


def test_plan_range_by_hand_batch():
    # LPT order: 200 s, 120 s, 50 s, 10 s. The first two open Slurm's two units (capacity 2); then each
    # joins the least-loaded Slurm unit (cheaper than a new Kubernetes unit): u1 = 120 + 50 + 10.
    plan = plan_range(GpuRequest(), rows(10, 200, 50, 120), snap(), model=MODEL)
    assert plan.order == (1, 3, 2, 0)
    assert [(u.backend, u.partitions) for u in plan.units] == [("slurm", (1,)), ("slurm", (3, 2, 0))]
    u0, u1 = plan.units
    assert u0.runtime_s == pytest.approx(20 + 1 + 200) and u1.runtime_s == pytest.approx(20 + 3 + 180)
    assert plan.finish_s == pytest.approx((5 + 203, 5 + 221, 5 + 20 + 2 + 170, 5 + 20 + 1 + 120))
    assert plan.cost_usd == pytest.approx(1.2 * (221 + 203) / 3600) and plan.deadline_met
    assert "unit 1 of a ranged step" in u1.placement.reason and "[3, 2, 0]" in u1.placement.reason
    assert plan.unit_of(0) == 1


def test_plan_range_spills_to_the_dearer_backend_only_for_the_deadline():
    # due in 200 s: the 200 s partition cannot make it anywhere (Slurm 226, Kubernetes 241): earliest
    # finish wins. The 10 s one would end at 208 s in Slurm unit 1; a new Kubernetes unit ends at 51 s.
    plan = plan_range(GpuRequest(deadline_s=200), rows(10, 200, 50, 120), snap(), model=MODEL)
    assert [(u.backend, u.partitions) for u in plan.units] == [("slurm", (1,)), ("slurm", (3, 2)),
                                                               ("kubernetes", (0,))]
    assert plan.misses == (1,) and not plan.deadline_met
    assert plan.finish_s[0] == pytest.approx(10 + 30 + 1 + 10)
    k = next(a for a in plan.units[2].placement.alternatives if a.backend == "slurm")
    assert "joins planned unit 1" in k.note and k.finish_s == pytest.approx(5 + 20 + 3 + 180)


def test_submission_order_does_not_matter():
    asc = plan_range(GpuRequest(deadline_s=2700), rows(60, 120, 240, 300, 600, 1200, 1800, 2400), snap(), model=MODEL)
    desc = plan_range(GpuRequest(deadline_s=2700), rows(2400, 1800, 1200, 600, 300, 240, 120, 60), snap(), model=MODEL)
    assert asc.cost_usd == pytest.approx(desc.cost_usd)
    assert [(u.backend, sorted(7 - i for i in u.partitions)) for u in asc.units] == \
        [(u.backend, sorted(u.partitions)) for u in desc.units]
    assert asc.deadline_met


def test_waiting_units_start_at_the_plans_own_releases():
    # Slurm: one device frees in 100 s (controller's estimate), the other busy; throttle leaves room for
    # two units. Unit 0 waits 100 s; unit 1's start is unknown to the snapshot once unit 0 took that
    # estimate, so it starts when unit 0 ends (5 + 100 + 20 + 1 + 300 = 426 s), not after a queue estimate.
    s = snap(slurm_free=0, slurm_est=100.0)
    plan = plan_range(GpuRequest(backend="slurm"), rows(300, 200), s, model=MODEL)
    u0, u1 = plan.units
    assert u0.start_delay_s == pytest.approx(105.0) and u1.start_delay_s == pytest.approx(426.0)
    chosen = next(a for a in u1.placement.alternatives if a.backend == "slurm")
    assert chosen.note.startswith("starts when the plan's own unit there ends at 426 s")


def test_throttle_caps_units_and_force_and_infeasible():
    plan = plan_range(GpuRequest(), rows(30, 20, 10), snap(throttle=1), model=MODEL)
    assert [(u.backend, u.partitions) for u in plan.units] == [("slurm", (0, 1, 2))]  # %1: one unit
    forced = plan_range(GpuRequest(), rows(30, 20), snap(), model=MODEL, force="kubernetes")
    assert {u.backend for u in forced.units} == {"kubernetes"}
    with pytest.raises(NoFeasiblePlacement, match="partition 0 of the range"):
        plan_range(GpuRequest(memory_gib=100), rows(30), snap(), model=MODEL)


def test_assign_units_is_plan_ranges_rule():
    # the same pools as plan_range chose give the same units (the simulator forms units this way)
    plan = plan_range(GpuRequest(deadline_s=200), rows(10, 200, 50, 120), snap(), model=MODEL)
    key_of = {i: (u.backend, u.device) for u in plan.units for i in u.partitions}
    load = {i: 1 + w for i, w in enumerate((10, 200, 50, 120))}
    got = assign_units(plan.order, key_of, load, {("slurm", A100): 2, ("kubernetes", A100): 2})
    assert [m for _k, m in got] == [list(u.partitions) for u in plan.units]
