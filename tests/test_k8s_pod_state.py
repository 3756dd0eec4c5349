"""pod_state on step pods recorded from the local control plane (tests/data/k8s/record_k8s_pods.py)."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pytest

from dagster_gpu.contracts import WorkerStatus
from dagster_gpu.k8s.pod_state import (
    PodTimeouts, disruption, event_time, kubelet_warnings, needs_events, needs_scheduler_events, pod_events, pod_state,
    preempted_event, pull_in_progress, terminated, unschedulable_message,
)

DATA = Path(__file__).resolve().parent / "data" / "k8s"
T = PodTimeouts(pending_s=300.0, create_s=120.0)


def pod(case: str) -> dict:
    return json.loads((DATA / f"pod_{case}.json").read_text())


def test_succeeded_pod_finishes_with_exit_code_0():
    p = pod("succeeded")
    v = pod_state(p, 5.0, T)
    assert (v.state.status, v.state.exit_code, v.action) == (WorkerStatus.SUCCEEDED, 0, "finish")
    assert v.state.message == f"pod {p['metadata']['name']} Succeeded"
    assert terminated(p)["reason"] == "Completed"


def test_failed_pod_finishes_with_its_exit_code_the_kubelet_reason_and_its_logs_last_lines():
    p = pod("failed")  # the worker logged two lines and exited 7; FallbackToLogsOnError made them its message
    v = pod_state(p, 5.0, T)
    assert (v.state.status, v.state.exit_code, v.action) == (WorkerStatus.FAILED, 7, "finish")
    assert v.state.message == (f"pod {p['metadata']['name']} Failed (Error); termination message:\n"
                               "embedding 3 partitions\n"
                               "ValueError: corpus file bad.parquet: no text column")
    del p["status"]["containerStatuses"][0]["state"]["terminated"]["message"]  # policy File, or an empty log
    assert pod_state(p, 5.0, T).state.message == f"pod {p['metadata']['name']} Failed (Error)"


def test_running_pod_is_running():
    v = pod_state(pod("running"), 10_000.0, T)  # no timeout applies to a running pod
    assert (v.state.status, v.action) == (WorkerStatus.RUNNING, "none")


def test_unschedulable_pod_waits_with_the_schedulers_message_then_gives_up():
    p = pod("unschedulable")
    assert "cannot allocate all claims" in unschedulable_message(p)
    assert not needs_scheduler_events(p)  # the condition already says why
    v = pod_state(p, 10.0, T)
    assert (v.state.status, v.action) == (WorkerStatus.PENDING, "none")
    assert v.state.message == unschedulable_message(p)
    late = pod_state(p, 301.0, T)
    assert (late.state.status, late.action) == (WorkerStatus.FAILED, "give_up")
    assert late.state.message.startswith(f"pod dagster-gpu/{p['metadata']['name']} unschedulable for 301s "
                                         "(> pending_timeout_seconds=300): FailedScheduling: 0/1 nodes are available")


def test_unschedulable_without_a_condition_message_uses_the_event():
    p = pod("unschedulable")
    p["status"]["conditions"] = []
    assert needs_scheduler_events(p)
    ev = {"reason": "FailedScheduling", "type": "Warning", "message": "0/1 nodes are available: from the event",
          "involvedObject": {"kind": "Pod", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]},
          "lastTimestamp": "2026-12-01T07:28:09Z"}
    v = pod_state(p, 10.0, T, [ev])
    assert v.state.message == "0/1 nodes are available: from the event"
    assert pod_state(p, 400.0, T).state.message.endswith("FailedScheduling: the scheduler has not placed the pod")


def test_bound_pod_stuck_on_a_missing_secret_gives_up_after_the_create_timeout():
    p = pod("stuck")
    v = pod_state(p, 30.0, T)
    assert (v.state.status, v.state.message, v.action) == (WorkerStatus.PENDING, "CreateContainerConfigError", "none")
    late = pod_state(p, 121.0, T)
    assert (late.state.status, late.action) == (WorkerStatus.FAILED, "give_up")
    assert late.state.message == (
        f"pod dagster-gpu/{p['metadata']['name']} bound to gpu-node-0 but not started after 121s "
        "(> create_timeout_seconds=120): CreateContainerConfigError: secret 'no-such-secret': 404 Not Found")


@pytest.mark.parametrize("case", ["running", "unschedulable", "stuck"])
def test_a_terminating_pod_is_running_until_it_is_gone(case):
    p = pod(case)
    p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    v = pod_state(p, 10_000.0, T)
    assert (v.state.status, v.state.message, v.action) == (WorkerStatus.RUNNING, "pod is terminating", "none")


# -- kubelet events (recorded with the pods from the node agent, which copies the kubelet's reasons and
# messages: kubernetes/kubernetes v1.34 pkg/kubelet/events/event.go, pkg/kubelet/images/image_manager.go,
# pkg/kubelet/kuberuntime/kuberuntime_manager.go; NVIDIA/k8s-dra-driver-gpu v25.12.0 sharing.go) ----------


def events(case: str) -> list[dict]:
    return json.loads((DATA / f"events_{case}.json").read_text())


def _at(evs: list[dict], reason: str) -> float:
    return max(event_time(e) for e in evs if e["reason"] == reason)


def test_a_pod_pulling_its_image_is_progress_not_stuck():
    p, evs = pod("pulling"), events("pulling")
    assert p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ContainerCreating"
    assert needs_events(p)
    t0 = _at(evs, "Pulling")
    # 10 minutes into the first pull of a multi-GB image, far past create_timeout_seconds: still pending
    v = pod_state(p, 600.0, T, evs, now=t0 + 590)
    assert (v.state.status, v.action) == (WorkerStatus.PENDING, "none")
    assert v.state.message.startswith('Pulling: Pulling image "registry.example.com/slow-pull/dagster-gpu:')
    # without its events (what the code did before) the same pod failed as stuck
    assert pod_state(p, 600.0, T).state.status == WorkerStatus.FAILED
    # a pull that runs past image_pull_timeout_seconds fails
    late = pod_state(p, 2000.0, T, evs, now=t0 + 1801)
    assert (late.state.status, late.action) == (WorkerStatus.FAILED, "give_up")
    assert "image pull has run 1801s (> image_pull_timeout_seconds=1800)" in late.state.message


def test_the_create_clock_starts_again_when_the_image_is_pulled():
    p, evs = pod("pulling"), events("pulling")
    t0 = _at(evs, "Pulling")
    pulled = {**evs[0], "reason": "Pulled", "message": "Successfully pulled image in 5m0s", "firstTimestamp": None,
              "lastTimestamp": dt.datetime.fromtimestamp(t0 + 300, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    evs = evs + [pulled]
    assert pod_state(p, 400.0, T, evs, now=t0 + 400).state.status == WorkerStatus.PENDING  # 100 s after Pulled
    late = pod_state(p, 421.0, T, evs, now=t0 + 421)
    assert (late.state.status, late.action) == (WorkerStatus.FAILED, "give_up")
    assert "but not started 121s after its image was pulled (> create_timeout_seconds=120): ContainerCreating" \
        in late.state.message


def test_a_missing_image_fails_after_the_create_timeout_with_the_kubelets_pull_error():
    p, evs = pod("image_missing"), events("image_missing")
    assert p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ImagePullBackOff"
    now = _at(evs, "BackOff")
    assert pod_state(p, 30.0, T, evs, now=now).state.message == "ImagePullBackOff"
    # a retried pull (a newer Pulling event) does not extend a pod stuck in ImagePullBackOff
    retry = {**evs[0], "lastTimestamp": dt.datetime.fromtimestamp(now + 100, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    late = pod_state(p, 121.0, T, evs + [retry], now=now + 101)
    assert (late.state.status, late.action) == (WorkerStatus.FAILED, "give_up")
    name = p["metadata"]["name"]
    assert late.state.message.startswith(
        f"pod dagster-gpu/{name} bound to gpu-node-0 but not started after 121s (> create_timeout_seconds=120): "
        'ImagePullBackOff: Back-off pulling image "registry.example.com/does-not-exist/dagster-gpu:1"')
    # the kubelet's warnings, newest first: the back-off and the registry's answer ("Error: ErrImagePull" /
    # "Error: ImagePullBackOff" only repeat the waiting reason)
    image = "registry.example.com/does-not-exist/dagster-gpu:1"
    assert late.state.message.endswith(
        f'; kubelet events: BackOff: Back-off pulling image "{image}" | Failed: Failed to pull image "{image}": '
        f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": failed to resolve reference '
        f'"{image}": {image}: not found')
    assert kubelet_warnings(pod_events(p, evs), limit=1) == [f'BackOff: Back-off pulling image "{image}"']


def test_a_dra_prepare_failure_fails_at_once_with_the_kubelets_message():
    p, evs = pod("prepare_failed"), events("prepare_failed")
    assert p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ContainerCreating"
    v = pod_state(p, 3.0, T, evs, now=_at(evs, "FailedPrepareDynamicResources") + 1)
    assert (v.state.status, v.action) == (WorkerStatus.FAILED, "give_up")
    name = p["metadata"]["name"]
    assert v.state.message.startswith(f"pod dagster-gpu/{name} bound to gpu-node-0 but its DRA devices could not be "
                                      "prepared")
    assert "; kubelet events: FailedPrepareDynamicResources: Failed to prepare dynamic resources: " \
           f"NodePrepareResources failed for claim dagster-gpu/{name}-gpu-" in v.state.message
    assert v.state.message.endswith("invalid GPU sharing settings: &{TimeSlicing 0xc000a1c0f0 <nil>}")
    # before (no events read) the pod only failed after create_timeout_seconds, as "ContainerCreating: None"
    assert pod_state(p, 3.0, T).state.status == WorkerStatus.PENDING


def test_events_of_an_earlier_pod_with_the_same_name_are_ignored():
    p, evs = pod("prepare_failed"), events("prepare_failed")
    other = [{**e, "involvedObject": {**e["involvedObject"], "uid": "00000000-0000-0000-0000-000000000000"}} for e in evs]
    assert pod_events(p, other) == []
    assert pod_state(p, 3.0, T, other, now=time.time()).state.status == WorkerStatus.PENDING


def test_a_running_pod_after_a_pull_has_the_kubelets_normal_events():
    evs = events("running")
    assert [e["reason"] for e in pod_events(pod("running"), evs) if e["source"].get("component") == "kubelet"] == [
        "Pulling", "Pulled", "Created", "Started"]
    assert kubelet_warnings(evs) == []
    assert pull_in_progress(pod_events(pod("running"), evs)) is None


# Recorded by tests/data/k8s/record_k8s_preempted.py: kube-scheduler preempted a batch-priority step pod for a
# higher-priority pod; the node agent kept the scheduler's condition as the kubelet's status manager does.
SCHEDULER_WORDS = "PreemptionByScheduler: default-scheduler: preempting to accommodate a higher priority pod"


def test_a_pod_ended_by_preemption_is_preempted_not_failed():
    p = pod("preempted")
    assert disruption(p) == SCHEDULER_WORDS
    v = pod_state(p, 30.0, T)
    assert (v.state.status, v.state.exit_code, v.action) == (WorkerStatus.PREEMPTED, 143, "finish")
    assert v.state.message == f"pod {p['metadata']['name']} was preempted ({SCHEDULER_WORDS}); its container ended Error"


def test_the_scheduler_marks_its_victim_before_deleting_it_and_a_terminating_victim_still_runs():
    p = pod("preempted_terminating")  # the condition is patched first, then the pod deleted (preemption.go)
    assert p["metadata"].get("deletionTimestamp") is None and disruption(p) == SCHEDULER_WORDS
    assert (pod_state(p, 30.0, T).state.status, pod_state(p, 30.0, T).state.message) == (WorkerStatus.RUNNING, "")
    p["metadata"]["deletionTimestamp"] = "2026-12-05T00:23:49+00:00"
    v = pod_state(p, 30.0, T)
    assert (v.state.status, v.action) == (WorkerStatus.RUNNING, "none")
    assert v.state.message == f"pod is terminating: preempted ({SCHEDULER_WORDS})"


def test_only_a_true_disruption_target_counts_and_a_plain_failure_stays_failed():
    p = pod("preempted")
    for c in p["status"]["conditions"]:
        if c["type"] == "DisruptionTarget":
            c["status"] = "False"  # the disruption controller resets a disruption that never went ahead
    assert disruption(p) is None and pod_state(p, 30.0, T).state.status == WorkerStatus.FAILED
    assert disruption(pod("failed")) is None


def test_the_schedulers_preempted_event_names_its_victim_by_uid():
    events = json.loads((DATA / "events_preempted.json").read_text())
    uid = pod("preempted")["metadata"]["uid"]
    assert preempted_event(events, uid) == "Preempted: Preempted by pod eff0e794-4a81-4d26-8e52-afea75b001fc on node gpu-node-0"
    assert preempted_event(events, "another-uid") is None
    assert preempted_event([e for e in events if e["reason"] != "Preempted"], uid) is None
