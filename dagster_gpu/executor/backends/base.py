"""The contract every backend (local, slurm, kubernetes) implements.

The generic step handler (``dagster_gpu.executor.step_handler``) owns everything Dagster-specific:
it builds a :class:`StepLaunch`, picks a placement, records the backend's handle in the event log
(STEP_WORKER_STARTING metadata, so a resumed run re-attaches), decides health from
:class:`WorkerState` plus the event log, and terminates only on a user's terminate (run CANCELING).
A backend only starts, observes and stops workers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Mapping

# The values of the contract live in dagster_gpu.contracts (no package imports, so dagster_gpu.slurm and
# dagster_gpu.k8s use them without importing the executor); re-exported here for callers of this module.
from dagster_gpu.contracts import TERMINAL, Handle, StepLaunch, WorkerState, WorkerStatus

__all__ = ["TERMINAL", "Backend", "BackendNotConfigured", "Handle", "StepLaunch", "WorkerState", "WorkerStatus"]


class BackendNotConfigured(RuntimeError):
    """The executor config selects a backend whose section is missing or whose cluster is unreachable."""


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
