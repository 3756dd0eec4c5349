"""The fault benchmark's pure logic (bench/fault_plan.py): the seeded plan and how outcomes are counted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from fault_plan import (FAULTS, RUN_FAULTS, TARGETED_FAULTS, attempt_seconds, fault_table, first_after, kills_for,  # noqa: E402
                        plan_faults, preempt_fault_outcome, reason_names, run_fault_outcome, summary_keys, tally)


def test_kills_are_five_percent_of_the_units_and_at_least_one():
    assert [kills_for(n) for n in (0, 4, 20, 29, 30, 100)] == [1, 1, 1, 1, 2, 5]
    with pytest.raises(ValueError):
        kills_for(10, 1.5)


def test_plan_fires_every_fault_once_and_the_kill_per_unit_share_within_the_window():
    plan = plan_faults(seed=7, window_s=300, kills=2, lead_s=20)
    names = [f.name for f in plan]
    assert sorted(names) == sorted([*FAULTS, "worker_sigkill"])  # the kill twice, the rest once
    assert [f.label for f in plan if f.name == "worker_sigkill"] in (["worker_sigkill#1", "worker_sigkill#2"],
                                                                     ["worker_sigkill#2", "worker_sigkill#1"])
    assert all(20 <= f.at_s <= 300 for f in plan)
    assert [f.at_s for f in plan] == sorted(f.at_s for f in plan)


def test_plan_is_reproducible_from_its_seed():
    assert plan_faults(3, 200, 1) == plan_faults(3, 200, 1)
    assert plan_faults(3, 200, 1) != plan_faults(4, 200, 1)


@pytest.mark.parametrize("kw", [dict(window_s=10, lead_s=20), dict(kills=0), dict(faults=("meteor",))])
def test_plan_refuses_bad_arguments(kw):
    args = {"seed": 1, "window_s": 100, "kills": 1, **kw}
    with pytest.raises(ValueError):
        plan_faults(**args)


def test_tally_counts_once_duplicates_reasons_losses_and_recoveries():
    keys = ["a", "b", "c", "d", "e", "f"]
    mats = [("a", "r1"), ("b", "r1"), ("b", "r2"), ("b", "r3"),  # b three times: 1 duplicated partition, 2 extra events
            ("c", "r4"),                                        # c failed in the backfill, recovered by r4
            ("e", "r5")]                                        # e: the backfill lost it silently, recovered later
    end = {"a": ("ok", None), "b": ("ok", None), "c": ("failed", "worker SIGKILLed"),
           "d": ("failed", "slurm worker ended"), "e": ("running", None)}
    out = tally(keys, mats, end)  # f: no run of the backfill covered it, never materialized
    assert out.materialized_once == 3  # a, c, e
    assert out.duplicated == ["b"] and out.extra_materializations == 2
    assert out.failed_with_reason == ["c", "d"]
    assert out.lost_at_backfill_end == ["e", "f"]
    assert out.recovered == ["c", "e"]
    assert out.missing_after_recovery == ["d", "f"]
    assert out.partitions_lost == 3  # d, e, f: each once
    assert summary_keys(8, out, 2) == {"faults.injected": 8, "faults.partitions_lost": 3, "faults.duplicates": 1,
                                       "faults.leaked_objects": 2}


def test_first_materialization_after_a_fault_and_the_table():
    assert first_after([10.0, 12.5, 30.0], 11.0) == 1.5
    assert first_after([10.0], 11.0) is None and first_after([10.0], None) is None
    table = fault_table([{"fault": "etcd_restart", "at_s": 41.23, "outage_s": 3.0, "next_materialization_s": None,
                          "detail": "a|b"}])
    assert table.splitlines()[2] == "| etcd_restart | 41.2 | 3.0 | – | a/b |"


def test_run_faults_fire_in_the_first_half_and_leave_the_other_moments_as_they_were():
    assert FAULTS[-len(TARGETED_FAULTS):] == TARGETED_FAULTS and set(RUN_FAULTS) < set(TARGETED_FAULTS)
    before = plan_faults(seed=1, window_s=300, kills=1, faults=FAULTS[:-len(TARGETED_FAULTS)])
    after = plan_faults(seed=1, window_s=300, kills=1)
    assert [f for f in after if f.name not in TARGETED_FAULTS] == before
    assert sorted(f.name for f in after if f.name in TARGETED_FAULTS) == sorted(TARGETED_FAULTS)
    for seed in range(20):
        assert all(20 <= f.at_s <= 160 for f in plan_faults(seed, 300, 1) if f.name in TARGETED_FAULTS)
    # each preemption came after the run faults: their moments are those of the plan without it
    assert FAULTS[-2:] == ("k8s_preempt", "kueue_reclaim")
    without = plan_faults(seed=1, window_s=300, kills=1, faults=FAULTS[:-2])
    assert [f for f in after if f.name not in ("k8s_preempt", "kueue_reclaim")] == without
    assert [f for f in after if f.name != "kueue_reclaim"] == plan_faults(seed=1, window_s=300, kills=1, faults=FAULTS[:-1])


def test_a_preempted_run_must_materialize_its_own_partitions_once_after_a_relaunch_with_every_pod_billed():
    end = {"a": ("ok", None, "r1"), "b": ("ok", None, "r1"), "c": ("ok", None, "r2")}
    mats = [("a", "r1"), ("b", "r1"), ("c", "r2")]
    pods = ["dagster-gpu-1f-0", "dagster-gpu-1f-0-p1"]
    good = preempt_fault_outcome("r1", end, mats, pods, billed={*pods, "other"}, disruption="PreemptionByScheduler")
    assert good == {"fault": "k8s_preempt", "run_id": "r1", "partitions": 2, "launches": 2, "unbilled_launches": 0,
                    "materialized_once": 2, "by_run": 2, "failed": 0, "disruption": "PreemptionByScheduler", "ok": True}
    # the preempted pod without its bill
    assert preempt_fault_outcome("r1", end, mats, pods, billed={pods[1]})["unbilled_launches"] == 1
    assert not preempt_fault_outcome("r1", end, mats, pods, billed={pods[1]})["ok"]
    # never launched again: the preemption did not happen (or was a failure)
    assert not preempt_fault_outcome("r1", end, mats, pods[:1], billed=pods)["ok"]
    # a partition materialized twice, or by a rerun after the run failed it
    assert not preempt_fault_outcome("r1", end, [*mats, ("a", "r1")], pods, billed=pods)["ok"]
    failed = {**end, "b": ("failed", "preempted 4 times", "r1")}
    out = preempt_fault_outcome("r1", failed, [("a", "r1"), ("b", "r9")], pods, billed=pods)
    assert (out["failed"], out["by_run"], out["ok"]) == (1, 1, False)
    assert not preempt_fault_outcome(None, end, mats, [], billed=[])["ok"]  # not injected
    keys = summary_keys(11, tally(["a"], [("a", "r1")], {"a": ("ok", None)}), 0, [good], units_without_bill=0)
    assert {k: v for k, v in keys.items() if "k8s_preempt" in k or "bill" in k} == {
        "faults.units_without_bill": 0, "faults.k8s_preempt.launches": 2, "faults.k8s_preempt.unbilled_launches": 0,
        "faults.k8s_preempt.materialized_once": 2}


def test_a_run_kueue_evicted_is_counted_as_a_preemption_under_its_own_name():
    end = {"a": ("ok", None, "r1"), "b": ("ok", None, "r1")}
    pods = ["dagster-gpu-2a-0", "dagster-gpu-2a-0-p1"]
    out = preempt_fault_outcome("r1", end, [("a", "r1"), ("b", "r1")], pods, billed=pods,
                                disruption="Preempted/InCohortReclamation", fault="kueue_reclaim")
    assert (out["fault"], out["launches"], out["by_run"], out["disruption"], out["ok"]) == (
        "kueue_reclaim", 2, 2, "Preempted/InCohortReclamation", True)
    keys = summary_keys(12, tally(["a", "b"], [("a", "r1"), ("b", "r1")], {"a": ("ok", None), "b": ("ok", None)}), 0,
                        [out], units_without_bill=0)
    assert {k: v for k, v in keys.items() if "kueue" in k} == {
        "faults.kueue_reclaim.launches": 2, "faults.kueue_reclaim.unbilled_launches": 0,
        "faults.kueue_reclaim.materialized_once": 2}
    # a workload Kueue evicted but whose relaunch never came (or failed) loses the fault
    assert not preempt_fault_outcome("r1", end, [("a", "r1")], pods[:1], billed=pods, fault="kueue_reclaim")["ok"]


# The errors below are those the executor recorded in the fault campaign of 2026-12-02 (bench/faults.py
# against resources/k8s/node_agent.py playing kubelet v1.34 + NVIDIA DRA driver v25.12.0), cut short.
IMAGE = "registry.example.com/ml/dagster-gpu:2026.12-does-not-exist"
PULL = ("Step fault_embeddings failed health check: kubernetes worker of step fault_embeddings (2 partitions "
        "'f00000.txt'…'f00001.txt') ended (failed: pod dagster-gpu/dagster-gpu-76b2c4326b49f995-2 bound to gpu-node-0 "
        f'but not started after 31s (> create_timeout_seconds=30): ImagePullBackOff: Back-off pulling image "{IMAGE}": '
        f'ErrImagePull: rpc error: code = NotFound desc = failed to pull and unpack image "{IMAGE}": failed to resolve '
        f'reference "{IMAGE}": {IMAGE}: not found; kubelet events: BackOff: Back-off pulling image "{IMAGE}" | ...')
PREPARE = ("Step fault_embeddings failed health check: kubernetes worker of step fault_embeddings (5 partitions "
           "'f00000.txt'…'f00004.txt') ended (failed: pod dagster-gpu/dagster-gpu-19a7487dfd4425fb-0 bound to gpu-node-0 "
           "but its DRA devices could not be prepared (the kubelet retries, the pod would stay ContainerCreating); "
           "kubelet events: FailedPrepareDynamicResources: Failed to prepare dynamic resources: NodePrepareResources "
           "failed for claim dagster-gpu/dagster-gpu-19a7487dfd4425fb-0-gpu-n9fxj: error preparing devices for claim "
           "...: prepare devices failed: error applying GPU config: invalid GPU sharing settings: "
           "&{TimeSlicing 0xc000a1c0f0 <nil>}) without the step recording success or failure; handle {...}")
KILLED = ("Step fault_embeddings failed health check: kubernetes worker of step fault_embeddings (5 partitions "
          "'f00000.txt'…'f00004.txt') ended (failed: pod dagster-gpu-19a7487dfd4425fb-1 Failed (Error), exit code 137)")


def test_reason_names_the_cause_of_each_run_fault():
    assert reason_names("image_pull_fail", PULL, must=(IMAGE,))
    assert not reason_names("image_pull_fail", PULL, must=("other:image",))
    assert not reason_names("image_pull_fail", KILLED, must=(IMAGE,))
    assert reason_names("dra_prepare_fail", PREPARE)
    assert not reason_names("dra_prepare_fail", KILLED) and not reason_names("dra_prepare_fail", None)


def test_image_fault_needs_every_partition_failed_naming_the_image_then_rerun_once():
    end = {"a": ("failed", PULL, "r1"), "b": ("failed", PULL, "r1"), "c": ("ok", None, "r2")}
    mats = [("c", "r2"), ("a", "r9"), ("b", "r9")]
    out = run_fault_outcome("image_pull_fail", "r1", end, mats, [PULL, PULL, PULL], must=(IMAGE,))
    assert (out["partitions"], out["named_attempts"], out["failed_with_named_reason"]) == (2, 3, 2)
    assert (out["materialized_once"], out["by_rerun"], out["by_retry"], out["ok"]) == (2, 2, 0, True)
    assert out["reason"] == PULL
    # one partition left failed for another reason, one rematerialized twice: not ok
    end2 = {**end, "b": ("failed", KILLED, "r1")}
    out2 = run_fault_outcome("image_pull_fail", "r1", end2, [*mats, ("a", "r10")], [PULL], must=(IMAGE,))
    assert (out2["failed_with_named_reason"], out2["materialized_once"], out2["ok"]) == (1, 1, False)
    # no attempt named the image (the fault did not hit that run): not ok
    assert run_fault_outcome("image_pull_fail", "r1", end, mats, [KILLED], must=(IMAGE,))["ok"] is False
    assert run_fault_outcome("image_pull_fail", None, end, mats)["ok"] is False  # not injected


def test_prepare_fault_may_be_materialized_by_the_retry_launched_without_the_sharing_config():
    # recorded: attempt 1 FailedPrepareDynamicResources, attempt 2 (unshared) SIGKILLed, attempt 3 succeeded
    end = {"a": ("ok", None, "r1"), "b": ("ok", None, "r1"), "c": ("ok", None, "r2")}
    mats = [("a", "r1"), ("b", "r1"), ("c", "r2")]
    out = run_fault_outcome("dra_prepare_fail", "r1", end, mats, [PREPARE, KILLED])
    assert (out["named_attempts"], out["attempts"], out["by_retry"], out["by_rerun"], out["ok"]) == (1, 2, 2, 0, True)
    assert run_fault_outcome("dra_prepare_fail", "r1", end, [*mats, ("a", "r3")], [PREPARE])["ok"] is False  # doubled
    assert run_fault_outcome("dra_prepare_fail", "r1", end, mats, [])["ok"] is False  # the claim was never refused
    keys = summary_keys(10, tally(["a"], [("a", "r1")], {"a": ("ok", None)}), 0, [out])
    assert (keys["faults.dra_prepare_fail.named_attempts"], keys["faults.dra_prepare_fail.materialized_once"],
            keys["faults.dra_prepare_fail.failed_with_named_reason"], keys["faults.injected"]) == (1, 2, 0, 10)


def test_attempt_seconds_pairs_each_launch_with_the_failure_after_it():
    evs = [("STEP_UP_FOR_RETRY", 170.0), ("STEP_WORKER_STARTING", 100.0), ("STEP_WORKER_STARTING", 175.0),
           ("STEP_FAILURE", 238.4), ("STEP_WORKER_STARTING", 240.0), ("ASSET_MATERIALIZATION", 250.0)]
    assert attempt_seconds(evs) == [70.0, 63.4]  # the last launch has no failure after it
