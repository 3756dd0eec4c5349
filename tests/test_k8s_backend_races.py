"""KubernetesBackend's state next to the settler that gives up on a stuck pod, without a cluster.

The CI failure this guards against: a stuck pod was deleted before the reason was remembered, so a health
check reading the pod in between reported "does not exist" instead of the kubelet's reason. Now ``state``
only reads (and remembers the terminal state it read); the settler deletes the pod afterwards.
"""

from __future__ import annotations

import time

import pytest

from kubernetes.client import (V1ContainerState, V1ContainerStateWaiting, V1ContainerStatus, V1ObjectMeta, V1Pod,
                               V1PodSpec, V1PodStatus)

from dagster_gpu.contracts import WorkerStatus
from dagster_gpu.k8s.backend import KubernetesBackend
from dagster_gpu.executor.settle import Settler
from dagster_gpu.k8s import manifests as m

UID = "13a55fb7-bc20-4691-a751-8e2252a90aac"


class _NoWatch:
    def start(self):
        pass

    def get(self, uid):
        return None


class _Kube:
    """Holds one pod stuck in CreateContainerConfigError; ``on_read`` runs before each read (a racing thread)."""

    namespace = "ns"

    def __init__(self):
        self.pod = V1Pod(
            metadata=V1ObjectMeta(name="p", uid=UID),
            spec=V1PodSpec(containers=[], node_name="gpu-node-0"),
            status=V1PodStatus(phase="Pending", container_statuses=[V1ContainerStatus(
                name="step", image="x", image_id="", ready=False, restart_count=0,
                state=V1ContainerState(waiting=V1ContainerStateWaiting(
                    reason="CreateContainerConfigError", message='secret "no-such-secret" not found')))]))
        self.on_read = None
        self.deleted: list[str] = []

    def read_pod(self, name):
        if self.on_read is not None:
            hook, self.on_read = self.on_read, None
            hook()
        return self.pod

    def pod_events(self, name):
        return []  # a kubelet that recorded nothing for the pod

    def delete_pod(self, name, uid=None):
        gone = self.pod is None
        self.deleted.append(name)
        self.pod = None
        return not gone

    def delete_claim_template(self, name):
        self.deleted.append(name)

    def delete_claim(self, name):
        self.deleted.append(name)


def _backend():
    kube = _Kube()
    b = KubernetesBackend(kube, m.PodSettings(namespace="ns", secret_env=()), pending_timeout_s=30,
                          create_timeout_s=4, rates={"default": 1.0})
    b.claims = b.pods = _NoWatch()
    handle = {"namespace": "ns", "pod": "p", "pod_uid": UID, "template": "t", "launched_at": time.time() - 10}
    return b, kube, handle


def test_state_of_a_stuck_pod_only_reads_and_the_settler_terminates_it():
    b, kube, h = _backend()
    first, second = b.state(h), b.state(h)
    assert first == second and first.status == WorkerStatus.FAILED and first.abandoned
    assert "not started after" in first.message and "CreateContainerConfigError" in first.message, first.message
    assert kube.deleted == []  # a health check deletes nothing
    written = []
    settler = Settler(write=lambda bill: written.append(bill) or 1)
    assert settler.settle(b, h) is True
    # terminate: pod and template (it had no claim yet); then release's delete finds the pod gone
    assert kube.deleted == ["p", "t", "p"]
    assert written == []  # never ran: nothing billed
    assert settler.settle(b, h) is True and kube.deleted == ["p", "t", "p"]  # terminated and released once


def test_health_check_after_the_settler_deleted_the_pod_still_reports_the_kubelet_reason():
    b, kube, h = _backend()
    settler = Settler(write=lambda bill: 0)
    # the settler's pass reads the pod end, then deletes it; a health check comes afterwards
    kube.on_read = None
    assert settler.settle(b, h) is True and kube.pod is None
    s = b.state(h)
    assert s.status == WorkerStatus.FAILED and "CreateContainerConfigError" in s.message, s.message


def test_a_health_check_racing_the_settler_reads_the_same_remembered_state():
    b, kube, h = _backend()
    settler = Settler(write=lambda bill: 0)
    # while the health check is between "not remembered yet" and reading the pod, the settler settles it
    kube.on_read = lambda: settler.settle(b, h)
    s = b.state(h)
    assert s.status == WorkerStatus.FAILED and "CreateContainerConfigError" in s.message, s.message


def test_a_pod_deleted_by_someone_else_still_fails_with_a_clear_message():
    b, kube, h = _backend()
    kube.pod = None
    s = b.state(h)
    assert s.status == WorkerStatus.FAILED and "does not exist" in s.message and UID in s.message
    assert not s.abandoned


class _PreparedKube(_Kube):
    """A pod the kubelet could not prepare (recorded: tests/data/k8s/pod_prepare_failed.json and its events)."""

    def __init__(self):
        super().__init__()
        import json
        from pathlib import Path

        data = Path(__file__).resolve().parent / "data" / "k8s"
        self.body = json.loads((data / "pod_prepare_failed.json").read_text())
        self.events = json.loads((data / "events_prepare_failed.json").read_text())
        from kubernetes.client import ApiClient

        self.pod = ApiClient()._ApiClient__deserialize(self.body, "V1Pod")

    def pod_events(self, name):
        return self.events

    def read_claim(self, name):
        return None  # the resourceclaim controller deleted it with its pod

    def inventory(self, label_selector):
        return [], [], []


def test_a_shared_claim_that_failed_to_prepare_stops_shared_placements_on_its_pool():
    from dagster_gpu.k8s.sharing_failures import SharingFailures

    kube, memory = _PreparedKube(), SharingFailures(None)
    b = KubernetesBackend(kube, m.PodSettings(namespace="dagster-gpu", secret_env=()), create_timeout_s=120,
                          rates={"default": 1.0}, sharing_failures=memory)
    b.claims = _NoWatch()
    pod = kube.body["metadata"]
    handle = {"namespace": "dagster-gpu", "pod": pod["name"], "pod_uid": pod["uid"], "template": pod["name"],
              "sharing": "TimeSlicing", "placement_device": "NVIDIA A100-SXM4-80GB", "launched_at": time.time() - 3}
    s = b.state(handle)
    assert s.status == WorkerStatus.FAILED and s.abandoned and "FailedPrepareDynamicResources" in s.message
    assert list(memory.blocked()) == ["NVIDIA A100-SXM4-80GB"]
    assert "invalid GPU sharing settings" in memory.blocked()["NVIDIA A100-SXM4-80GB"]
    assert b.policy_state().no_sharing == ("NVIDIA A100-SXM4-80GB",)
    # an unshared claim that failed to prepare says nothing about sharing
    memory2 = SharingFailures(None)
    b2 = KubernetesBackend(_PreparedKube(), m.PodSettings(namespace="dagster-gpu", secret_env=()),
                           rates={"default": 1.0}, sharing_failures=memory2)
    b2.claims = _NoWatch()
    assert b2.state({**handle, "sharing": ""}).status == WorkerStatus.FAILED and memory2.blocked() == {}


# ---------------------------------------------------------------------------------- preempted pods (recorded)
def _recorded(name):
    import json
    from pathlib import Path

    return json.loads((Path(__file__).resolve().parent / "data" / "k8s" / name).read_text())


class _Gone(_Kube):
    """A pod that kube-scheduler preempted and its kubelet already removed: reads find nothing, deletes 404,
    its events (recorded, tests/data/k8s/record_k8s_preempted.py) include the scheduler's ``Preempted``."""

    def __init__(self, events):
        super().__init__()
        self.pod, self.events = None, events

    def pod_events(self, name):
        return self.events

    def read_claim(self, name):
        return None  # the resourceclaim controller deleted it with its pod


def _preempted_backend(events):
    from dagster_gpu.k8s.handle import PodHandle

    pod = _recorded("pod_preempted.json")
    kube = _Gone(events)
    b = KubernetesBackend(kube, m.PodSettings(namespace="dagster-gpu", secret_env=()), rates={"default": 1.0})
    b.claims = b.pods = _NoWatch()
    h = PodHandle(namespace="dagster-gpu", pod=pod["metadata"]["name"], pod_uid=pod["metadata"]["uid"],
                  device_type="mig-1g.10gb", device_fraction=1 / 7, launched_at=time.time() - 30).to_handle()
    return b, kube, h, pod


def test_a_pod_gone_before_any_read_is_preempted_by_the_schedulers_event_and_deleted_outside_otherwise():
    events = _recorded("events_preempted.json")
    b, _, h, _ = _preempted_backend(events)
    st = b.state(h)
    assert st.status == WorkerStatus.PREEMPTED
    assert st.message.endswith("was preempted (Preempted: Preempted by pod eff0e794-4a81-4d26-8e52-afea75b001fc "
                               "on node gpu-node-0) and is gone")
    # another pod's Preempted event (an earlier pod of the same name) says nothing about this one
    other = [{**e, "involvedObject": {**e["involvedObject"], "uid": "another"}} for e in events]
    b2, _, h2, _ = _preempted_backend(other)
    assert b2.state(h2).status == WorkerStatus.FAILED


def test_a_preempted_pod_seen_by_the_watch_is_billed_once_though_nobody_can_delete_it():
    from kubernetes.client import ApiClient

    b, kube, h, pod = _preempted_backend([])
    model = ApiClient()._ApiClient__deserialize(pod, "V1Pod")  # what the watch hands over (the DELETED object)
    b._observe(model)
    st = b.state(h)
    assert (st.status, st.exit_code) == (WorkerStatus.PREEMPTED, 143)
    assert "PreemptionByScheduler: default-scheduler: preempting to accommodate a higher priority pod" in st.message
    bill = b.accounting(h)
    assert bill.metadata["k8s/running_seconds"] == 1.0 and bill.gpu_seconds == pytest.approx(1 / 7)
    assert b.elect_bill_writer(h) is True  # the delete found it gone: the process that saw it end writes the bill
    assert b.elect_bill_writer(h) is False  # once
