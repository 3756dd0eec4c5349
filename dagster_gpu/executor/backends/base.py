"""The contract every backend (local, slurm, kubernetes) implements.

The generic step handler (``dagster_gpu.executor.step_handler``) owns everything Dagster-specific:
it builds a :class:`StepLaunch`, picks a placement, records the backend's handle in the event log
(STEP_WORKER_STARTING metadata, so a resumed run re-attaches), decides health from
:class:`WorkerState` plus the event log, and terminates only on a user's terminate (run CANCELING).
A backend only starts, observes and stops workers.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Mapping

from dagster_gpu.policy.placement import Placement
from dagster_gpu.request import GpuRequest


class BackendNotConfigured(RuntimeError):
    """The executor config selects a backend whose section is missing or whose cluster is unreachable."""


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
        request: the step's GPU request.
        placement: where and why.
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
    PENDING = "pending"  # accepted by the scheduler, not started
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # the worker process exited 0 / scheduler reports COMPLETED
    FAILED = "failed"  # exited non-zero, cancelled, timed out, unschedulable, vanished
    REQUEUED = "requeued"  # preempted and requeued by the scheduler; will run again
    UNKNOWN = "unknown"  # could not ask (transient error); never changes a step's state


TERMINAL = frozenset({WorkerStatus.SUCCEEDED, WorkerStatus.FAILED})


@dataclass(frozen=True)
class WorkerState:
    """What the backend knows about one launched worker.

    Attributes:
        status: see :class:`WorkerStatus`.
        exit_code: the worker's exit code when known (None otherwise).
        message: scheduler's words (Slurm state, FailedScheduling text, signal) for error messages.
    """

    status: WorkerStatus
    exit_code: int | None = None
    message: str = ""


Handle = Mapping[str, str | int | float]
"""A backend's JSON-serialisable reference to a launched worker (pid, Slurm job id, pod name…)."""


class Backend(ABC):
    """Starts, observes and stops step workers on one kind of compute."""

    name: str = "abstract"
    #: True when workers outlive the orchestrating process (Slurm, Kubernetes): a SIGTERM to the
    #: run worker must then leave them running so a resumed run can re-attach by handle.
    workers_survive_orchestrator: bool = True
    #: True when launches wait to share a submission (Slurm job arrays): the step handler then tells
    #: each launch how many more its backfill is about to make (``StepLaunch.launches_to_come``).
    coalesces_launches: bool = False

    @abstractmethod
    def launch(self, launch: StepLaunch) -> Handle:
        """Start a worker for ``launch``; return its handle. Raises on a rejected submission
        with a message naming the partition(s)."""

    @abstractmethod
    def state(self, handle: Handle) -> WorkerState:
        """Current state of the worker behind ``handle``; UNKNOWN on a transient error."""

    @abstractmethod
    def terminate(self, handle: Handle) -> None:
        """Stop exactly this worker (graceful: SIGTERM/scancel/graceful delete)."""

    def policy_state(self):
        """Live state for the cost policy (a ``dagster_gpu.policy.snapshot.BackendState``).

        Raises when the backend cannot be asked; ``backend: auto`` then records it as unreachable."""
        raise NotImplementedError(f"the {self.name} backend does not report live state")

    def handle_metadata(self, handle: Handle) -> Mapping[str, str | int | float]:
        """Metadata for the STEP_WORKER_STARTING event (defaults to the handle itself)."""
        return dict(handle)
