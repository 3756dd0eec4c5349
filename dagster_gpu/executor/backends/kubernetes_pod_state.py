"""A step pod's :class:`~dagster_gpu.contracts.WorkerState` from its API JSON (pure, no I/O).

Input: the pod as the API server returns it (camelCase JSON, ``kubectl get pod -o json`` or
``ApiClient().sanitize_for_serialization(V1Pod)``), its age (seconds since launch) and the timeouts. Rules:

* ``Succeeded`` / ``Failed`` -> SUCCEEDED / FAILED with the container's exit code (``terminated``), and
  action ``finish`` (the caller bills and deletes the pod). A failed pod's message is the kubelet's reason,
  then the container's ``terminated.message`` when it has one: the step pod's ``terminationMessagePolicy:
  FallbackToLogsOnError`` (:func:`dagster_gpu.k8s.pod.build_pod`) makes the kubelet fill it with the last 80
  lines, at most 2 KiB, of the container's log (``MaxContainerTerminationMessageLogLines`` / ``...LogLength``
  in ``pkg/kubelet/container/runtime.go``), so the step failure shows the worker's traceback after the pod is
  gone; a container that could not start has the runtime's error there instead.
* ``deletionTimestamp`` set -> RUNNING ("pod is terminating").
* ``Running`` -> RUNNING.
* Pending, not bound to a node (no ``spec.nodeName``): PENDING with the scheduler's message (the
  ``PodScheduled=False`` condition with reason ``Unschedulable``, else ``scheduler_message``: the newest
  ``FailedScheduling`` event, which the caller reads); after ``pending_s`` -> FAILED, action ``give_up``.
* Pending and bound but its container not started after ``create_s``, waiting for a reason in
  :data:`STUCK_REASONS`, ``ContainerCreating`` or none -> FAILED with the kubelet's reason and message, action
  ``give_up`` (the caller deletes the pod, its template and its claims); else PENDING with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from dagster_gpu.contracts import WorkerState, WorkerStatus

#: Kubelet waiting reasons that mean the container will not start without intervention.
STUCK_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError", "ErrImagePull", "ImagePullBackOff",
                           "InvalidImageName", "RunContainerError"})


@dataclass(frozen=True)
class PodTimeouts:
    """Seconds since launch before a pod that will not run fails its step."""

    pending_s: float  # unschedulable (pending_timeout_seconds)
    create_s: float  # bound but its container not started (create_timeout_seconds)


@dataclass(frozen=True)
class PodVerdict:
    """``state`` of the step's worker and what the caller must do: ``none``, ``finish`` (the pod ended: bill
    it, delete it) or ``give_up`` (the pod will not run: delete it with its template and claims)."""

    state: WorkerState
    action: str = "none"


def _container_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((pod.get("status") or {}).get("containerStatuses") or [{}])[0] or {}


def terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The first container's ``state.terminated`` (exitCode, reason, message, startedAt, finishedAt) or None."""
    return (_container_status(pod).get("state") or {}).get("terminated")


def unschedulable_message(pod: Mapping[str, Any]) -> str:
    """The ``PodScheduled=False`` condition's message when its reason is ``Unschedulable``, else ""."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled":
            return c.get("message") or "" if c.get("reason") == "Unschedulable" else ""
    return ""


def needs_scheduler_events(pod: Mapping[str, Any]) -> bool:
    """True when :func:`pod_state` would use a ``FailedScheduling`` event's message: an unbound Pending pod
    whose conditions do not say why."""
    st = pod.get("status") or {}
    return st.get("phase") == "Pending" and not (pod.get("metadata") or {}).get("deletionTimestamp") \
        and not (pod.get("spec") or {}).get("nodeName") and not unschedulable_message(pod)


def pod_state(pod: Mapping[str, Any], age_s: float, timeouts: PodTimeouts, scheduler_message: str = "") -> PodVerdict:
    """See the module docstring. ``age_s``: seconds since the step was launched."""
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
        message = f"pod {meta.get('name')} Failed ({detail})"
        if term is not None and (term.get("message") or "").strip():
            message += f"; termination message:\n{term['message'].rstrip()}"
        return PodVerdict(WorkerState(WorkerStatus.FAILED, exit_code=code, message=message), "finish")
    if meta.get("deletionTimestamp"):
        return PodVerdict(WorkerState(WorkerStatus.RUNNING, message="pod is terminating"))
    if phase == "Running":
        return PodVerdict(WorkerState(WorkerStatus.RUNNING))
    if not spec.get("nodeName"):
        msg = unschedulable_message(pod) or scheduler_message
        if age_s > timeouts.pending_s:
            why = msg or "the scheduler has not placed the pod"
            return PodVerdict(WorkerState(WorkerStatus.FAILED, message=(
                f"{where} unschedulable for {age_s:.0f}s (> pending_timeout_seconds={timeouts.pending_s:g}): "
                f"FailedScheduling: {why}")), "give_up")
        return PodVerdict(WorkerState(WorkerStatus.PENDING, message=msg))
    waiting = (_container_status(pod).get("state") or {}).get("waiting")
    if age_s > timeouts.create_s:
        reason = f"{waiting.get('reason')}: {waiting.get('message')}" if waiting is not None else "container not started"
        if waiting is None or waiting.get("reason") in STUCK_REASONS or waiting.get("reason") == "ContainerCreating":
            return PodVerdict(WorkerState(WorkerStatus.FAILED, message=(
                f"{where} bound to {spec.get('nodeName')} but not started after {age_s:.0f}s "
                f"(> create_timeout_seconds={timeouts.create_s:g}): {reason}")), "give_up")
    return PodVerdict(WorkerState(WorkerStatus.PENDING, message=f"{waiting.get('reason')}" if waiting is not None else ""))
