"""The backend contract: the :class:`Backend` every backend (local, slurm, kubernetes) implements, and the
values that pass between the step handler, the backends, the settler and the scheduler clients (pure).

This module imports nothing else of ``dagster_gpu`` at run time and nothing of Dagster, so the Slurm client
and parsers (``dagster_gpu.slurm``), the Kubernetes manifests and client (``dagster_gpu.k8s``) and the
backends use these types without importing the executor.

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
   c. ``elect_bill_writer(handle) -> bool``: the end-of-unit cleanup that also decides who writes the bill: True
      for exactly one caller across processes (Kubernetes: the graceful delete of the pod with its UID
      precondition; Slurm: an O_EXCL marker in the spool; local: the launching process, the only one
      that can bill its worker);
   d. that caller writes the bill with :class:`dagster_gpu.executor.bill_writer.ObservationWriter`
      (one AssetObservation per partition of the unit).

``unsettled()`` lists units of *any* orchestrating process that ended and were never settled (a run
worker exited or was killed first), so the next process settles them; ``settle_wait_s`` is how long the
settler waits at the orchestrating process's exit for its own units' bills.
"""

from __future__ import annotations

import enum
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:  # annotations only: no import of the rest of the package at run time
    from dagster_gpu.core.request import GpuRequest
    from dagster_gpu.policy.placement import Placement
    from dagster_gpu.policy.snapshot import BackendState

#: The environment variable that carries the step context (``dagster_gpu.worker.context.StepContext`` as JSON)
#: from the executor to the step worker; each backend passes it on to the worker's environment.
STEP_CONTEXT_ENV = "DAGSTER_GPU_STEP_CONTEXT"
#: The local backend's name for a worker process (its unit), set in the worker's environment: ``local/unit`` on
#: the unit's materializations (``dagster_gpu.worker.backend_env``), matched by the process bill
#: (``dagster_gpu.local.backend``).
LOCAL_UNIT_ENV = "DAGSTER_GPU_LOCAL_UNIT"


def read_step_context(env: Mapping[str, str]) -> dict[str, Any]:
    """The step context in ``env`` as its JSON object (keys ``backend``, ``placement``, ``rates`` (USD per
    GPU-hour by device type), ``gpu_count``, ``device_fraction``, ``extra``, and what a backend adds, e.g.
    ``slurm_request``); ``{}`` when ``env`` has none. Raises ValueError (json) for a value that is not JSON."""
    raw = env.get(STEP_CONTEXT_ENV)
    return json.loads(raw) if raw else {}


def encode_step_context(ctx: Mapping[str, Any]) -> dict[str, str]:
    """``{STEP_CONTEXT_ENV: <ctx as JSON, keys sorted>}``: the one way the step context is written."""
    return {STEP_CONTEXT_ENV: json.dumps(dict(ctx), sort_keys=True)}


def with_step_context(env: Mapping[str, str], **fields: Any) -> dict[str, str]:
    """A copy of ``env`` whose step context has ``fields`` set (a backend adding what it asked the scheduler
    for: the device fraction, the Slurm request); ``env`` unchanged (copied) when it carries no step context."""
    out = dict(env)
    if STEP_CONTEXT_ENV in out:
        out.update(encode_step_context({**read_step_context(out), **fields}))
    return out


def describe_partitions(partition_keys: Sequence[str]) -> str:
    """What a work unit covers, for messages: ``partition 'p003'``, ``3 partitions 'p001'…'p003'`` (first and
    last key of the range, in the order given) or ``unpartitioned run`` (no key). Keys are shown as Python
    literals (``repr``), so a key with spaces or quotes reads unambiguously."""
    keys = list(partition_keys)
    if not keys:
        return "unpartitioned run"
    if len(keys) == 1:
        return f"partition {keys[0]!r}"
    return f"{len(keys)} partitions {keys[0]!r}…{keys[-1]!r}"


@dataclass(frozen=True)
class StepLaunch:
    """Everything a backend needs to start one step worker.

    Attributes:
        run_id, step_key: the Dagster run and step.
        partition_keys: every partition key the step's work unit embeds: a ranged run's whole range, one key
            for a single-partition run, ``()`` for an unpartitioned run. Never interpolate a key into a shell
            script or manifest field other than a sanitised label/annotation; :func:`describe_partitions`
            words them for messages.
        attempt: 0 for the first attempt, +1 per retry (part of every scheduler-side name).
        argv: the worker command (``python -m dagster api execute_step``), a list, never a string.
        env: environment for the worker: ``DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS`` and
            ``DAGSTER_GPU_STEP_CONTEXT`` (JSON, see ``dagster_gpu.worker.context``). Contains no secret
            in clear text; secrets are passed by reference (env var names, Secret refs).
        request: the step's GPU request (:class:`dagster_gpu.core.request.GpuRequest`).
        placement: where and why (:class:`dagster_gpu.policy.placement.Placement`).
        tags: the run's tags.
        launches_to_come: for a backend that coalesces launches (``Backend.coalesces_launches``), how
            many more launches the run's backfill is about to make (None: not a backfill, or unknown).
        preemptions: how many earlier workers of this attempt their scheduler preempted (0 for the first
            worker; the executor launches the unit again after each, up to ``Backend.max_preemptions``).
            Part of every scheduler-side name, so the new worker never collides with the one it replaces.
    """

    run_id: str
    step_key: str
    partition_keys: tuple[str, ...]
    attempt: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    request: GpuRequest
    placement: Placement
    tags: Mapping[str, str] = field(default_factory=dict)
    launches_to_come: int | None = None
    preemptions: int = 0


class WorkerStatus(enum.Enum):
    """A step worker's status as its scheduler reports it."""

    PENDING = "pending"  # accepted by the scheduler, not started
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # the worker process exited 0 / scheduler reports COMPLETED
    FAILED = "failed"  # exited non-zero, cancelled, timed out, unschedulable, vanished
    REQUEUED = "requeued"  # preempted and requeued by the scheduler; will run again
    PREEMPTED = "preempted"  # ended by its scheduler to make room (preemption, eviction, drain); nobody runs it again
    UNKNOWN = "unknown"  # could not ask (transient error); never changes a step's state


#: Statuses after which a worker never runs again.
TERMINAL = frozenset({WorkerStatus.SUCCEEDED, WorkerStatus.FAILED, WorkerStatus.PREEMPTED})


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


@dataclass(frozen=True)
class UnitBill:
    """What the scheduler billed one unit (written into Dagster by ``dagster_gpu.executor.bill_writer``).

    Attributes:
        gpu_seconds: the unit's GPU-seconds by the scheduler's accounting (sacct, pod interval).
        rate_usd_per_gpu_hour: USD per GPU-hour the unit is charged at; None: looked up in ``rates`` (the
            backend's rate table) with the one pricing rule (``dagster_gpu.billing.ratecard.gpu_hour_rate``)
            for the device type and parent product the unit's materializations report (``default`` when none):
            ``dagster_gpu.executor.bill_writer.unit_rate``.
        metadata: the scheduler's own figures (``slurm/*``, ``k8s/*``, ``billing/source``…), put on every
            partition's observation as they are.
        match: (metadata key, value) that the unit's own materializations carry (``slurm/job_id`` of the
            array task, ``k8s/pod``): materializations of the same step by an earlier unit (a retry) are
            not this unit's; a materialization without that key counts as this unit's. None: every
            materialization of the step in the run.
        rates: the backend's rate table (USD per GPU-hour by device type) when ``rate_usd_per_gpu_hour`` is None.
        env: the unit's worker environment (``DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS``, ``DAGSTER_GPU_STEP_CONTEXT``):
            it names the Dagster instance, run and step the observations belong to.
        empty: the scheduler billed nothing (the worker never ran, the backend has no scheduler accounting):
            no observation is written (:meth:`nothing`).
        wall_seconds: set when no scheduler counted the unit's devices (the local backend's process
            interval): the unit's GPU-seconds are then ``wall_seconds`` × the ``billing/devices`` its
            materializations report (1 when it materialized nothing), and ``gpu_seconds`` is ignored.
        device_type: the device type to price at when none of the unit's materializations reports one
            (``cpu`` for a local unit on a host without GPUs); None: ``default``.
        note: why an empty bill is empty (for logs).
    """

    gpu_seconds: float
    rate_usd_per_gpu_hour: float | None
    metadata: Mapping[str, Any]
    match: tuple[str, str] | None = None
    rates: Mapping[str, float] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    empty: bool = False
    wall_seconds: float | None = None
    device_type: str | None = None
    note: str = ""

    @classmethod
    def nothing(cls, why: str) -> "UnitBill":
        """The bill of a unit the scheduler did not bill (``why`` is for logs); writes no observation."""
        return cls(gpu_seconds=0.0, rate_usd_per_gpu_hour=0.0, metadata={}, empty=True, note=why)


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
    #: How many times the executor launches a unit again after its scheduler ended it with
    #: ``WorkerStatus.PREEMPTED`` (a scheduler that requeues by itself, as Slurm does, reports REQUEUED
    #: instead and needs none); the next preemption fails the step, saying how many there were.
    max_preemptions: int = 0
    #: The preemption pool its units run in (``dagster_gpu.policy.preemption.pool_key``: ``slurm:<slurm
    #: partition>/<qos>``, ``kubernetes:<priority class>``, ``local``), written on each launch event so the
    #: preemptions observed there teach the policy that pool's rate; "" when unnamed.
    preemption_pool: str = ""

    @abstractmethod
    def launch(self, launch: StepLaunch) -> Handle:
        """Start a worker for ``launch``; return its handle. Raises on a rejected submission
        with a message naming the partition(s) (:func:`describe_partitions`)."""

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

    def elect_bill_writer(self, handle: Handle) -> bool:
        """Clean up after the ended unit once its bill was read; True for exactly one caller across
        processes: that caller writes the bill. The default: nothing to clean up, always True."""
        return True

    def unsettled(self) -> Sequence[Handle]:
        """Handles of ended units of any orchestrating process that nobody settled yet (default: none)."""
        return ()

    def policy_state(self) -> BackendState:
        """Live state for the cost policy: the backend's ``dagster_gpu.policy.snapshot.BackendState``
        subclass (``LocalState``, ``SlurmState``, ``KubernetesState``), its pools and queue.

        Raises when the backend cannot be asked; ``backend: auto`` then records it as unreachable."""
        raise NotImplementedError(f"the {self.name} backend does not report live state")

    def relay_channel(self, launch: StepLaunch) -> str | None:
        """Where the worker of ``launch`` relays its events instead of writing them into the instance (a path
        the worker appends to, or an object-store URL it writes parts under, and :meth:`read_channel` reads:
        ``dagster_gpu.relay.channel``, ``dagster_gpu.relay.objects``), or None
        when the worker writes them itself (the default)."""
        return None

    def relay_storage_options(self) -> Mapping[str, Any]:
        """fsspec storage options (endpoint and the like, never credentials) the worker of a relayed launch needs
        to write its channel when :meth:`relay_channel` is a URL; {} by default."""
        return {}

    def read_channel(self, path: str, offset: int) -> bytes:
        """The bytes of relay channel ``path`` from byte ``offset`` (b"" while it does not exist). Raises
        NotImplementedError on a backend that never relays, or what its transport raises when the cluster
        cannot be reached now."""
        raise NotImplementedError(f"the {self.name} backend does not relay events")

    def handle_metadata(self, handle: Handle) -> Mapping[str, str | int | float]:
        """Metadata for the STEP_WORKER_STARTING event (defaults to the handle itself)."""
        return dict(handle)
