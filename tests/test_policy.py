"""The cost policy's choices on hand-built snapshots: one test per rule of dagster_gpu.policy.policy, real values."""

import json
import math

import pytest

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.policy import (
    DeviceGroup, GpuRequest, KubernetesState, LocalState, NoFeasiblePlacement, Placement, RuntimeModel,
    SlurmState, Snapshot, StepSize, choose_placement, decide,
)

A100 = "NVIDIA A100-SXM4-80GB"
MODEL = RuntimeModel(texts_per_second=2000.0, n_history=3)  # 432,000 rows -> 216 s on a full A100
SIZE = StepSize(rows=432_000)


def pool(free=1, total=None, pending=0, est=None, device=A100, mem=80.0, profile=None):
    return DeviceGroup(device, A100, mem, free, total if total is not None else max(free, 1), pending, est, profile)


def snap(slurm=None, k8s=None, local=None, rc=None):
    return Snapshot(rate_card=rc or RateCard.load(), slurm=slurm, kubernetes=k8s, local=local)


def S(*pools, **kw):
    return SlurmState(pools=pools, launch_latency_s=5.0, billed_overhead_s=20.0, **kw)


def K(*pools, **kw):
    return KubernetesState(pools=pools, launch_latency_s=10.0, billed_overhead_s=30.0, **kw)


def test_least_cost_among_those_meeting_the_deadline():
    p = decide(GpuRequest(deadline_s=600), SIZE, snap(S(pool(2, 10)), K(pool(1, 4))), model=MODEL)
    assert (p.backend, p.device) == ("slurm", A100)
    s, k = p.alternatives
    # Slurm: 1.20 USD/GPU-h x (20 + 216) s; Kubernetes: 2.40 x (30 + 216) s
    assert s.cost_usd == pytest.approx(1.2 * 236 / 3600) and s.start_delay_s == 5.0 and s.runtime_s == 236.0
    assert k.cost_usd == pytest.approx(2.4 * 246 / 3600) and k.finish_s == 256.0
    assert p.deadline_met and s.meets_deadline and k.meets_deadline
    assert p.chosen == s


def test_step_of_unknown_size_is_priced_with_the_fallback_rows():
    # no corpus file: 10,000 rows at 2,000 texts/s = 5 s; Slurm 1.20 x (20 + 5) s, Kubernetes 2.40 x (30 + 5) s
    p = decide(GpuRequest(), StepSize(), snap(S(pool(2, 10)), K(pool(1, 4))), model=RuntimeModel())
    s, k = p.alternatives
    assert p.backend == "slurm" and s.runtime_s == pytest.approx(25.0) and k.runtime_s == pytest.approx(35.0)
    assert s.cost_usd == pytest.approx(1.2 * 25 / 3600) and k.cost_usd == pytest.approx(2.4 * 35 / 3600)


def test_deadline_excludes_the_cheaper_queued_backend():
    # Slurm busy: the controller says a GPU frees in 3,600 s -> finish 3,841 s > 600 s
    p = decide(GpuRequest(deadline_s=600), SIZE, snap(S(pool(0, 10, est=3600.0)), K(pool(1, 4))), model=MODEL)
    assert p.backend == "kubernetes" and p.deadline_met
    s = p.alternatives[0]
    assert s.start_delay_s == 3605.0 and s.finish_s == 3841.0 and s.meets_deadline is False
    # batch: the same snapshot goes to the cheaper, later Slurm
    assert decide(GpuRequest(), SIZE, snap(S(pool(0, 10, est=3600.0)), K(pool(1, 4))), model=MODEL).backend == "slurm"


def test_cost_tie_goes_to_earliest_finish():
    rc = RateCard.from_dict({"backends": {"slurm": {"default": 2.0}, "kubernetes": {"default": 2.0}}})
    # same rate and same billed time: Kubernetes starts after 10 s, Slurm after 5 s + 100 s queue
    p = decide(GpuRequest(), SIZE, snap(SlurmState(pools=(pool(0, 1, est=100.0),), launch_latency_s=5.0,
                                                   billed_overhead_s=30.0), K(pool(1)), rc=rc), model=MODEL)
    assert p.backend == "kubernetes" and "tie: earliest finish" in p.reason
    a, b = p.alternatives
    assert a.cost_usd == pytest.approx(b.cost_usd) and a.finish_s == 351.0 and b.finish_s == 256.0


def test_infeasible_device_is_never_chosen_even_if_cheapest():
    mig = pool(7, 7, device="mig-1g.10gb", mem=10.0, profile="1g.10gb")
    req = GpuRequest(memory_gib=40.0, mig_ok=True)
    p = decide(req, SIZE, snap(S(pool(0, 2, est=7200.0)), K(mig, pool(1))), model=MODEL)
    assert (p.backend, p.device) == ("slurm", A100)  # still cheaper than a full Kubernetes A100
    bad = [a for a in p.alternatives if not a.feasible]
    assert [(a.device, a.note) for a in bad] == [("mig-1g.10gb", "10 GiB < 40 GiB requested")]
    assert bad[0].cost_usd is None


def test_mig_not_acceptable_without_tag():
    mig = pool(7, 7, device="mig-1g.10gb", mem=10.0, profile="1g.10gb")
    p = decide(GpuRequest(memory_gib=2.0), SIZE, snap(None, K(mig, pool(1))), model=MODEL)
    assert p.device == A100
    assert "dagster-gpu/mig-ok is false" in p.alternatives[0].note


def test_mig_slice_speed_and_price_follow_history_utilization():
    # u = 0.25: a 1g slice (1/7) runs at (1/7)/0.25 = 4/7 speed -> 216 * 7/4 = 378 s; price 2.40/7
    model = RuntimeModel(texts_per_second=2000.0, gpu_busy=0.25, n_history=3)
    mig = pool(7, 7, device="mig-1g.10gb", mem=10.0, profile="1g.10gb")
    p = decide(GpuRequest(memory_gib=2.0, mig_ok=True), SIZE, snap(S(pool(1)), K(mig)), model=model)
    assert p.device == "mig-1g.10gb" and p.product == A100
    m = p.chosen
    assert m.runtime_s == pytest.approx(30 + 378.0)
    assert m.cost_usd == pytest.approx(2.4 / 7 * 408 / 3600)
    assert m.device_fraction == pytest.approx(1 / 7)


def test_unreachable_backend_skipped_with_reason():
    p = decide(GpuRequest(), SIZE, snap(SlurmState(reachable=False, reason="sinfo: Connection refused"), K(pool(1))),
               model=MODEL)
    assert p.backend == "kubernetes"
    s = p.alternatives[0]
    assert s.backend == "slurm" and not s.feasible and s.note == "unreachable: sinfo: Connection refused"
    assert "Connection refused" in p.reason


def test_announced_outage_delays_instead_of_skipping():
    st = SlurmState(reachable=False, reason="MAINT reservation", back_in_s=1000.0, pools=(pool(2, 2),),
                    launch_latency_s=5.0, billed_overhead_s=20.0)
    p = decide(GpuRequest(), SIZE, snap(st, K(pool(1))), model=MODEL)
    assert p.backend == "slurm" and p.chosen.start_delay_s == 1005.0
    q = decide(GpuRequest(deadline_s=900), SIZE, snap(st, K(pool(1))), model=MODEL)
    assert q.backend == "kubernetes"


def test_no_placement_meets_deadline_earliest_finish_wins_and_miss_recorded():
    p = decide(GpuRequest(deadline_s=100), SIZE, snap(S(pool(1)), K(pool(1))), model=MODEL)
    assert p.backend == "slurm" and p.deadline_met is False and "DEADLINE MISS" in p.reason
    assert p.chosen.finish_s == 241.0
    assert all(a.meets_deadline is False for a in p.alternatives)
    assert p.to_json()["deadline_met"] is False


def test_backend_forced_by_tag_and_by_config():
    sn = snap(S(pool(1)), K(pool(1)))
    req = GpuRequest.from_tags({"dagster-gpu/backend": "kubernetes"})
    p = decide(req, SIZE, sn, model=MODEL)
    assert p.backend == "kubernetes" and "forced by tag dagster-gpu/backend=kubernetes" in p.reason
    assert len(p.alternatives) == 2  # the cheaper Slurm is still recorded
    assert decide(GpuRequest(), SIZE, sn, model=MODEL, force="kubernetes").backend == "kubernetes"
    # the tag wins over the executor config
    assert decide(GpuRequest(backend="slurm"), SIZE, sn, model=MODEL, force="kubernetes").backend == "slurm"


def test_forced_backend_that_cannot_run_raises():
    sn = snap(SlurmState(reachable=False, reason="down"), K(pool(1)))
    with pytest.raises(NoFeasiblePlacement, match="forced backend 'slurm'.*unreachable: down"):
        decide(GpuRequest(backend="slurm"), SIZE, sn, model=MODEL)


def test_nothing_feasible_raises_with_every_reason():
    sn = snap(S(pool(1, mem=40.0)), K(pool(1, mem=40.0)))
    with pytest.raises(NoFeasiblePlacement) as e:
        decide(GpuRequest(memory_gib=80.0), SIZE, sn, model=MODEL)
    assert len(e.value.alternatives) == 2 and all(not a.feasible for a in e.value.alternatives)


def test_local_cpu_candidate_for_cpu_steps():
    # count=0: CPU on each backend; local CPU 0.05 USD/h with a 20x slowdown: 10 + 216*20 = 4330 s
    local = LocalState(pools=(), launch_latency_s=1.0, billed_overhead_s=10.0)
    p = decide(GpuRequest(count=0), SIZE, snap(S(pool(1)), None, local), model=MODEL)
    assert (p.backend, p.device) == ("local", "cpu")
    assert p.chosen.runtime_s == 4330.0 and p.chosen.cost_usd == pytest.approx(0.05 * 4330 / 3600)
    # a GPU request on a CPU-only host is infeasible there
    q = decide(GpuRequest(), SIZE, snap(S(pool(1)), None, local), model=MODEL)
    assert q.backend == "slurm" and q.alternatives[0].note == "no GPU devices"


def test_a_gpu_step_forced_onto_a_host_without_gpus_is_planned_on_its_cpu_as_the_executor_runs_it():
    """Found by a new-user run: whatif said "no feasible placement: local: no GPU devices" for the local-only
    setup that then ran fine (the worker's device ``auto`` runs on the CPU)."""
    local = LocalState(pools=(), launch_latency_s=1.0, billed_overhead_s=10.0)
    p = decide(GpuRequest(), SIZE, snap(None, None, local), model=MODEL, force="local")
    assert (p.backend, p.device, p.deadline_met) == ("local", "cpu", True)
    assert p.chosen.runtime_s == 4330.0 and p.chosen.cost_usd == pytest.approx(0.05 * 4330 / 3600)
    assert p.chosen.note.startswith("no GPU devices on this host: the worker runs on CPU (device auto); CPU")
    assert p.reason.endswith("forced by gpu_executor config backend: local")
    # not forced: the policy never sends a GPU request to a CPU
    with pytest.raises(NoFeasiblePlacement, match="local: no GPU devices"):
        decide(GpuRequest(), SIZE, snap(None, None, local), model=MODEL)
    # forced, and past its deadline on the CPU: chosen (forced), the miss recorded
    late = decide(GpuRequest(deadline_s=60.0), SIZE, snap(S(pool(1)), None, local), model=MODEL, force="local")
    assert (late.backend, late.device, late.deadline_met) == ("local", "cpu", False)


def test_local_gpu_host_chosen_when_cheapest():
    local = LocalState(pools=(pool(1),), launch_latency_s=1.0, billed_overhead_s=10.0)
    p = decide(GpuRequest(), SIZE, snap(S(pool(1)), K(pool(1)), local), model=MODEL)
    assert p.backend == "local" and p.chosen.cost_usd == pytest.approx(1.0 * 226 / 3600)


def test_slurm_throttle_and_queue_fallback():
    # 10 idle GPUs but the %2 throttle is full: no controller estimate -> one wave of this step's runtime
    st = S(pool(10, 10), array_throttle=2, running_tasks=2)
    a = decide(GpuRequest(), SIZE, snap(st), model=MODEL).chosen
    assert a.start_delay_s == 5.0 + 236.0 and "queue estimate" in a.note
    # 25 of ours pending on 10 busy GPUs: ceil((1 + 25) / 10) = 3 waves
    b = decide(GpuRequest(), SIZE, snap(S(pool(0, 10, pending=25))), model=MODEL).chosen
    assert b.start_delay_s == 5.0 + 3 * 236.0


def test_slurm_time_limit_and_preemption_rework():
    st = S(pool(1), time_limit_s=200.0)
    with pytest.raises(NoFeasiblePlacement, match="exceeds the time limit 200 s"):
        decide(GpuRequest(), SIZE, snap(st), model=MODEL)
    # 1 preemption per GPU-hour over the unit's 236 s (start-up + work, one GPU), each costing a new start-up
    # and half the partition (no checkpoints): rework = 1 * (236/3600) * (20 + 108) = 8.391 s
    a = decide(GpuRequest(), SIZE, snap(S(pool(1), preemptions_per_gpu_hour=1.0)), model=MODEL).chosen
    assert a.runtime_s == pytest.approx(236 + 236 / 3600 * 128)


def test_deterministic_json_round_trip_and_finite():
    sn = snap(S(pool(0, 4, pending=3)), K(pool(1), pool(2, 2, device="mig-3g.40gb", mem=40.0, profile="3g.40gb")))
    req = GpuRequest(mig_ok=True, deadline_s=900)
    p1 = decide(req, SIZE, sn, model=MODEL)
    p2 = decide(req, SIZE, sn, model=MODEL)
    assert p1 == p2
    d = json.loads(json.dumps(p1.to_json()))
    assert Placement.from_json(d) == p1
    for a in d["alternatives"]:
        for k in ("start_delay_s", "runtime_s", "cost_usd", "finish_s"):
            assert a[k] is None or math.isfinite(a[k])


def test_choose_placement_adapter_uses_history_and_bytes():
    from dagster_gpu.policy import HistoryPoint

    hist = [HistoryPoint(rows=1000, texts_per_second=500.0, bytes=100_000)]
    p = choose_placement(GpuRequest(), 1_000_000, snap(S(pool(1))), history=hist)
    # 1 MB at 0.01 rows/byte = 10,000 rows at 500 texts/s = 20 s work + 20 s start
    assert p.chosen.runtime_s == pytest.approx(40.0)


def test_decision_over_many_pools_is_the_least_cost_and_repeatable():
    """Seven pools (Slurm with 500 pending, three MIG profiles, whole GPUs, local): the cheapest feasible one,
    the same on every call (decision latency is a benchmark: bench/policy_latency.py)."""
    sn = snap(S(pool(0, 10, pending=500), array_throttle=10, running_tasks=10),
              K(*[pool(3, 8, device=f"mig-{g}g.{g * 10}gb", mem=g * 10.0, profile=f"{g}g.{g * 10}gb") for g in (1, 2, 3)],
                pool(2, 8)), LocalState(pools=(pool(0),)))
    req = GpuRequest(mig_ok=True, memory_gib=2.0, deadline_s=3600)
    first = decide(req, SIZE, sn, model=MODEL)
    costs = {(a.backend, a.device): a.cost_usd for a in first.alternatives}
    assert first.backend == "local"
    assert min(costs.values()) == costs[("local", first.device)]
    assert costs[("slurm", first.device)] > costs[("local", first.device)]
    assert len(costs) == 6 and all(a.feasible for a in first.alternatives)
    for _ in range(20):
        again = decide(req, SIZE, sn, model=MODEL)
        assert (again.backend, again.device, again.reason) == (first.backend, first.device, first.reason)


def test_memory_is_judged_as_marketed_on_published_totals():
    """Kubernetes pools carry the driver's published memory (an "80GB" H100: NVML's 81559Mi = 79.65 GiB,
    a 1g.10gb slice 9728Mi = 9.5 GiB; NVIDIA/k8s-dra-driver-gpu v25.12.0 deviceinfo.go): memory_gib 80 and 10
    accept them (dagster_gpu.core.device_memory), 94 does not accept the H100."""
    h100 = DeviceGroup("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", 79.65, 1, 1)
    mig = DeviceGroup("mig-1g.10gb", A100, 9.5, 7, 7, mig_profile="1g.10gb")
    p = decide(GpuRequest(memory_gib=80), SIZE, snap(k8s=K(h100)), model=MODEL)
    assert (p.backend, p.device) == ("kubernetes", "NVIDIA H100 80GB HBM3")
    p = decide(GpuRequest(memory_gib=10, mig_ok=True), SIZE, snap(k8s=K(mig)), model=MODEL)
    assert p.device == "mig-1g.10gb"
    with pytest.raises(NoFeasiblePlacement):
        decide(GpuRequest(memory_gib=94), SIZE, snap(k8s=K(h100)), model=MODEL)
