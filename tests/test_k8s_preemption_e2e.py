"""A step pod preempted by the real kube-scheduler (resources/k8s/cluster.sh) is launched again, not failed.

The step pod runs at the recommended batch PriorityClass (resources/k8s/manifests/50-batch-priorityclass.yaml,
value -100, preemptionPolicy Never) and asks 40 of the node's 64 CPUs; an "online" pod of a higher class asks
40 more. kube-scheduler's DefaultPreemption then picks the step pod as the victim: it sets its
``DisruptionTarget`` condition (reason ``PreemptionByScheduler``, message "default-scheduler: preempting to
accommodate a higher priority pod") and deletes it with its grace period; the node agent, as a kubelet,
sends SIGTERM, waits at most ``terminationGracePeriodSeconds``, reports the exit and removes the pod. The
worker stops gracefully (exit 143, no step outcome), the backend reports PREEMPTED and the step handler
launches the unit again (``<pod>-p1``), which waits for the CPUs, runs and materializes the partition once.

Preemption is driven by CPU rather than by the DRA device: the scheduler's choice of victims is the same
DefaultPreemption code either way, and CPUs make the victim deterministic on a node with many GPUs.
"""

from __future__ import annotations

import json
import time

import dagster as dg
import pytest
from kubernetes import client

from tests.k8s_helpers import NAMESPACE, admin_api, executor_api, wait_for
from tests.test_k8s_e2e import _backfill, _leftovers, _observation, k8s_instance  # noqa: F401  (fixture)

pytestmark = [pytest.mark.k8s, pytest.mark.e2e, pytest.mark.postgres]

ONLINE_CLASS = "dagster-gpu-test-online"


def _online_pod(name: str, seconds: int) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace="default"),
        spec=client.V1PodSpec(
            priority_class_name=ONLINE_CLASS, restart_policy="Never", termination_grace_period_seconds=1,
            tolerations=[client.V1Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
            containers=[client.V1Container(name="serve", image="online:dev", command=["sleep", str(seconds)],
                                           resources=client.V1ResourceRequirements(requests={"cpu": "40"}))]))


def _ensure_online_class() -> None:
    sched = client.SchedulingV1Api(admin_api())
    try:
        sched.create_priority_class(client.V1PriorityClass(
            metadata=client.V1ObjectMeta(name=ONLINE_CLASS), value=100000, preemption_policy="PreemptLowerPriority",
            description="test: an online inference pod that preempts batch"))
    except client.ApiException as e:
        if e.status != 409:
            raise


def _preempted_once(instance, tmp_path, monkeypatch, key: str, max_preemptions: int, sleep_s: float = 15.0):
    """Backfill ``key`` of k8s_preemptible (``sleep_s`` seconds of work) and preempt its first pod with an online
    pod once it runs. Returns (backfill's final counts, the run, the run's events as text, what the test saw:
    the first pod's name, and the pod as the scheduler left it when it was read in time)."""
    from dagster_gpu.k8s.manifests import run_selector
    from tests import k8s_pipeline as p

    monkeypatch.setenv("K8S_TEST_CPU_REQUEST", "40")
    monkeypatch.setenv("K8S_TEST_PRIORITY_CLASS", "dagster-gpu-batch")
    monkeypatch.setenv("K8S_TEST_MAX_PREEMPTIONS", str(max_preemptions))
    _ensure_online_class()
    admin = client.CoreV1Api(admin_api())
    core = client.CoreV1Api(executor_api())
    online = f"online-{int(time.time())}"
    seen: dict[str, object] = {}

    def preempt(_bid):
        run = wait_for(lambda: next(iter(instance.get_runs(dg.RunsFilter(tags={"dagster/partition": key}))), None),
                       120, interval=0.5, what="the run")
        pods = lambda: core.list_namespaced_pod(NAMESPACE, label_selector=run_selector(run.run_id)).items  # noqa: E731
        first = wait_for(lambda: next((x for x in pods() if x.status.phase == "Running"), None), 180, interval=0.5,
                         what="the step pod running")
        seen["first"] = first.metadata.name
        admin.create_namespaced_pod("default", _online_pod(online, 8))

        def disrupted():
            x = next((x for x in pods() if x.metadata.uid == first.metadata.uid), None)
            if x is None:
                return "gone"
            return x if any(c.type == "DisruptionTarget" for c in x.status.conditions or []) else None

        got = wait_for(disrupted, 60, interval=0.2, what="the step pod's DisruptionTarget condition")
        if got != "gone":
            seen["disrupted"] = client.ApiClient().sanitize_for_serialization(got)

    _, final = _backfill(instance, p.k8s_preemptible, [key], tmp_path, sleep_s=sleep_s, timeout_s=400, on_running=preempt)
    try:
        admin.delete_namespaced_pod(online, "default", grace_period_seconds=0)
    except client.ApiException:
        pass
    run = instance.get_runs(dg.RunsFilter(tags={"dagster/partition": key}))[0]
    story = "\n".join(f"{r.event_log_entry.dagster_event_type}: {r.event_log_entry.message} "
                      f"{getattr(getattr(r.event_log_entry.dagster_event, 'event_specific_data', None), 'error', '')}"[:1500]
                      for r in instance.get_records_for_run(run.run_id).records)
    return final, run, story, seen


def test_a_step_pod_preempted_by_kube_scheduler_is_launched_again_and_materializes_once(k8s_instance, tmp_path,
                                                                                       monkeypatch):
    from tests import k8s_pipeline as p

    instance, key = k8s_instance, p.KEYS[30]
    final, run, story, seen = _preempted_once(instance, tmp_path, monkeypatch, key, max_preemptions=3)
    assert (final.succeeded, final.failed) == (1, 0), story
    assert run.status == dg.DagsterRunStatus.SUCCESS
    if "disrupted" in seen:  # what the scheduler wrote on its victim (read as the test's admin)
        cond = next(c for c in seen["disrupted"]["status"]["conditions"] if c["type"] == "DisruptionTarget")
        assert (cond["status"], cond["reason"]) == ("True", "PreemptionByScheduler")
        assert cond["message"] == "default-scheduler: preempting to accommodate a higher priority pod"

    # two launches: the second after the preemption, named -p1, on the same placement
    launches = [r.event_log_entry.dagster_event for r in instance.get_records_for_run(
        run.run_id, of_type=dg.DagsterEventType.STEP_WORKER_STARTING).records]
    assert len(launches) == 2, [e.message for e in launches]
    md0, md1 = (e.engine_event_data.metadata for e in launches)
    assert "dagster_gpu/preemptions" not in md0 and md1["dagster_gpu/preemptions"].value == 1
    assert md0["k8s/pod"].value == seen["first"] and md1["k8s/pod"].value == f"{seen['first']}-p1"
    assert md1["dagster_gpu/placement"].value == md0["dagster_gpu/placement"].value
    assert "again (preemption 1 of at most 3: pod " in launches[1].message and "PreemptionByScheduler" in launches[1].message

    # the partition materialized once, by the second pod; both pods billed from their running intervals
    recs = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=p.k8s_preemptible.key,
                                                                 asset_partitions=[key]), limit=5).records
    assert len(recs) == 1 and recs[0].asset_materialization.metadata["k8s/pod"].value == f"{seen['first']}-p1"
    obs = wait_for(lambda: (lambda o: o if len(o) == 2 else None)(_observation(instance, p.k8s_preemptible.key, key)),
                   60, interval=1, what="both pods' pod-interval bills")
    assert sorted(o["k8s/pod"] for o in obs) == sorted([seen["first"], f"{seen['first']}-p1"])
    running = {o["k8s/pod"]: o["k8s/running_seconds"] for o in obs}  # 1 s resolution: the first ran a moment
    assert running[f"{seen['first']}-p1"] >= 15 and running[seen["first"]] >= 0
    assert wait_for(lambda: _leftovers([run.run_id]) == {"pods": [], "claims": [], "templates": []}, 60, what="cleanup")


def test_a_preemption_beyond_max_preemptions_fails_the_step_saying_so(k8s_instance, tmp_path, monkeypatch):
    from tests import k8s_pipeline as p

    instance, key = k8s_instance, p.KEYS[31]
    final, run, story, seen = _preempted_once(instance, tmp_path, monkeypatch, key, max_preemptions=0)
    assert (final.succeeded, final.failed) == (0, 1), story
    assert ("was preempted 1 time(s), more than its backend's max_preemptions (0); the last one: pod "
            f"{seen['first']} was preempted (PreemptionByScheduler: default-scheduler: preempting") in story, story
    assert len(instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.STEP_WORKER_STARTING).records) == 1
    assert wait_for(lambda: _leftovers([run.run_id]) == {"pods": [], "claims": [], "templates": []}, 60, what="cleanup")
