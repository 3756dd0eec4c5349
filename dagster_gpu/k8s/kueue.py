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
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

API_GROUP = "kueue.x-k8s.io"
API_VERSION = "v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
TERMINATION_TARGET = "TerminationTarget"
EVICTED_STOP_REASON = "WorkloadEvicted"

PENDING, ADMITTED, INADMISSIBLE, EVICTED, FINISHED = "pending", "admitted", "inadmissible", "evicted", "finished"

#: the flavor assigner's "no fit" message: the request exceeds the maximum capacity, waiting cannot help
_NO_FIT = re.compile(r"insufficient quota for \S+ in flavor \S+, .*> maximum capacity")
_PREEMPTOR = re.compile(r"Preempted to accommodate a workload \(UID: ([^,]+), JobUID: ([^)]+)\) due to ([^;]+)")


def _cond(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def _true(c: Mapping[str, Any] | None) -> bool:
    return c is not None and c.get("status") == "True"


def _epoch(ts: str | None) -> float | None:
    if not ts:
        return None
    try:
        return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


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
    base = dict(name=meta.get("name", ""), queue=spec.get("queueName", ""), created_at=_epoch(meta.get("creationTimestamp")),
                cluster_queue=admission.get("clusterQueue"), flavors=flavors, preempted_reason=pre_reason)
    if _true(finished):
        return WorkloadState(phase=FINISHED, reason=finished.get("reason", ""), message=finished.get("message", ""), **base)
    if _true(evicted):
        msg = evicted.get("message", "")
        return WorkloadState(phase=EVICTED, reason=evicted.get("reason", ""), message=msg,
                             preemptor=preemptor(msg) or preemptor((preempted or {}).get("message", "")), **base)
    if _true(admitted):
        return WorkloadState(phase=ADMITTED, reason=admitted.get("reason", ""), message=admitted.get("message", ""),
                             admitted_at=_epoch(admitted.get("lastTransitionTime")), **base)
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


def eviction(pod: Mapping[str, Any]) -> str | None:
    """``"Kueue <reason>: <message>"`` of the pod's ``TerminationTarget=True`` condition when Kueue stopped it
    because its Workload was evicted (reason ``WorkloadEvicted...``), else None."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == TERMINATION_TARGET and c.get("status") == "True" \
                and (c.get("reason") or "").startswith(EVICTED_STOP_REASON):
            return ": ".join(x for x in (f"Kueue {c.get('reason')}", (c.get("message") or "").strip()) if x)
    return None
