"""A step pod's :class:`~dagster_gpu.contracts.WorkerState` from its API JSON and its events (pure, no I/O).

Input: the pod as the API server returns it (camelCase JSON, ``kubectl get pod -o json`` or
``ApiClient().sanitize_for_serialization(V1Pod)``), its age (seconds since launch), the timeouts, and the
pod's core/v1 Events (same JSON shape; the caller lists them by ``involvedObject.name`` for a Pending pod, see
:func:`needs_events`). Only events whose ``involvedObject.uid`` is the pod's count (an earlier pod of the same
name left its own). Rules:

* ``Succeeded`` / ``Failed`` -> SUCCEEDED / FAILED with the container's exit code (``terminated``), and
  action ``finish`` (the caller bills and deletes the pod). A failed pod's message is the kubelet's reason,
  then the container's ``terminated.message`` when it has one: the step pod's ``terminationMessagePolicy:
  FallbackToLogsOnError`` (:func:`dagster_gpu.k8s.pod.build_pod`) makes the kubelet fill it with the last 80
  lines, at most 2 KiB, of the container's log (``MaxContainerTerminationMessageLogLines`` / ``...LogLength``
  in ``pkg/kubelet/container/runtime.go``), so the step failure shows the worker's traceback after the pod is
  gone; a container that could not start has the runtime's error there instead.
* A ``DisruptionTarget=True`` condition (:func:`disruption`: the scheduler's preemption, the eviction API, a
  node drain, the taint manager, the kubelet's node shutdown set it right before they delete the pod) on a
  ``Failed`` pod -> PREEMPTED with the condition's reason and message, action ``finish``: the worker was
  stopped to make room, not broken, and the executor launches the unit again (``max_preemptions``). Kueue's
  eviction of a queued pod counts the same: its ``TerminationTarget=True`` condition with reason
  ``WorkloadEvictedDueTo<reason>`` (:func:`kueue_eviction`), which it sets before deleting the pod.
* ``deletionTimestamp`` set -> RUNNING ("pod is terminating", with the disruption when there is one).
* ``Running`` -> RUNNING.
* Pending, not bound to a node (no ``spec.nodeName``): PENDING with the scheduler's message (the
  ``PodScheduled=False`` condition with reason ``Unschedulable``, else the newest ``FailedScheduling``
  event); after ``pending_s`` -> FAILED, action ``give_up``.
* Pending and bound, a ``FailedPrepareDynamicResources`` Warning (the kubelet could not prepare the pod's DRA
  devices: the driver refused the claim, e.g. a sharing config whose driver feature gate is off) -> FAILED at
  once with the kubelet's message, action ``give_up``: the pod would stay ``ContainerCreating`` forever.
* Pending and bound, the image being pulled (the newest ``Pulling`` event has no ``Pulled`` after it) ->
  PENDING ("pulling image ..."), however long it takes up to ``pull_s`` since that pull began: a first pull
  of a multi-GB CUDA image takes minutes and is progress, not a stuck pod. The ``create_s`` clock starts
  again at the newest ``Pulled`` event.
* Pending and bound, its container not started ``create_s`` after launch (or after the newest ``Pulled``):
  waiting for a reason in :data:`STUCK_REASONS` (these never get the pull extension), ``ContainerCreating``
  or none -> FAILED with the kubelet's reason and message, action ``give_up`` (the caller deletes the pod,
  its template and its claims); else PENDING with the reason.

Every FAILED message of a bound pod ends with the pod's kubelet Warning events (:data:`KUBELET_WARNINGS`,
see :func:`kubelet_warnings`), so a step failure says what ``kubectl describe pod`` would.

Event reasons are the kubelet's (kubernetes/kubernetes v1.34 ``pkg/kubelet/events/event.go``: ``Pulling``,
``Pulled``, ``Failed``, ``BackOff``, ``FailedMount``, ``FailedCreatePodSandBox``,
``FailedPrepareDynamicResources``); waiting reasons are ``pkg/kubelet/images/types.go``'s (``ErrImagePull``,
``ImagePullBackOff``, ``InvalidImageName``, ``ErrImageNeverPull``, ``ImageInspectError``) and
``pkg/kubelet/kuberuntime``'s (``CreateContainerConfigError``, ``CreateContainerError``, ``RunContainerError``).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from dagster_gpu.contracts import WorkerState, WorkerStatus

#: Kubelet waiting reasons that mean the container will not start without intervention.
STUCK_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError", "ErrImagePull", "ImagePullBackOff",
                           "InvalidImageName", "ErrImageNeverPull", "ImageInspectError", "RunContainerError"})

#: The pod condition set on a pod about to be deleted by a disruption (k8s.io/api ``core/v1/types.go``:
#: "DisruptionTarget indicates the pod is about to be terminated due to a disruption (preemption, eviction
#: API, or garbage-collection)"). Reasons: ``PreemptionByScheduler`` (kube-scheduler's preemption, message
#: "<scheduler>: preempting to accommodate a higher priority pod", ``pkg/scheduler/framework/preemption``),
#: ``TerminationByKubelet`` (node shutdown, node-pressure eviction), ``EvictionByEvictionAPI`` (a drain),
#: ``DeletionByTaintManager``, ``DeletionByPodGC``.
DISRUPTION_TARGET = "DisruptionTarget"
#: kube-scheduler's Normal event on a victim pod, recorded after it deleted it: "Preempted by pod <uid> on
#: node <node>" (``pkg/scheduler/framework/preemption/preemption.go``); it outlives the pod (events are kept
#: an hour), so a pod gone before its condition was read is still known to have been preempted.
PREEMPTED_EVENT = "Preempted"

#: Kubelet event reasons (``pkg/kubelet/events/event.go``) of an image pull.
PULLING, PULLED = "Pulling", "Pulled"

#: The kubelet's reason when the DRA driver's NodePrepareResources failed (``pkg/kubelet/events/event.go``;
#: emitted by ``pkg/kubelet/kuberuntime/kuberuntime_manager.go`` SyncPod as "Failed to prepare dynamic
#: resources: %v").
FAILED_PREPARE = "FailedPrepareDynamicResources"

#: Warning reasons of a pod's kubelet events that explain why its container does not start: ``Failed``
#: (image pull / container create / start failed), ``BackOff`` (image pull back-off), ``FailedMount``,
#: ``FailedCreatePodSandBox``, ``FailedPrepareDynamicResources``.
KUBELET_WARNINGS = (FAILED_PREPARE, "Failed", "BackOff", "FailedMount", "FailedCreatePodSandBox")


@dataclass(frozen=True)
class PodTimeouts:
    """Seconds before a pod that will not run fails its step."""

    pending_s: float  # unschedulable, since launch (pending_timeout_seconds)
    create_s: float  # bound but its container not started, since launch or the last Pulled (create_timeout_seconds)
    pull_s: float = 1800.0  # one image pull in progress, since its Pulling event (image_pull_timeout_seconds)


@dataclass(frozen=True)
class PodVerdict:
    """``state`` of the step's worker and what the caller must do: ``none``, ``finish`` (the pod ended: bill
    it, delete it) or ``give_up`` (the pod will not run: delete it with its template and claims); ``cause``:
    :data:`FAILED_PREPARE` when the kubelet could not prepare the pod's DRA devices, else ""."""

    state: WorkerState
    action: str = "none"
    cause: str = ""


def _container_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((pod.get("status") or {}).get("containerStatuses") or [{}])[0] or {}


def terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The first container's ``state.terminated`` (exitCode, reason, message, startedAt, finishedAt) or None."""
    return (_container_status(pod).get("state") or {}).get("terminated")


def disruption(pod: Mapping[str, Any]) -> str | None:
    """``"<reason>: <message>"`` of the pod's ``DisruptionTarget=True`` condition, else of Kueue's eviction
    (``TerminationTarget`` with reason ``WorkloadEvicted...``: :func:`dagster_gpu.k8s.kueue.eviction`, a
    requeue like a preemption), or None without either."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == DISRUPTION_TARGET and c.get("status") == "True":
            return ": ".join(x for x in (c.get("reason") or "Disrupted", (c.get("message") or "").strip()) if x)
    return kueue_eviction(pod)


#: Kueue's condition on a pod it stops (sigs.k8s.io/kueue v0.17.0 ``pkg/controller/jobs/pod/pod_controller.go``
#: ``ConditionTypeTerminationTarget``) and the stop reason's prefix when its Workload was evicted
#: (``pkg/controller/jobframework/reconciler.go``: ``WorkloadEvictedDueTo<Evicted reason>``).
KUEUE_TERMINATION_TARGET = "TerminationTarget"
KUEUE_EVICTED_STOP_REASON = "WorkloadEvicted"


def kueue_eviction(pod: Mapping[str, Any]) -> str | None:
    """``"Kueue <reason>: <message>"`` of the pod's ``TerminationTarget=True`` condition when Kueue stopped it
    because its Workload was evicted (reason ``WorkloadEvicted...``), else None."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == KUEUE_TERMINATION_TARGET and c.get("status") == "True" \
                and (c.get("reason") or "").startswith(KUEUE_EVICTED_STOP_REASON):
            return ": ".join(x for x in (f"Kueue {c.get('reason')}", (c.get("message") or "").strip()) if x)
    return None


def preempted_event(events: Sequence[Mapping[str, Any]], pod_uid: str) -> str | None:
    """The message of kube-scheduler's newest :data:`PREEMPTED_EVENT` about the pod with ``pod_uid`` (API JSON
    events, core/v1 or events.k8s.io shape), or None."""
    hits = [e for e in events if e.get("reason") == PREEMPTED_EVENT
            and ((e.get("involvedObject") or e.get("regarding") or {}).get("uid") in (None, pod_uid))]
    if not hits:
        return None
    return f"{PREEMPTED_EVENT}: {max(hits, key=event_time).get('message') or ''}".rstrip(": ")


def unschedulable_message(pod: Mapping[str, Any]) -> str:
    """The ``PodScheduled=False`` condition's message when its reason is ``Unschedulable``, else ""."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled":
            return c.get("message") or "" if c.get("reason") == "Unschedulable" else ""
    return ""


def needs_events(pod: Mapping[str, Any]) -> bool:
    """True when :func:`pod_state` reads the pod's events: a Pending pod not being deleted (unbound without a
    condition that says why, or bound: kubelet events)."""
    st = pod.get("status") or {}
    if st.get("phase") != "Pending" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return bool((pod.get("spec") or {}).get("nodeName")) or not unschedulable_message(pod)


def needs_scheduler_events(pod: Mapping[str, Any]) -> bool:
    """True when :func:`pod_state` would use a ``FailedScheduling`` event's message: an unbound Pending pod
    whose conditions do not say why."""
    return needs_events(pod) and not (pod.get("spec") or {}).get("nodeName")


def epoch(s: str | None) -> float | None:
    """Unix seconds of an RFC 3339 timestamp as the API serialises it (``2026-11-30T15:32:50Z``), None when
    absent or unparsable."""
    if not s:
        return None
    try:
        return dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def event_time(ev: Mapping[str, Any]) -> float:
    """Epoch seconds of an event's newest occurrence (``lastTimestamp``, else ``eventTime``,
    ``firstTimestamp``, ``metadata.creationTimestamp``; 0.0 when none parses)."""
    for t in (ev.get("lastTimestamp"), ev.get("eventTime"), ev.get("firstTimestamp"),
              (ev.get("metadata") or {}).get("creationTimestamp")):
        e = epoch(t)
        if e is not None:
            return e
    return 0.0


def pod_events(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The events about this pod (its uid; an event without one counts), oldest first."""
    uid = (pod.get("metadata") or {}).get("uid")
    mine = [e for e in events if not uid or not (e.get("involvedObject") or {}).get("uid")
            or (e.get("involvedObject") or {}).get("uid") == uid]
    return sorted(mine, key=event_time)


def kubelet_warnings(events: Sequence[Mapping[str, Any]], limit: int = 4) -> list[str]:
    """``"<reason>: <message>"`` of the pod's :data:`KUBELET_WARNINGS` events, each distinct one once, newest
    first, at most ``limit`` (``events`` oldest first, as :func:`pod_events` returns them). Warning events
    only, except ``BackOff``, which the kubelet's image manager records as Normal
    (``pkg/kubelet/images/image_manager.go``); a ``Failed`` "Error: <waiting reason>" (the kubelet repeats the
    container's waiting reason that way, ``pkg/kubelet/kuberuntime/kuberuntime_container.go``) is left out:
    the failure already names the reason, and the event before it says why."""
    seen: set[tuple[str, str]] = set()
    out: list[str] = []
    for e in reversed(list(events)):
        r, msg = e.get("reason") or "", (e.get("message") or "").strip()
        if not ((e.get("type") == "Warning" or r == "BackOff") and r in KUBELET_WARNINGS) or (r, msg) in seen:
            continue
        if r == "Failed" and msg.startswith("Error: ") and msg[len("Error: "):] in STUCK_REASONS:
            continue
        seen.add((r, msg))
        out.append(f"{r}: {msg}")
    return out[:limit]


def _with_warnings(message: str, events: Sequence[Mapping[str, Any]]) -> str:
    w = kubelet_warnings(events)
    return message + ("; kubelet events: " + " | ".join(w) if w else "")


def pull_in_progress(events: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The newest ``Pulling`` event when no ``Pulled``, ``BackOff`` or ``Failed`` Warning came after it, else
    None (``events`` oldest first)."""
    for e in reversed(list(events)):
        r = e.get("reason")
        if r == PULLING:
            return e
        if r in (PULLED, "BackOff") or (e.get("type") == "Warning" and r == "Failed"):
            return None
    return None


def pod_state(pod: Mapping[str, Any], age_s: float, timeouts: PodTimeouts,
              events: Sequence[Mapping[str, Any]] = (), now: float | None = None) -> PodVerdict:
    """See the module docstring. ``age_s``: seconds since the step was launched; ``events``: the pod's core/v1
    Events as API JSON (any order); ``now``: epoch seconds the events are judged at (default: the clock)."""
    meta, spec, st = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    where = f"pod {meta.get('namespace')}/{meta.get('name')}"
    phase = st.get("phase")
    if phase in ("Succeeded", "Failed"):
        term = terminated(pod)
        code = term.get("exitCode") if term is not None else None
        if phase == "Succeeded":
            return PodVerdict(WorkerState(WorkerStatus.SUCCEEDED, exit_code=code if code is not None else 0,
                                          message=f"pod {meta.get('name')} Succeeded"), "finish")
        detail = (term.get("reason") if term is not None else st.get("reason")) or ""
        disrupted = disruption(pod)
        if disrupted is not None:
            return PodVerdict(WorkerState(WorkerStatus.PREEMPTED, exit_code=code, message=(
                f"pod {meta.get('name')} was preempted ({disrupted}); its container ended {detail or 'Failed'}")),
                "finish")
        message = f"pod {meta.get('name')} Failed ({detail})"
        if term is not None and (term.get("message") or "").strip():
            message += f"; termination message:\n{term['message'].rstrip()}"
        return PodVerdict(WorkerState(WorkerStatus.FAILED, exit_code=code, message=message), "finish")
    if meta.get("deletionTimestamp"):
        disrupted = disruption(pod)
        return PodVerdict(WorkerState(WorkerStatus.RUNNING, message="pod is terminating" + (
            f": preempted ({disrupted})" if disrupted else "")))
    if phase == "Running":
        return PodVerdict(WorkerState(WorkerStatus.RUNNING))
    evs = pod_events(pod, events)
    if not spec.get("nodeName"):
        sched = [e for e in evs if e.get("reason") == "FailedScheduling"]
        msg = unschedulable_message(pod) or (sched[-1].get("message") or "" if sched else "")
        if age_s > timeouts.pending_s:
            why = msg or "the scheduler has not placed the pod"
            return PodVerdict(WorkerState(WorkerStatus.FAILED, message=(
                f"{where} unschedulable for {age_s:.0f}s (> pending_timeout_seconds={timeouts.pending_s:g}): "
                f"FailedScheduling: {why}")), "give_up")
        return PodVerdict(WorkerState(WorkerStatus.PENDING, message=msg))
    node = spec.get("nodeName")
    now = time.time() if now is None else now
    prepare = [e for e in evs if e.get("reason") == FAILED_PREPARE and e.get("type") == "Warning"]
    if prepare:
        return PodVerdict(WorkerState(WorkerStatus.FAILED, message=_with_warnings(
            f"{where} bound to {node} but its DRA devices could not be prepared (the kubelet retries, the pod "
            f"would stay ContainerCreating)", evs)), "give_up", FAILED_PREPARE)
    waiting = (_container_status(pod).get("state") or {}).get("waiting")
    reason = (waiting or {}).get("reason")
    pulling = pull_in_progress(evs)
    if pulling is not None and reason not in STUCK_REASONS:
        since = now - event_time(pulling)
        if since <= timeouts.pull_s:
            return PodVerdict(WorkerState(WorkerStatus.PENDING, message=f"{PULLING}: {pulling.get('message') or ''}"))
        return PodVerdict(WorkerState(WorkerStatus.FAILED, message=_with_warnings(
            f"{where} bound to {node}: its image pull has run {since:.0f}s "
            f"(> image_pull_timeout_seconds={timeouts.pull_s:g}): {pulling.get('message') or ''}", evs)), "give_up")
    waited = age_s
    pulled = [e for e in evs if e.get("reason") == PULLED]
    if pulled and reason not in STUCK_REASONS:
        waited = min(age_s, now - event_time(pulled[-1]))  # the create clock starts again after a pull
    if waited > timeouts.create_s:
        detail = f"{reason}: {waiting.get('message')}" if waiting is not None else "container not started"
        if waiting is None or reason in STUCK_REASONS or reason == "ContainerCreating":
            since = f"after {age_s:.0f}s" if waited == age_s else f"{waited:.0f}s after its image was pulled"
            return PodVerdict(WorkerState(WorkerStatus.FAILED, message=_with_warnings(
                f"{where} bound to {node} but not started {since} "
                f"(> create_timeout_seconds={timeouts.create_s:g}): {detail}", evs)), "give_up")
    return PodVerdict(WorkerState(WorkerStatus.PENDING, message=f"{reason}" if waiting is not None else ""))
