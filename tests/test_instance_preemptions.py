"""Preemptions learned from a real Dagster instance: launch events, the worker's preemption events and the bills
written as the executor, the worker and the bill writer write them, read back as per-pool rates."""

import dagster as dg
import pytest

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.instance.preemption import (
    LaunchSeen, bill_figures, fetch_observations, observations, with_learned_rates,
)
from dagster_gpu.policy import DeviceGroup, KubernetesState, SlurmState, Snapshot
from dagster_gpu.policy.preemption import PreemptionObservation
from tests.preemption_events import record_preempted_steps

A100 = "NVIDIA A100-SXM4-80GB"


def test_observations_take_the_largest_count_of_the_sources_and_the_billed_gpu_hours():
    k8s = "kubernetes:batch-low"
    launches = [LaunchSeen("r1", "emb", k8s, ("k8s/pod", "a")), LaunchSeen("r1", "emb", k8s, ("k8s/pod", "a-p1"), 1),
                LaunchSeen("r1", "emb", k8s, ("k8s/pod", "a-p2"), 2),
                LaunchSeen("r2", "emb", "slurm:gpu/-", ("slurm/job_id", "9_1")),
                LaunchSeen("r3", "emb", "slurm:gpu/-", ("slurm/job_id", "9_2"))]
    bills = {("k8s/pod", "a"): (600.0, 0), ("k8s/pod", "a-p1"): (600.0, 0), ("k8s/pod", "a-p2"): (1800.0, 0),
             ("slurm/job_id", "9_1"): (7200.0, 1)}
    # r1: 2 relaunches, but the worker recorded 3 stops (the last one failed the step: no relaunch after it)
    obs = observations(launches, {("r1", "emb"): 3, ("r2", "emb"): 1}, bills)
    assert obs == [PreemptionObservation(k8s, 3, 3000 / 3600), PreemptionObservation("slurm:gpu/-", 1, 2.0)]
    assert bill_figures({"billing/unit_gpu_seconds": 90.0, "slurm/attempt_states": "PREEMPTED,REQUEUED,COMPLETED"}) == (
        90.0, 1)
    assert bill_figures({"billing/gpu_seconds": dg.MetadataValue.float(5.0)}) == (5.0, 0)


def test_a_real_instance_teaches_each_pool_its_rate():
    with dg.instance_for_test() as instance:
        record_preempted_steps(instance)
        obs = fetch_observations(instance)
        assert sorted(obs, key=lambda o: o.pool) == [
            PreemptionObservation("kubernetes:batch-low", 1, 2.0),  # relaunch and worker event: one preemption
            PreemptionObservation("slurm:gpu/low", 2, 1.0),  # sacct: two PREEMPTED attempts
        ]
        sn = Snapshot(
            rate_card=RateCard.load(),
            slurm=SlurmState(pools=(DeviceGroup(A100, A100, 80.0, 1, 1),), preemption_pool="slurm:gpu/low"),
            kubernetes=KubernetesState(pools=(DeviceGroup(A100, A100, 80.0, 1, 1),), preemptions_per_gpu_hour=0.1,
                                       preemption_pool="kubernetes:batch-low"),
        )
        learned = with_learned_rates(instance, sn)
    # prior 0 and 0.1 per GPU-h, each weighing 10 GPU-h: (0 + 2) / (10 + 1) and (1 + 1) / (10 + 2)
    assert learned.slurm.preemptions_per_gpu_hour == pytest.approx(2 / 11) and learned.slurm.preemption_learned
    assert learned.kubernetes.preemptions_per_gpu_hour == pytest.approx(2 / 12)
    assert learned.kubernetes.preemption_source == (
        "learned: 1 preemption(s) in 2.00 GPU-h, with prior 0.1/GPU-h weighing 10 GPU-h")


def test_an_unreadable_instance_leaves_the_priors():
    class Broken:
        @property
        def event_log_storage(self):
            raise RuntimeError("database is down")

    sn = Snapshot(rate_card=RateCard.load(), slurm=SlurmState(preemptions_per_gpu_hour=0.3, preemption_pool="slurm:a/b"))
    assert with_learned_rates(Broken(), sn) is sn
