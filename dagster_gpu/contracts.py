"""The values that pass between the step handler, the backends and the scheduler clients (pure).

This module imports nothing else of ``dagster_gpu`` at run time, so the Slurm client and parsers
(``dagster_gpu.slurm``) and the Kubernetes manifests and client (``dagster_gpu.k8s``) can use these types
without importing the executor. ``dagster_gpu.executor.backends.base`` re-exports them next to the
:class:`~dagster_gpu.executor.backends.base.Backend` contract.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:  # annotations only: no import of the rest of the package at run time
    from dagster_gpu.policy.placement import Placement
    from dagster_gpu.request import GpuRequest


@dataclass(frozen=True)
class StepLaunch:
    """Everything a backend needs to start one step worker.

    Attributes:
        run_id, step_key: the Dagster run and step.
        partition_key: the run's partition key, or None for an unpartitioned run. Never interpolate
            it into a shell script or manifest field other than a sanitised label/annotation.
        attempt: 0 for the first attempt, +1 per retry (part of every scheduler-side name).
        argv: the worker command (``python -m dagster api execute_step``), a list, never a string.
        env: environment for the worker: ``DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS`` and
            ``DAGSTER_GPU_STEP_CONTEXT`` (JSON, see ``dagster_gpu.worker.context``). Contains no secret
            in clear text; secrets are passed by reference (env var names, Secret refs).
        request: the step's GPU request (:class:`dagster_gpu.request.GpuRequest`).
        placement: where and why (:class:`dagster_gpu.policy.placement.Placement`).
        tags: the run's tags.
        launches_to_come: for a backend that coalesces launches (``Backend.coalesces_launches``), how
            many more launches the run's backfill is about to make (None: not a backfill, or unknown).
        partition_keys: every partition key the step's work unit embeds (a ranged run's whole range;
            ``(partition_key,)`` for a single-partition run). Same rule as ``partition_key``: never
            interpolated into a script or manifest field.
    """

    run_id: str
    step_key: str
    partition_key: str | None
    attempt: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    request: GpuRequest
    placement: Placement
    tags: Mapping[str, str] = field(default_factory=dict)
    launches_to_come: int | None = None
    partition_keys: tuple[str, ...] = ()


class WorkerStatus(enum.Enum):
    """A step worker's status as its scheduler reports it."""

    PENDING = "pending"  # accepted by the scheduler, not started
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # the worker process exited 0 / scheduler reports COMPLETED
    FAILED = "failed"  # exited non-zero, cancelled, timed out, unschedulable, vanished
    REQUEUED = "requeued"  # preempted and requeued by the scheduler; will run again
    UNKNOWN = "unknown"  # could not ask (transient error); never changes a step's state


#: Statuses after which a worker never runs again.
TERMINAL = frozenset({WorkerStatus.SUCCEEDED, WorkerStatus.FAILED})


@dataclass(frozen=True)
class WorkerState:
    """What the backend knows about one launched worker.

    Attributes:
        status: see :class:`WorkerStatus`.
        exit_code: the worker's exit code when known (None otherwise).
        message: scheduler's words (Slurm state, FailedScheduling text, signal) for error messages.
        abandoned: FAILED because the backend gave up on a worker its scheduler still holds (a Slurm task
            over its wait limit, a pod that cannot be scheduled or whose container cannot start): whoever
            settles the unit (``dagster_gpu.executor.settle``) terminates it so it never runs later.
    """

    status: WorkerStatus
    exit_code: int | None = None
    message: str = ""
    abandoned: bool = False


Handle = Mapping[str, str | int | float]
"""A backend's JSON-serialisable reference to a launched worker (pid, Slurm job id, pod name…)."""
