"""KubernetesBackend's state under concurrent callers (finalizer thread vs health check), without a cluster.

The CI failure this guards against: the finalizer thread gave up on a stuck pod (deleted it) and only
then remembered why; a health check reading the pod in between reported "does not exist" instead of
the kubelet's reason.
"""

from __future__ import annotations

import time

from kubernetes.client import (V1ContainerState, V1ContainerStateWaiting, V1ContainerStatus, V1ObjectMeta, V1Pod,
                               V1PodSpec, V1PodStatus)

from dagster_gpu.executor.backends.base import WorkerStatus
from dagster_gpu.executor.backends.kubernetes import KubernetesBackend
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
        self.on_delete = None
        self.deleted: list[str] = []

    def read_pod(self, name):
        if self.on_read is not None:
            hook, self.on_read = self.on_read, None
            hook()
        return self.pod

    def delete_pod(self, name, uid=None):
        if self.on_delete is not None:
            self.on_delete()
        self.deleted.append(name)
        self.pod = None

    def delete_claim_template(self, name):
        self.deleted.append(name)

    def delete_claim(self, name):
        self.deleted.append(name)


def _backend():
    kube = _Kube()
    b = KubernetesBackend(kube, m.K8sSettings(namespace="ns", secret_env=()), pending_timeout_s=30,
                          create_timeout_s=4, rates={"default": 1.0}, report_observations=False)
    b.claims = _NoWatch()
    handle = {"namespace": "ns", "pod": "p", "pod_uid": UID, "template": "t", "launched_at": time.time() - 10}
    b._active[UID] = handle  # as if launched by this process (no finalizer thread: the test is the other thread)
    return b, kube, handle


def test_health_check_racing_the_give_up_reports_the_kubelet_reason():
    b, kube, h = _backend()
    # While this call is between "not yet final" and reading the pod, the other thread gives up and deletes it.
    kube.on_read = lambda: b._state(h)
    s = b.state(h)
    assert s.status == WorkerStatus.FAILED
    assert "not started after" in s.message and "CreateContainerConfigError" in s.message, s.message
    assert kube.deleted == ["p", "t"]


def test_give_up_is_remembered_before_the_pod_is_deleted():
    b, kube, h = _backend()
    seen = []
    kube.on_delete = lambda: seen.append(b.state(h))  # a health check at the moment of the delete
    s = b.state(h)
    assert seen and seen[0] == s and "CreateContainerConfigError" in seen[0].message


def test_a_pod_deleted_by_someone_else_still_fails_with_a_clear_message():
    b, kube, h = _backend()
    kube.pod = None
    s = b.state(h)
    assert s.status == WorkerStatus.FAILED and "does not exist" in s.message and UID in s.message
