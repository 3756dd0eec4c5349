"""Reading Kueue's decisions (dagster_gpu/k8s/kueue.py) from Workload and pod JSON.

The fixtures are shaped as sigs.k8s.io/kueue v0.17.0 writes them: condition types and reasons from
``apis/kueue/v1beta2/workload_types.go``; the pending message from ``pkg/scheduler/flavorassigner/flavorassigner.go``
(``fitsResourceQuota``) set with reason ``Pending`` by ``pkg/scheduler/scheduler.go``; the inadmissible one from
``pkg/controller/core/workload_controller.go``; the preemption message from ``pkg/scheduler/preemption/preemption.go``
(``preemptionMessage``); the pod's ``TerminationTarget`` condition from ``pkg/controller/jobs/pod/pod_controller.go``
(``Stop``) with the reason ``WorkloadEvictedDueTo<reason>`` of ``pkg/controller/jobframework/reconciler.go``.
"""

from __future__ import annotations

from dagster_gpu.k8s import kueue
from dagster_gpu.k8s.pod_state import PodTimeouts, disruption, pod_state
from dagster_gpu.contracts import WorkerStatus

PREEMPT_MSG = ("Preempted to accommodate a workload (UID: 5c0d-wl, JobUID: 9f1e-pod) due to reclamation within the "
               "cohort; preemptor path: /gpus/online; preemptee path: /gpus/batch")


def _wl(conditions, admission=None, uid="pod-uid-1", queue="batch"):
    st = {"conditions": conditions}
    if admission:
        st["admission"] = admission
    return {"metadata": {"name": "pod-step-1-ab12c", "labels": {kueue.JOB_UID_LABEL: uid},
                         "creationTimestamp": "2026-12-07T20:00:00Z"},
            "spec": {"queueName": queue}, "status": st}


def _c(typ, status, reason, message="", t="2026-12-07T20:00:05Z"):
    return {"type": typ, "status": status, "reason": reason, "message": message, "lastTransitionTime": t}


def test_pending_for_quota_is_waiting_and_says_why():
    msg = ("couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor a100, "
           "1 more needed")
    st = kueue.workload_state(_wl([_c("QuotaReserved", "False", "Pending", msg)]))
    assert (st.phase, st.reason, st.queue, st.never_fits) == ("pending", "Pending", "batch", False)
    assert st.describe() == f"Kueue LocalQueue batch: pending (Pending: {msg})"


def test_no_flavor_fits_and_inadmissible_can_never_be_admitted():
    nofit = ("couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in flavor a100, previously "
             "considered podsets requests (0) + current podset request (3) > maximum capacity (2)")
    assert kueue.workload_state(_wl([_c("QuotaReserved", "False", "Pending", nofit)])).never_fits
    st = kueue.workload_state(_wl([_c("QuotaReserved", "False", "Inadmissible", "LocalQueue nope doesn't exist")], queue="nope"))
    assert st.phase == "inadmissible" and st.never_fits
    assert st.describe() == "Kueue LocalQueue nope: inadmissible (Inadmissible: LocalQueue nope doesn't exist)"


def test_not_yet_considered_is_pending_without_a_reason():
    st = kueue.workload_state(_wl([]))
    assert st.phase == "pending" and not st.never_fits
    assert st.describe() == "Kueue LocalQueue batch: pending (not yet considered by Kueue)"


def test_admitted_names_its_cluster_queue_and_flavors():
    adm = {"clusterQueue": "batch", "podSetAssignments": [{"name": "main", "flavors": {"nvidia.com/gpu": "a100"},
                                                             "count": 1}]}
    st = kueue.workload_state(_wl([_c("QuotaReserved", "True", "QuotaReserved"), _c("Admitted", "True", "Admitted",
                                                                                     t="2026-12-07T20:00:07Z")], adm))
    assert (st.phase, st.cluster_queue, dict(st.flavors)) == ("admitted", "batch", {"nvidia.com/gpu": "a100"})
    assert st.admitted_at - st.created_at == 7.0
    assert st.describe() == "Kueue LocalQueue batch: admitted by ClusterQueue batch (flavors nvidia.com/gpu=a100)"


def test_evicted_by_reclamation_names_the_preemptor():
    st = kueue.workload_state(_wl([_c("Evicted", "True", "Preempted", PREEMPT_MSG),
                                   _c("Preempted", "True", "InCohortReclamation", PREEMPT_MSG)]))
    assert (st.phase, st.reason, st.preempted_reason) == ("evicted", "Preempted", "InCohortReclamation")
    assert st.preemptor == kueue.Preemptor("5c0d-wl", "9f1e-pod", "reclamation within the cohort")
    assert st.describe() == f"Kueue LocalQueue batch: evicted (Preempted: {PREEMPT_MSG})"


def test_pod_workload_picks_the_pods_newest_workload():
    a, b, other = _wl([]), _wl([]), _wl([], uid="someone-else")
    b["metadata"]["creationTimestamp"] = "2026-12-07T20:01:00Z"
    assert kueue.pod_workload([a, other, b], "pod-uid-1") is b
    assert kueue.pod_workload([other], "pod-uid-1") is None


def _pod(conditions, phase="Running", gates=(), deleting=False):
    meta = {"name": "step-1", "namespace": "dagster-gpu", "uid": "pod-uid-1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-07T20:02:00Z"
    cs = [{"name": "step", "state": {"terminated": {"exitCode": 143, "reason": "Error"}}}] if phase == "Failed" else []
    return {"metadata": meta, "spec": {"schedulingGates": [{"name": g} for g in gates]},
            "status": {"phase": phase, "conditions": conditions, "containerStatuses": cs}}


def test_a_pod_kueue_evicted_is_preempted_and_requeued_like_a_scheduler_preemption():
    cond = _c("TerminationTarget", "True", "WorkloadEvictedDueToPreempted", PREEMPT_MSG)
    pod = _pod([cond], phase="Failed", deleting=True)
    assert disruption(pod) == f"Kueue WorkloadEvictedDueToPreempted: {PREEMPT_MSG}"
    v = pod_state(pod, 30.0, PodTimeouts(pending_s=300, create_s=120, pull_s=1800))
    assert v.state.status == WorkerStatus.PREEMPTED and v.action == "finish"
    assert "9f1e-pod" in v.state.message and "reclamation within the cohort" in v.state.message


def test_a_pod_kueue_stopped_for_another_reason_is_no_preemption():
    pod = _pod([_c("TerminationTarget", "True", "NotAdmitted", "Not admitted by cluster queue")], phase="Failed")
    assert kueue.eviction(pod) is None and disruption(pod) is None
    assert pod_state(pod, 30.0, PodTimeouts(pending_s=300, create_s=120, pull_s=1800)).state.status == WorkerStatus.FAILED


def test_gated_means_kueue_still_holds_the_pod():
    assert kueue.gated(_pod([], phase="Pending", gates=[kueue.ADMISSION_GATE]))
    assert not kueue.gated(_pod([], phase="Pending", gates=["example.com/other"]))
