"""Preemption in the cost policy: the learned rate, the rework with and without checkpoints, a placement that
flips to a stable pool when the preemptible one is preempted often. Pure; real values."""

import json

import pytest

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.policy import (
    DeviceGroup, GpuRequest, KubernetesState, Placement, RuntimeModel, SlurmState, Snapshot, StepSize, decide,
    plan_range,
)
from dagster_gpu.policy.preemption import (
    PRIOR_GPU_HOURS, PreemptionObservation, estimate_rate, estimate_rates, expected_rework, lost_work_s, pool_key,
    with_rates,
)

A100 = "NVIDIA A100-SXM4-80GB"
MODEL = RuntimeModel(texts_per_second=2000.0, n_history=3)  # 432,000 rows -> 216 s on a full A100
SIZE = StepSize(rows=432_000)
POOL = "slurm:gpu/preemptible"


def pool(free=1):
    return DeviceGroup(A100, A100, 80.0, free, max(free, 1))


def snap(rate=0.0, learned=False, k8s=True):
    return Snapshot(
        rate_card=RateCard.load(),  # slurm A100 1.20 USD/GPU-h, kubernetes 2.40
        slurm=SlurmState(pools=(pool(),), launch_latency_s=5.0, billed_overhead_s=20.0, preemptions_per_gpu_hour=rate,
                         preemption_pool=POOL, preemption_learned=learned),
        kubernetes=KubernetesState(pools=(pool(),), launch_latency_s=10.0, billed_overhead_s=30.0) if k8s else None,
    )


# -- the rate -------------------------------------------------------------------------------------------------------

def test_no_observation_is_the_prior():
    r = estimate_rate([], prior_per_gpu_hour=0.2)
    assert r.per_gpu_hour == 0.2 and not r.learned and (r.preemptions, r.gpu_hours) == (0, 0.0)
    assert r.source == "prior 0.2/GPU-h (no observations)"


def test_few_observations_lean_on_the_prior():
    # prior 0.2/GPU-h weighing 10 GPU-h (2 pseudo preemptions); 1 preemption in 2 GPU-h: (2 + 1) / (10 + 2)
    obs = [PreemptionObservation(POOL, 1, 1.5), PreemptionObservation(POOL, 0, 0.5)]
    r = estimate_rate(obs, prior_per_gpu_hour=0.2)
    assert PRIOR_GPU_HOURS == 10.0
    assert r.per_gpu_hour == pytest.approx(3 / 12) and r.learned and (r.preemptions, r.gpu_hours) == (1, 2.0)
    assert r.source == "learned: 1 preemption(s) in 2.00 GPU-h, with prior 0.2/GPU-h weighing 10 GPU-h"


def test_many_observations_approach_the_observed_rate():
    obs = [PreemptionObservation(POOL, 1, 2.0)] * 50  # 50 preemptions in 100 GPU-h: 0.5 observed
    r = estimate_rate(obs, prior_per_gpu_hour=0.2)
    assert r.per_gpu_hour == pytest.approx((2 + 50) / 110)  # 0.4727
    assert estimate_rate(obs, 0.2, prior_gpu_hours=0.0).per_gpu_hour == pytest.approx(0.5)
    # a unit whose bill has no GPU-hours teaches nothing
    assert estimate_rate([PreemptionObservation(POOL, 3, 0.0)], 0.2).per_gpu_hour == 0.2


def test_rates_per_pool_and_bad_input():
    k8s = pool_key("kubernetes", priority_class="batch-low")
    assert (k8s, pool_key("slurm", slurm_partition="gpu"), pool_key("local")) == (
        "kubernetes:batch-low", "slurm:gpu/-", "local")
    rates = estimate_rates([PreemptionObservation(k8s, 4, 10.0)], {POOL: 0.1, k8s: 0.0})
    assert rates[POOL].per_gpu_hour == pytest.approx(0.1) and not rates[POOL].learned
    assert rates[k8s].per_gpu_hour == pytest.approx(4 / 20)
    with pytest.raises(ValueError, match="prior preemptions per GPU-hour"):
        estimate_rate([], prior_per_gpu_hour=-1.0)
    with pytest.raises(ValueError, match="negative preemption count"):
        estimate_rate([PreemptionObservation(POOL, -1, 1.0)])
    with pytest.raises(ValueError, match="unknown backend"):
        pool_key("nomad")


def test_with_rates_blends_each_named_pool_with_its_prior():
    sn = with_rates(snap(rate=0.2), [PreemptionObservation(POOL, 8, 10.0), PreemptionObservation("other", 9, 1.0)])
    st = sn.slurm
    assert st.preemptions_per_gpu_hour == pytest.approx((2 + 8) / 20) and st.preemption_learned
    assert st.preemption_source.startswith("learned: 8 preemption(s) in 10.00 GPU-h")
    assert sn.kubernetes.preemptions_per_gpu_hour == 0.0 and not sn.kubernetes.preemption_learned  # no pool name


# -- the rework -----------------------------------------------------------------------------------------------------

def test_lost_work_with_and_without_checkpoints():
    assert lost_work_s([1000.0]) == 500.0  # half the partition in flight
    # 1000 s cut into 16 checkpoint intervals of 60 s and one of 40 s: (16 * 60^2 + 40^2) / (2 * 1000)
    assert lost_work_s([1000.0], checkpoint_s=60.0) == pytest.approx(29.6)
    # three partitions, no checkpoints: a preemption more likely hits the long one (length-biased)
    assert lost_work_s([100.0, 50.0, 30.0]) == pytest.approx((100**2 + 50**2 + 30**2) / 360)
    assert lost_work_s([100.0, 50.0, 30.0], checkpoint_s=1000.0) == lost_work_s([100.0, 50.0, 30.0])
    assert lost_work_s([]) == 0.0
    with pytest.raises(ValueError):
        lost_work_s([-1.0])


def test_expected_rework_is_preemptions_times_start_up_plus_lost_work():
    # 2 per GPU-hour over 0.5 GPU-h: 1 preemption, a 30 s start-up and half a 60 s checkpoint interval
    r = expected_rework(2.0, 0.5, 30.0, [3600.0], checkpoint_s=60.0)
    assert (r.expected_preemptions, r.lost_s, r.seconds) == (1.0, 30.0, 60.0)
    # without checkpoints the same preemption loses half the file (the old work/2 rule)
    assert expected_rework(2.0, 0.5, 30.0, [3600.0]).seconds == 1830.0
    assert expected_rework(0.0, 0.5, 30.0, [3600.0]).seconds == 0.0


def test_decide_prices_the_rework_with_checkpoints_in_the_runtime_and_cost():
    # 1 per GPU-h; unit 236 s on one GPU = 0.06556 GPU-h. No checkpoints: each preemption 20 s + 108 s lost.
    a = decide(GpuRequest(), SIZE, snap(rate=1.0, k8s=False), model=MODEL).chosen
    k = 236 / 3600
    assert a.expected_preemptions == pytest.approx(k) and a.preemption_rework_s == pytest.approx(k * 128)
    assert a.runtime_s == pytest.approx(236 + k * 128)
    assert a.expected_preemption_cost_usd == pytest.approx(1.2 * k * 128 / 3600)
    assert a.cost_usd == pytest.approx(1.2 * (236 + k * 128) / 3600)
    # checkpoints every 2,000 records = 1 s of embedding: each preemption loses 0.5 s, not 108 s
    ck = decide(GpuRequest(), SIZE, snap(rate=1.0, k8s=False),
                model=RuntimeModel(texts_per_second=2000.0, n_history=3, checkpoint_records=2000)).chosen
    assert ck.preemption_rework_s == pytest.approx(k * 20.5) and ck.runtime_s == pytest.approx(236 + k * 20.5)


def test_a_cheap_pool_preempted_often_loses_to_a_dearer_stable_one():
    stable = decide(GpuRequest(), SIZE, snap(rate=0.0), model=MODEL)
    assert stable.backend == "slurm" and stable.expected_preemption_cost_usd is None
    # 40 preemptions per GPU-h: 2.62 expected over the unit, each 128 s: Slurm 1.2 x 571.6 s > Kubernetes 2.4 x 246 s
    p = decide(GpuRequest(), SIZE, snap(rate=40.0, learned=True), model=MODEL)
    s, kube = p.alternatives
    assert p.backend == "kubernetes"
    assert s.cost_usd == pytest.approx(1.2 * (236 + 40 * 236 / 3600 * 128) / 3600)  # 0.1905
    assert kube.cost_usd == pytest.approx(2.4 * 246 / 3600) and kube.expected_preemption_cost_usd is None
    assert "40/GPU-h learned" in s.note
    # with checkpoints the same rate costs little: Slurm stays the cheaper choice
    ck = decide(GpuRequest(), SIZE, snap(rate=40.0, learned=True),
                model=RuntimeModel(texts_per_second=2000.0, n_history=3, checkpoint_records=2000))
    assert ck.backend == "slurm"
    assert ck.expected_preemption_cost_usd == pytest.approx(1.2 * 40 * 236 / 3600 * 20.5 / 3600)
    assert (ck.preemptions_per_gpu_hour, ck.preemption_rate_learned) == (40.0, True)
    assert "expected preemption cost 0.0179 USD (2.622 preemption(s) at 40/GPU-h, learned" in ck.reason


def test_placement_json_carries_the_preemption_figures():
    p = decide(GpuRequest(), SIZE, snap(rate=1.0, k8s=False), model=MODEL)
    d = json.loads(json.dumps(p.to_json()))
    assert d["expected_preemption_cost_usd"] == pytest.approx(p.expected_preemption_cost_usd)
    assert (d["preemptions_per_gpu_hour"], d["preemption_rate_learned"]) == (1.0, False)
    assert Placement.from_json(d) == p


def test_ranged_units_carry_their_preemption_cost():
    # two partitions of 216 s on one Slurm GPU: one unit, 0.1256 GPU-h at 1 per GPU-h, each preemption
    # 20 s + lost (216^2 * 2) / (2 * 432) = 108 s
    rp = plan_range(GpuRequest(), [StepSize(rows=432_000)] * 2, snap(rate=1.0, k8s=False), model=MODEL)
    (u,) = rp.units
    k = (20 + 432) / 3600
    assert u.runtime_s == pytest.approx(452 + k * 128)
    assert u.expected_preemption_cost_usd == pytest.approx(1.2 * k * 128 / 3600)
    assert u.cost_usd == pytest.approx(1.2 * u.runtime_s / 3600)
