"""What Kueue decided about a step pod (pure): its Workload's state, an eviction, a queue's backlog.

A step pod that names a LocalQueue (label ``kueue.x-k8s.io/queue-name``) is a plain pod Kueue manages (its pod
integration): Kueue's webhook gates it (scheduling gate :data:`ADMISSION_GATE`), creates a Workload labelled
:data:`JOB_UID_LABEL` = the pod's UID, and removes the gate once the Workload is admitted. Everything here reads
the ``kueue.x-k8s.io/v1beta2`` objects as API JSON (dicts), sigs.k8s.io/kueue v0.17.0:

* conditions (``apis/kueue/v1beta2/workload_types.go``): ``QuotaReserved``, ``Admitted``, ``Evicted``,
  ``Preempted``, ``Finished``. Pending: ``QuotaReserved=False`` reason ``Pending`` with the flavor assigner's
  message (``pkg/scheduler/scheduler.go``; ``pkg/scheduler/flavorassigner/flavorassigner.go``: "insufficient
  unused quota for R in flavor F, N more needed" may clear; "insufficient quota for R in flavor F, ... >
  maximum capacity (M)" never will: the request exceeds what the ClusterQueue and its cohort could ever
  give). Inadmissible: reason ``Inadmissible`` (``pkg/controller/core/workload_controller.go``: a missing or
  stopped LocalQueue / ClusterQueue, a DRA claim Kueue cannot count).
* admission: ``status.admission.clusterQueue`` and ``podSetAssignments[].flavors`` (resource -> flavor).
* eviction of a plain pod (``pkg/controller/jobs/pod/pod_controller.go`` ``Stop``): the pod gets the condition
  ``TerminationTarget=True`` with reason ``WorkloadEvictedDueTo<Evicted reason>`` (``Preempted``,
  ``ClusterQueueStopped``...; ``pkg/controller/jobframework/reconciler.go``) and the Evicted condition's message,
  then is deleted. A preemption's message names the preemptor ("Preempted to accommodate a workload (UID: u,
  JobUID: j) due to reclamation within the cohort; ...", ``pkg/scheduler/preemption/preemption.go``).
* a queue's backlog and quota for the policy (:func:`queue_state`): the LocalQueue's ``status.pendingWorkloads``
  / ``admittedWorkloads``, the ClusterQueues' ``spec.resourceGroups`` quotas and ``status.flavorsReservation``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from kubernetes.utils import parse_quantity

from dagster_gpu.k8s.pod_state import epoch
from dagster_gpu.k8s.pod_state import kueue_eviction as eviction  # noqa: F401  (re-exported: Kueue's eviction of a pod)
from dagster_gpu.policy.snapshot import DeviceGroup, QueueState

API_GROUP = "kueue.x-k8s.io"
API_VERSION = "v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
ADMISSION_GATE = "kueue.x-k8s.io/admission"

PENDING, ADMITTED, INADMISSIBLE, EVICTED, FINISHED = "pending", "admitted", "inadmissible", "evicted", "finished"

#: the flavor assigner's "no fit" message: the request exceeds the maximum capacity, waiting cannot help
_NO_FIT = re.compile(r"insufficient quota for \S+ in flavor \S+, .*> maximum capacity")
_PREEMPTOR = re.compile(r"Preempted to accommodate a workload \(UID: ([^,]+), JobUID: ([^)]+)\) due to ([^;]+)")


def _cond(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def _true(c: Mapping[str, Any] | None) -> bool:
    return c is not None and c.get("status") == "True"


@dataclass(frozen=True)
class Preemptor:
    """Who an eviction was for (parsed from the Evicted/Preempted message), and why."""

    workload_uid: str
    job_uid: str  # the preemptor's pod (or job) UID
    reason: str  # "reclamation within the cohort", "prioritization in the ClusterQueue"...


def preemptor(message: str) -> Preemptor | None:
    """The preemptor named in a Kueue preemption message, or None when the message names none."""
    m = _PREEMPTOR.search(message or "")
    return Preemptor(m.group(1).strip(), m.group(2).strip(), m.group(3).strip()) if m else None


@dataclass(frozen=True)
class WorkloadState:
    """A Workload as Kueue left it.

    Attributes:
        name: the Workload's name; queue: its LocalQueue (``spec.queueName``).
        phase: :data:`PENDING`, :data:`ADMITTED`, :data:`INADMISSIBLE`, :data:`EVICTED` or :data:`FINISHED`.
        reason, message: the deciding condition's (``QuotaReserved`` while pending/inadmissible, ``Evicted``,
            ``Admitted``, ``Finished``); "" when Kueue has not looked at it yet.
        cluster_queue: the admitting ClusterQueue (None until admitted).
        flavors: resource name -> ResourceFlavor of the admission (``{"nvidia.com/gpu": "a100"}``).
        preempted_reason: the ``Preempted`` condition's reason (``InCohortReclamation``...), else None.
        preemptor: who it was preempted for, from the eviction message, else None.
        created_at, admitted_at: epoch seconds (None when unknown / not admitted).
    """

    name: str
    queue: str
    phase: str
    reason: str = ""
    message: str = ""
    cluster_queue: str | None = None
    flavors: Mapping[str, str] = field(default_factory=dict)
    preempted_reason: str | None = None
    preemptor: Preemptor | None = None
    created_at: float | None = None
    admitted_at: float | None = None

    @property
    def never_fits(self) -> bool:
        """Kueue can never admit it as asked: inadmissible, or a flavor assigner "no fit" (the request exceeds
        the maximum capacity of the ClusterQueue with everything it may borrow)."""
        return self.phase == INADMISSIBLE or (self.phase == PENDING and bool(_NO_FIT.search(self.message)))

    def describe(self) -> str:
        """One line for a log or a failure: ``Kueue LocalQueue batch: pending (Pending: insufficient ...)``."""
        head = f"Kueue LocalQueue {self.queue or '?'}"
        if self.phase == ADMITTED:
            fl = ", ".join(f"{r}={f}" for r, f in sorted(self.flavors.items()))
            return f"{head}: admitted by ClusterQueue {self.cluster_queue}" + (f" (flavors {fl})" if fl else "")
        why = ": ".join(x for x in (self.reason, self.message) if x)
        return f"{head}: {self.phase}" + (f" ({why})" if why else " (not yet considered by Kueue)")


def workload_state(wl: Mapping[str, Any]) -> WorkloadState:
    """The :class:`WorkloadState` of a Workload (API JSON)."""
    meta, spec, st = wl.get("metadata") or {}, wl.get("spec") or {}, wl.get("status") or {}
    admission = st.get("admission") or {}
    flavors: dict[str, str] = {}
    for psa in admission.get("podSetAssignments") or []:
        flavors.update({str(k): str(v) for k, v in (psa.get("flavors") or {}).items()})
    finished, evicted, admitted = _cond(wl, "Finished"), _cond(wl, "Evicted"), _cond(wl, "Admitted")
    reserved, preempted = _cond(wl, "QuotaReserved"), _cond(wl, "Preempted")
    pre_reason = preempted.get("reason") if _true(preempted) else None
    base = dict(name=meta.get("name", ""), queue=spec.get("queueName", ""), created_at=epoch(meta.get("creationTimestamp")),
                cluster_queue=admission.get("clusterQueue"), flavors=flavors, preempted_reason=pre_reason)
    if _true(finished):
        return WorkloadState(phase=FINISHED, reason=finished.get("reason", ""), message=finished.get("message", ""), **base)
    if _true(evicted):
        msg = evicted.get("message", "")
        return WorkloadState(phase=EVICTED, reason=evicted.get("reason", ""), message=msg,
                             preemptor=preemptor(msg) or preemptor((preempted or {}).get("message", "")), **base)
    if _true(admitted):
        return WorkloadState(phase=ADMITTED, reason=admitted.get("reason", ""), message=admitted.get("message", ""),
                             admitted_at=epoch(admitted.get("lastTransitionTime")), **base)
    if reserved is not None and not _true(reserved):
        phase = INADMISSIBLE if reserved.get("reason") == "Inadmissible" else PENDING
        return WorkloadState(phase=phase, reason=reserved.get("reason", ""), message=reserved.get("message", ""), **base)
    return WorkloadState(phase=PENDING, **base)


def pod_workload(workloads: Iterable[Mapping[str, Any]], pod_uid: str) -> Mapping[str, Any] | None:
    """The newest Workload labelled :data:`JOB_UID_LABEL` = ``pod_uid`` (Kueue's pod integration), or None."""
    mine = [w for w in workloads if ((w.get("metadata") or {}).get("labels") or {}).get(JOB_UID_LABEL) == pod_uid]
    return max(mine, key=lambda w: (w.get("metadata") or {}).get("creationTimestamp") or "", default=None)


def gated(pod: Mapping[str, Any]) -> bool:
    """Whether Kueue still holds the pod (its :data:`ADMISSION_GATE` scheduling gate: not admitted yet)."""
    return any(g.get("name") == ADMISSION_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])




def local_queue_inactive(lq: Mapping[str, Any]) -> str:
    """``"<reason>: <message>"`` of a LocalQueue's ``Active=False`` condition (its ClusterQueue missing or inactive,
    the queue stopped: ``pkg/controller/core/localqueue_controller.go``), "" when active or not yet reported."""
    c = _cond(lq, "Active")
    if c is None or _true(c):
        return ""
    return ": ".join(x for x in (c.get("reason") or "Inactive", (c.get("message") or "").strip()) if x)


def resource_name(mig_profile: str | None) -> str:
    """The Kueue resource a pool's devices are quota'd as: ``nvidia.com/mig-<profile>`` for a MIG slice,
    ``nvidia.com/gpu`` for a whole GPU (NVIDIA's extended-resource names, which the site's
    ``resources.deviceClassMappings`` give the DeviceClasses: resources/k8s/kueue/config.yaml)."""
    return f"nvidia.com/mig-{mig_profile}" if mig_profile else "nvidia.com/gpu"


def _qty(v: Any) -> float:
    return float(parse_quantity(str(v))) if v is not None else 0.0


def _quota(cq: Mapping[str, Any], resource: str, key: str) -> float | None:
    """Sum of ``key`` (nominalQuota, borrowingLimit, lendingLimit) of ``resource`` over the ClusterQueue's
    flavors; None when no flavor sets it."""
    vals = [r.get(key) for g in (cq.get("spec") or {}).get("resourceGroups") or [] for f in g.get("flavors") or []
            for r in f.get("resources") or [] if r.get("name") == resource]
    vals = [v for v in vals if v is not None]
    return sum(_qty(v) for v in vals) if vals else None


def _used(cq: Mapping[str, Any], resource: str) -> float:
    """What admitted (quota-reserving) workloads hold of ``resource`` (``status.flavorsReservation``)."""
    return sum(_qty(r.get("total")) for f in (cq.get("status") or {}).get("flavorsReservation") or []
               for r in f.get("resources") or [] if r.get("name") == resource)


def quota_room(cq: Mapping[str, Any], cohort: Iterable[Mapping[str, Any]], resource: str) -> tuple[float, float]:
    """``(free, total)`` of ``resource`` for ClusterQueue ``cq``: free = its unused nominal quota plus what it may
    borrow now (the other ClusterQueues of its cohort's unused quota, each up to its ``lendingLimit``, less what
    ``cq`` already borrows, capped by ``cq``'s ``borrowingLimit``); total = nominal plus the most it may borrow
    (Kueue v0.17.0 ``apis/kueue/v1beta2/clusterqueue_types.go``: nominalQuota, borrowingLimit, lendingLimit;
    a flat cohort, no Cohort object quotas)."""
    nominal = _quota(cq, resource, "nominalQuota") or 0.0
    used = _used(cq, resource)
    borrowed = max(0.0, used - nominal)
    limit = _quota(cq, resource, "borrowingLimit")
    lendable = lend_total = 0.0
    for o in cohort:
        o_nominal = _quota(o, resource, "nominalQuota") or 0.0
        o_lend = _quota(o, resource, "lendingLimit")
        o_lend = o_nominal if o_lend is None else min(o_lend, o_nominal)
        lend_total += o_lend
        lendable += max(0.0, min(o_lend, o_nominal - _used(o, resource)))
    borrowable = max(0.0, lendable - borrowed)
    if limit is not None:
        borrowable = min(borrowable, max(0.0, limit - borrowed))
    total = nominal + (lend_total if limit is None else min(limit, lend_total))
    return max(0.0, nominal - used) + borrowable, total


def pending_ahead(summary: Mapping[str, Any] | None) -> int | None:
    """Workloads a new one would find ahead of it in its ClusterQueue, from the visibility API's
    ``PendingWorkloadsSummary`` of that ClusterQueue (sigs.k8s.io/kueue v0.17.0 ``apis/visibility/v1beta1/types.go``:
    ``items[]`` with ``positionInClusterQueue``, 0-based, in the queue's order; at most 1000 items by default,
    ``pkg/constants/constants.go`` ``DefaultPendingWorkloadsLimit``): the last position + 1, 0 for an empty queue.
    None when the API is not served (``summary`` None)."""
    if summary is None:
        return None
    positions = [int(i.get("positionInClusterQueue", -1)) for i in summary.get("items") or []]
    return max(positions, default=-1) + 1


def queue_state(local_queue: Mapping[str, Any] | None, cluster_queues: Iterable[Mapping[str, Any]], queue_name: str,
                pools: Iterable[DeviceGroup], pending_workloads: Mapping[str, Any] | None = None) -> QueueState:
    """The policy's :class:`~dagster_gpu.policy.snapshot.QueueState` of LocalQueue ``queue_name`` (its API JSON, None
    when it does not exist: an inactive queue with no ClusterQueue) from every ClusterQueue (API JSON): admitted
    workloads from the LocalQueue's status; pending ones ahead from the visibility API's summary of its
    ClusterQueue (``pending_workloads``, :func:`pending_ahead`: every LocalQueue feeding that ClusterQueue
    competes) where served, else the LocalQueue's ``status.pendingWorkloads``; each pool's quota from
    :func:`quota_room` with the pool's :func:`resource_name`."""
    pools = list(pools)
    if local_queue is None:
        return QueueState(local_queue=queue_name, active=False)
    cqs = list(cluster_queues)
    name = (local_queue.get("spec") or {}).get("clusterQueue", "")
    cq = next((c for c in cqs if (c.get("metadata") or {}).get("name") == name), None)
    lq_status = local_queue.get("status") or {}
    ahead = pending_ahead(pending_workloads)
    base = dict(local_queue=queue_name, pending=int(lq_status.get("pendingWorkloads") or 0) if ahead is None else ahead,
                admitted=int(lq_status.get("admittedWorkloads") or 0))
    if cq is None:
        return QueueState(cluster_queue="", active=False, **base)
    cohort_name = (cq.get("spec") or {}).get("cohortName")
    cohort = [c for c in cqs if cohort_name and c is not cq and (c.get("spec") or {}).get("cohortName") == cohort_name]
    free, total = {}, {}
    for p in pools:
        free[p.device], total[p.device] = quota_room(cq, cohort, resource_name(p.mig_profile))
    active = _true(_cond(cq, "Active")) if _cond(cq, "Active") is not None else True
    return QueueState(cluster_queue=name, quota_free=free, quota_total=total, active=active, **base)


def queue_lines(queue: QueueState | None, chosen: Iterable[Any]) -> list[str]:
    """What ``whatif``'s table says of the Kueue queue: one line per device the plan put on Kubernetes (``chosen``:
    the plan's chosen alternatives, objects with ``backend`` and ``device``), each with that pool's quota
    (:meth:`QueueState.describe`), or one line without a device when none went there; [] without a queue."""
    if queue is None:
        return []
    devices = sorted({a.device for a in chosen if a is not None and a.backend == "kubernetes" and a.device})
    return [f"queue on kubernetes: {queue.describe(d)}" for d in devices] or [f"queue on kubernetes: {queue.describe()}"]
