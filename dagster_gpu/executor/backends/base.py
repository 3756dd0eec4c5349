"""The contract every backend (local, slurm, kubernetes) implements.

The generic step handler (``dagster_gpu.executor.step_handler``) owns everything Dagster-specific:
it builds a :class:`StepLaunch`, picks a placement, records the backend's handle in the event log
(STEP_WORKER_STARTING metadata, so a resumed run re-attaches), decides health from
:class:`WorkerState` plus the event log, and terminates only on a user's terminate (run CANCELING).
A backend only starts, observes, bills and stops workers.

A work unit's life on a backend, and who calls what:

1. ``launch(StepLaunch) -> handle``: the step handler.
2. ``state(handle) -> WorkerState``: the step handler's health check and the settler. Only reads: it
   writes no observation, deletes no pod and cancels no task (it may remember what it read).
3. Once ``state`` is terminal, the settler (:class:`dagster_gpu.executor.settle.Settler`, the one place
   this happens) settles the unit:

   a. ``terminate(handle)`` when the state is ``abandoned`` (the backend gave up on a worker its
      scheduler still holds: it must never run later);
   b. ``accounting(handle) -> UnitBill | None``: what the scheduler billed the unit (read only); None
      while it has not billed it yet (sacct lags the task's end, slurmdbd is down): the settler asks
      again on its next pass, or another process's settler does later (``unsettled``);
   c. ``release(handle) -> bool``: the end-of-unit cleanup that also decides who writes the bill: True
      for exactly one caller across processes (Kubernetes: the graceful delete of the pod with its UID
      precondition; Slurm: an O_EXCL marker in the spool; local: the launching process, the only one
      that can bill its worker);
   d. that caller writes the bill with :class:`dagster_gpu.executor.observations.ObservationWriter`
      (one AssetObservation per partition of the unit).

``unsettled()`` lists units of *any* orchestrating process that ended and were never settled (a run
worker exited or was killed first), so the next process settles them; ``settle_wait_s`` is how long the
settler waits at the orchestrating process's exit for its own units' bills.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Mapping, Sequence

# The values of the contract live in dagster_gpu.contracts (no package imports, so dagster_gpu.slurm and
# dagster_gpu.k8s use them without importing the executor); re-exported here for callers of this module.
from dagster_gpu.contracts import TERMINAL, Handle, StepLaunch, WorkerState, WorkerStatus
from dagster_gpu.executor.observations import UnitBill
from dagster_gpu.policy.snapshot import BackendState

__all__ = [
    "TERMINAL", "Backend", "BackendNotConfigured", "BackendState", "Handle", "StepLaunch", "UnitBill", "WorkerState",
    "WorkerStatus",
]


class BackendNotConfigured(RuntimeError):
    """The executor config selects a backend whose section is missing or whose cluster is unreachable."""


class Backend(ABC):
    """Starts, observes, bills and stops step workers on one kind of compute (see the module doc)."""

    name: str = "abstract"
    #: True when workers outlive the orchestrating process (Slurm, Kubernetes): a SIGTERM to the
    #: run worker must then leave them running so a resumed run can re-attach by handle.
    workers_survive_orchestrator: bool = True
    #: True when launches wait to share a submission (Slurm job arrays): the step handler then tells
    #: each launch how many more its backfill is about to make (``StepLaunch.launches_to_come``).
    coalesces_launches: bool = False
    #: Seconds the settler waits, when the orchestrating process exits, for the units it launched here to
    #: end and be billed (0: no wait; what is left is settled by a later process's ``unsettled``).
    settle_wait_s: float = 0.0

    @abstractmethod
    def launch(self, launch: StepLaunch) -> Handle:
        """Start a worker for ``launch``; return its handle. Raises on a rejected submission
        with a message naming the partition(s)."""

    @abstractmethod
    def state(self, handle: Handle) -> WorkerState:
        """Current state of the worker behind ``handle``; UNKNOWN on a transient error. Only reads."""

    @abstractmethod
    def terminate(self, handle: Handle) -> None:
        """Stop exactly this worker (graceful: SIGTERM/scancel/graceful delete). Idempotent."""

    def accounting(self, handle: Handle) -> UnitBill | None:
        """What the scheduler billed the ended unit behind ``handle``, read only.

        Returns the bill (``UnitBill.nothing(...)`` when the scheduler billed nothing: the worker never
        ran, or the backend has no scheduler accounting), or None while the scheduler has not billed it
        yet. The default: no scheduler accounting (the worker's measured bill is all there is)."""
        return UnitBill.nothing(f"the {self.name} backend has no scheduler accounting")

    def release(self, handle: Handle) -> bool:
        """Clean up after the ended unit once its bill was read; True for exactly one caller across
        processes: that caller writes the bill. The default: nothing to clean up, always True."""
        return True

    def unsettled(self) -> Sequence[Handle]:
        """Handles of ended units of any orchestrating process that nobody settled yet (default: none)."""
        return ()

    def policy_state(self) -> BackendState:
        """Live state for the cost policy: the backend's :class:`~dagster_gpu.policy.snapshot.BackendState`
        subclass (``LocalState``, ``SlurmState``, ``KubernetesState``), its pools and queue.

        Raises when the backend cannot be asked; ``backend: auto`` then records it as unreachable."""
        raise NotImplementedError(f"the {self.name} backend does not report live state")

    def handle_metadata(self, handle: Handle) -> Mapping[str, str | int | float]:
        """Metadata for the STEP_WORKER_STARTING event (defaults to the handle itself)."""
        return dict(handle)
