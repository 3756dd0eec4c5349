"""KubernetesBackend with ``queue_name`` on the real control plane and the real Kueue v0.17.0 manager
(resources/k8s/cluster.sh), as the executor's ServiceAccount: what Kueue decides is read back.

Kueue behaviour relied on (sigs.k8s.io/kueue v0.17.0): the Workload of a pod whose LocalQueue does not exist gets
no condition at all (``pkg/cache/queue/manager.go`` ``ErrLocalQueueDoesNotExistOrInactive``, the workload
reconciler retrying), so the backend checks the LocalQueue before it creates anything; ``pkg/scheduler/flavorassigner/flavorassigner.go`` reports a request larger than
the ClusterQueue can ever hold as "insufficient quota for <resource> in flavor <flavor>, ... > maximum capacity";
``pkg/controller/jobs/pod/pod_webhook.go`` gates a queued pod (``kueue.x-k8s.io/admission``) until admission.
The queues are resources/k8s/kueue/example/mixed-cluster.yaml's (tests/test_kueue_e2e.py applies them).
"""

from __future__ import annotations

import pytest

from dagster_gpu.contracts import WorkerStatus
from dagster_gpu.core.request import GpuRequest
from dagster_gpu.k8s import manifests as m
from dagster_gpu.k8s.backend import KubernetesBackend
from dagster_gpu.k8s.client import KubeClient
from tests.k8s_helpers import NAMESPACE, executor_api, labelled, require_cluster, wait_for
from tests.test_k8s_backend import _launch
from tests.test_kueue_e2e import _apply_example

pytestmark = [pytest.mark.k8s, pytest.mark.e2e]


def _backend(queue: str, **kw) -> KubernetesBackend:
    require_cluster()
    _apply_example()
    settings = m.PodSettings(namespace=NAMESPACE, secret_env=(), termination_grace_period_seconds=5, queue_name=queue)
    return KubernetesBackend(KubeClient(executor_api(), NAMESPACE), settings, **kw)


def _gone(run_id: str) -> bool:
    return labelled(executor_api(), m.run_selector(run_id)) == {"pods": [], "claims": [], "templates": []}


def test_a_pod_whose_local_queue_does_not_exist_is_refused_at_launch_with_kueues_reason():
    b = _backend("no-such-queue")
    launch = _launch(["sleep", "1"], GpuRequest(mig_ok=True), device="mig-1g.10gb")
    with pytest.raises(RuntimeError, match="Kueue cannot admit pod dagster-gpu/.* for partition 'p-0': Kueue LocalQueue "
                                           "dagster-gpu/no-such-queue does not exist \\(kubernetes.queue_name\\)"):
        b.launch(launch)
    assert wait_for(lambda: _gone(launch.run_id), 60, what="the refused pod and its template deleted")


def test_a_request_larger_than_the_queue_can_ever_hold_is_refused_at_launch():
    b = _backend("batch")  # batch borrows at most online's 2 whole GPUs
    launch = _launch(["sleep", "1"], GpuRequest(count=3), device="NVIDIA A100-SXM4-80GB")
    with pytest.raises(RuntimeError, match="Kueue LocalQueue batch: pending \\(Pending: couldn't assign flavors to pod "
                                           "set main: insufficient quota for nvidia.com/gpu in flavor a100-80gb, .*> "
                                           "maximum capacity \\(2\\)"):
        b.launch(launch)
    assert wait_for(lambda: _gone(launch.run_id), 60, what="the refused pod and its template deleted")


def test_a_queued_pod_past_queue_timeout_fails_naming_the_queue_and_the_policy_sees_the_quota():
    b = _backend("batch", queue_timeout_s=3)
    q = b.policy_state().queue
    assert (q.local_queue, q.cluster_queue, q.active) == ("batch", "batch", True)
    assert q.quota_total["mig-1g.10gb"] == 2 and q.quota_total["NVIDIA A100-SXM4-80GB"] == 2
    # both slices asked at once by a unit that can be admitted but finds them taken is pending, then times out:
    # two 1-slice pods hold the borrowed quota while a third waits
    holders = [_launch(["sleep", "30"], GpuRequest(mig_ok=True), device="mig-1g.10gb", pk=f"p-{i}") for i in range(2)]
    handles = [b.launch(x) for x in holders]
    wait_for(lambda: all(b.state(h).status == WorkerStatus.RUNNING for h in handles), 120, what="two slices admitted")
    # the ClusterQueue's status.flavorsReservation follows admissions asynchronously (Kueue's ClusterQueue
    # reconciler updates the status after the workload cache: pkg/controller/core/clusterqueue_controller.go), so
    # the policy sees the borrowed slices taken once that status has caught up, not at the pods' start
    assert wait_for(lambda: b.policy_state().queue.quota_free["mig-1g.10gb"] == 0, 30,
                    what="the ClusterQueue's status to count both slices reserved")
    waiting = _launch(["sleep", "1"], GpuRequest(mig_ok=True), device="mig-1g.10gb", pk="p-9")
    h = b.launch(waiting)
    st = wait_for(lambda: (lambda s: s if s.status == WorkerStatus.FAILED else None)(b.state(h)), 60,
                  what="the queued pod to time out")
    assert st.abandoned and "waited" in st.message and "for Kueue LocalQueue batch to admit it (> queue_timeout_seconds=3)" in st.message
    assert "insufficient unused quota for nvidia.com/mig-1g.10gb in flavor mig-1g.10gb" in st.message, st.message
    for x in [h, *handles]:
        b.terminate(x)
    for x in [waiting, *holders]:
        assert wait_for(lambda: _gone(x.run_id), 90, what="cleanup")


def test_where_the_visibility_api_is_not_served_the_policy_reads_the_local_queues_status():
    # resources/k8s/cluster.sh runs the manager with VisibilityOnDemand=false: no APIService, so the group
    # visibility.kueue.x-k8s.io is not served (the executor's ServiceAccount gets 403 or 404, never an error)
    b = _backend("batch")
    assert b.kube.read_pending_workloads("batch") is None
    lq = b.kube.read_local_queue("batch")
    q = b.policy_state().queue
    assert q.cluster_queue == "batch" and q.pending == int((lq.get("status") or {}).get("pendingWorkloads") or 0)
