"""Simulator figures on small workloads worked out by hand (times in s, rates from resources/ratecard.yaml)."""

import pytest

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.policy.runtime import RuntimeModel
from dagster_gpu.core.request import GpuRequest
from dagster_gpu.sim.engine import Simulation, simulate
from dagster_gpu.sim.metrics import figures, timeline
from dagster_gpu.sim.model import (
    A100, BackgroundJob, ClusterSpec, Preemption, Resident, Scenario, Task, full_gpus, mig_slices,
)
from dagster_gpu.sim.policies import AlwaysBackend, Fixed, Ours, ResidentPods

RC = RateCard.load()
MODEL = RuntimeModel(texts_per_second=100.0, n_history=1)  # rows / 100 = seconds of work on a full GPU


def slurm(n=1, **kw):
    return ClusterSpec("slurm", (full_gpus(n),), launch_latency_s=5.0, billed_overhead_s=20.0, **kw)


def k8s(n=1, mig=0, **kw):
    units = ((full_gpus(n),) if n else ()) + ((mig_slices(mig),) if mig else ())
    return ClusterSpec("kubernetes", units, launch_latency_s=10.0, billed_overhead_s=30.0, **kw)


def sc(clusters, tasks, model=MODEL, window=1000.0, resident=1):
    return Scenario("t", "", tuple(clusters), tuple(tasks), model, RC, window, Resident(resident))


def task(i, work_s, at=0.0, deadline=None, req=GpuRequest()):
    return Task(i, int(work_s * 100), at, deadline, req)


def test_fifo_on_one_slurm_gpu():
    s = sc([slurm(1)], [task(0, 100), task(1, 100)])
    r = simulate(s, AlwaysBackend("slurm"))
    # task 0: ready 5, runs 5..125 (20 start + 100 work); task 1: ready 5, waits, runs 125..245
    assert [(g.start_s, g.end_s) for g in r.segments] == [(5.0, 125.0), (125.0, 245.0)]
    f = figures(r, RC)
    assert f.billed_gpu_hours == pytest.approx(240 / 3600)
    assert f.cost_usd == pytest.approx(1.2 * 240 / 3600)
    assert f.busy_fraction == pytest.approx(200 / 240)
    assert f.makespan_s == 245.0 and f.deadline_misses == 0


def test_array_throttle_serialises():
    s = sc([slurm(2, array_throttle=1)], [task(0, 100), task(1, 100)])
    r = simulate(s, AlwaysBackend("slurm"))
    assert [g.end_s for g in r.segments] == [125.0, 245.0]
    s2 = sc([slurm(2)], [task(0, 100), task(1, 100)])
    assert [g.end_s for g in simulate(s2, AlwaysBackend("slurm")).segments] == [125.0, 125.0]


def test_resident_pods_billed_for_the_window():
    s = sc([k8s(2)], [task(0, 100), task(1, 100)], window=1000.0, resident=2)
    f = figures(simulate(s, ResidentPods()), RC)
    # 2 GPUs held 1000 s at 2.40 USD/GPU-h, busy 200 GPU-s (no per-step start: model stays loaded)
    assert f.billed_gpu_hours == pytest.approx(2000 / 3600)
    assert f.cost_usd == pytest.approx(2 * 2.4 * 1000 / 3600)
    assert f.busy_fraction == pytest.approx(0.1)
    assert f.makespan_s == 100.0


def test_preemption_requeues_and_bills_lost_time():
    s = sc([slurm(1, preemptions=(Preemption(50.0, 30.0),))], [task(0, 100)])
    r = simulate(s, AlwaysBackend("slurm"))
    # runs 5..50 (lost), preemptor holds 50..80, requeued ready 55, reruns 80..200
    assert [(g.start_s, g.end_s, g.completed) for g in r.segments] == [(5.0, 50.0, False), (80.0, 200.0, True)]
    f = figures(r, RC)
    assert f.billed_gpu_hours == pytest.approx(165 / 3600) and f.busy_fraction == pytest.approx(100 / 165)


def test_outage_defers_submission_and_dispatch():
    s = sc([slurm(1, outages=((0.0, 100.0),))], [task(0, 100, deadline=200.0)])
    r = simulate(s, AlwaysBackend("slurm"))
    assert (r.segments[0].start_s, r.segments[0].end_s) == (105.0, 225.0)
    assert figures(r, RC).deadline_misses == 1


def test_background_jobs_contend_in_fifo():
    s = sc([slurm(1, background=(BackgroundJob(0.0, 300.0),))], [task(0, 100, at=1.0)])
    r = simulate(s, AlwaysBackend("slurm"))
    # the foreign job (submitted first) runs 5..305 after its own 5 s launch; ours then 305..425
    assert (r.segments[0].start_s, r.segments[0].end_s) == (305.0, 425.0)


def test_mig_slice_runtime_and_fractional_billing():
    m = RuntimeModel(texts_per_second=100.0, gpu_busy=0.5, n_history=1)
    s = sc([k8s(0, mig=7)], [task(0, 100, req=GpuRequest(mig_ok=True))], model=m)
    r = simulate(s, AlwaysBackend("kubernetes", allow_mig=True))
    g = r.segments[0]
    # speed (1/7)/0.5 = 2/7: 100 s of work takes 350 s; held 30 + 350 s at 2.40/7 USD per hour
    assert g.device == "mig-1g.10gb" and g.end_s - g.start_s == pytest.approx(380.0)
    f = figures(r, RC)
    assert f.billed_gpu_hours == pytest.approx(380 / 7 / 3600)
    assert f.cost_usd == pytest.approx(2.4 / 7 * 380 / 3600)


def test_snapshot_start_estimate_matches_the_simulated_start():
    s = sc([slurm(1)], [task(0, 100), task(1, 100)])
    sim = Simulation(s, AlwaysBackend("slurm"))
    sim._arrive(s.tasks[0])
    sim._arrive(s.tasks[1])
    snap = sim.snapshot()
    p = snap.slurm.pools[0]
    assert (p.free, p.total, p.pending) == (1, 1, 2)
    # a third step would be allocated when the second ends: 245 s; minus its own 5 s launch = 240 s
    assert p.start_estimate_s == 240.0


def test_ours_sends_deadline_steps_around_a_busy_slurm():
    s = sc([slurm(1), k8s(1)], [task(0, 100), task(1, 100, deadline=200.0)])
    r = simulate(s, Ours())
    assert {i: o.cluster for i, o in r.outcomes.items()} == {0: "slurm", 1: "kubernetes"}
    f = figures(r, RC)
    assert f.deadline_misses == 0
    assert f.cost_usd == pytest.approx(1.2 * 120 / 3600 + 2.4 * 130 / 3600)


def test_timeline_bins():
    s = sc([slurm(1)], [task(0, 100)])
    t, busy, held = timeline(simulate(s, AlwaysBackend("slurm")), 50.0, 150.0)
    # held 5..125, busy (work) 25..125
    assert t == [0.0, 50.0, 100.0, 150.0]
    assert held == pytest.approx([0.9, 1.0, 0.5, 0.0]) and busy == pytest.approx([0.5, 1.0, 0.5, 0.0])


def test_fixed_assignment():
    s = sc([slurm(1), k8s(1)], [task(0, 100), task(1, 100)])
    r = simulate(s, Fixed({0: ("kubernetes", A100, A100), 1: ("kubernetes", A100, A100)}))
    assert [(g.start_s, g.end_s) for g in r.segments] == [(10.0, 140.0), (140.0, 270.0)]
