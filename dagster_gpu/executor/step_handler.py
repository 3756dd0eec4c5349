"""GpuStepHandler: Dagster's StepHandler over our backends (placement, launch, health, terminate).

Placement: a step forced onto a backend (its ``dagster-gpu/backend`` tag, the config's ``backend``, or the
only configured backend: :func:`dagster_gpu.policy.forced.forced_backend`) goes there as is; otherwise the
cost policy chooses (:func:`dagster_gpu.executor.auto.auto_placement`).

Health rule (after dagster-k8s's upstream ``test_step_health``): a worker that ended, whatever its
exit status, is healthy only if its step recorded an outcome (success, failure or up-for-retry) after
it was launched; otherwise the step fails with the backend's state, message and exit code. A worker that
vanished after its step recorded success is not a failure.

Termination: backends whose workers outlive the orchestrator (Slurm, Kubernetes) are stopped only when
the user terminated the run (run status CANCELING/CANCELED); a SIGTERM to the orchestrating process
leaves them running so a resumed run re-attaches through the handle recorded in the event log.

After the worker: the health check only reads ``Backend.state``. Every handle launched or re-attached to
is handed to the handler's :class:`~dagster_gpu.executor.settle.Settler`, which settles the unit once it
ended (abandoned worker terminated, scheduler bill read, unit released, bill written as observations).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from pathlib import Path
from typing import Any, Iterator, Mapping

from dagster import DagsterEvent, DagsterRunStatus, MetadataValue
from dagster._core.events import EngineEventData
from dagster._core.executor.step_delegating import CheckStepHealthResult, StepHandler, StepHandlerContext
from dagster._record import copy

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.contracts import TERMINAL, Backend, StepLaunch, WorkerStatus, describe_partitions
from dagster_gpu.core.request import TAG_PARTITIONS_DEF, GpuRequest
from dagster_gpu.executor.auto import auto_placement
from dagster_gpu.executor.backfill_hint import launches_to_come
from dagster_gpu.executor.command import relay_worker_argv, worker_argv, worker_env, worker_python_for
from dagster_gpu.executor.fleet import fleet_placement
from dagster_gpu.executor.registry import build_backend, configured_backends
from dagster_gpu.executor.settle import Settler
from dagster_gpu.fleet.config import fleet_from_config, fleet_rate_card
from dagster_gpu.instance.connections import hold_storage_connections
from dagster_gpu.instance.events import (
    BACKEND_KEY,
    HANDLE_KEY,
    PLACEMENT_KEY,
    PREEMPTION_POOL_KEY,
    PREEMPTIONS_KEY,
    RELAY_CHANNEL_KEY,
    Launch,
    launches,
    outcome_recorded,
)
from dagster_gpu.instance.run_tags import tag_launch
from dagster_gpu.partitions.run_ranges import run_partition_keys
from dagster_gpu.policy.forced import forced_backend
from dagster_gpu.policy.placement import Placement
from dagster_gpu.relay.channel import RELAY_ENV, relay_env
from dagster_gpu.relay.pump import RelayPump
from dagster_gpu.relay.storage import seed_for
from dagster_gpu.worker.context import StepContext
from dagster_gpu.worker.preemption import EXIT_PREEMPTED

log = logging.getLogger(__name__)
CLUSTER_KEY = "dagster_gpu/cluster"  # the launch's (and the materialization's) cluster, in a fleet



class GpuStepHandler(StepHandler):
    """Places and runs each step on a backend.

    Args:
        config: gpu_executor's config (see ``dagster_gpu.executor.executor``).
        default_log_dir: the local backend's log directory when the config gives none.
    """

    def __init__(self, config: Mapping[str, Any], default_log_dir: Path):
        self._config = dict(config)
        self._default_log_dir = default_log_dir
        self._rate_card = RateCard.load(config.get("rate_card"))
        self._candidates = configured_backends(config)
        self._clusters = {c.name: c for c in fleet_from_config(config)}  # FleetConfigError names cluster and key
        self._fleet = bool(config.get("clusters"))  # a fleet: placement over named clusters (dagster_gpu.fleet)
        if self._fleet:
            self._rate_card = fleet_rate_card(self._rate_card, tuple(self._clusters.values()))
            self._candidates = [n for n in self._candidates if n == "local"] + list(self._clusters)
        self._backends: dict[str, Backend] = {}
        self._launched: dict[tuple[str, str, int], Launch] = {}  # (run, step, attempt) -> its latest launch
        self._lock = threading.Lock()
        self._pooled = False
        self.settler = Settler()
        self.relay = RelayPump()

    @property
    def name(self) -> str:
        return "GpuStepHandler"

    @property
    def rate_card(self) -> RateCard:
        return self._rate_card

    @property
    def candidates(self) -> list[str]:
        """Backends configured in the executor config (``auto`` chooses among these); with ``clusters:``, local
        (when enabled) and every cluster's name."""
        return list(self._candidates)

    def cluster_kind(self, name: str) -> str:
        """The backend a cluster (or a backend's own name) runs on: ``local``, ``slurm`` or ``kubernetes``."""
        c = self._clusters.get(name)
        return c.kind if c is not None else name

    def cluster_config(self, name: str) -> Mapping[str, Any]:
        """gpu_executor's config as cluster ``name`` sees it: its own section under its kind's key."""
        c = self._clusters.get(name)
        return self._config if c is None or c.name == c.kind else {**self._config, c.kind: c.section}

    def waiting_budget_s(self, name: str) -> float | None:
        c = self._clusters.get(name)
        return c.waiting_budget_s if c is not None else None

    # -- helpers ----------------------------------------------------------------------------------
    def backend(self, name: str) -> Backend:
        with self._lock:
            if name not in self._backends:
                backend = build_backend(self.cluster_kind(name), self.cluster_config(name), self._default_log_dir)
                if self._fleet and self.cluster_kind(name) == "kubernetes":  # its pod-interval bills at its own rates
                    backend.rates = dict(self._rate_card.table(name))
                self._backends[name] = backend
            return self._backends[name]

    @staticmethod
    def _step_key(ctx: StepHandlerContext) -> str:
        keys = ctx.execute_step_args.step_keys_to_execute
        assert len(keys) == 1, "GpuStepHandler launches one step at a time"
        return keys[0]

    @staticmethod
    def _attempt(ctx: StepHandlerContext, step_key: str) -> int:
        ks = ctx.execute_step_args.known_state
        return ks.get_retry_state().get_attempt_count(step_key) if ks else 0

    def request_for(self, ctx: StepHandlerContext, step_key: str) -> GpuRequest:
        """The step's op tags, overridden by run tags of the same names (per-run override)."""
        tags = dict(ctx.step_tags.get(step_key, {}))
        tags.update({k: v for k, v in ctx.dagster_run.tags.items() if k.startswith("dagster-gpu/")})
        return GpuRequest.from_tags(tags)

    def place(
        self, request: GpuRequest, ctx: StepHandlerContext, step_key: str, partition_keys: tuple[str, ...] = ()
    ) -> Placement:
        if self._fleet:  # over the fleet, a forced kind still chooses among its clusters
            configured = self._config.get("backend", "auto")
            return fleet_placement(self, request, ctx, step_key, partition_keys, force=None if configured == "auto" else configured)
        forced = forced_backend(request, self._config.get("backend", "auto"), self._candidates)
        if forced is not None:
            return forced.placement()
        return auto_placement(self, request, ctx, step_key, partition_keys)

    def step_context(self, placement: Placement, request: GpuRequest, partitions_def: str | None = None) -> StepContext:
        return StepContext(
            backend=placement.backend,
            placement=placement,
            rates=dict(self._rate_card.table(placement.cluster or placement.backend)),
            gpu_count=request.count,
            extra={"partitions_def": partitions_def} if partitions_def else {},
        )

    @staticmethod
    def partition_keys(ctx: StepHandlerContext, step_key: str) -> tuple[str, ...]:
        """Every partition key the step's unit embeds (one, a ranged run's range, or none)."""
        pdef = ctx.step_tags.get(step_key, {}).get(TAG_PARTITIONS_DEF)
        return run_partition_keys(ctx.instance, ctx.dagster_run.tags, pdef)

    # -- StepHandler ------------------------------------------------------------------------------
    def launch_step(self, step_handler_context: StepHandlerContext) -> Iterator[DagsterEvent]:
        ctx = step_handler_context
        step_key = self._step_key(ctx)
        if not self._pooled:  # this run worker polls the run's events for the whole unit: hold its connections
            self._pooled = hold_storage_connections(ctx.instance, len(self.partition_keys(ctx, step_key)))
        yield self._launch(ctx, step_key)

    def _launch(self, ctx: StepHandlerContext, step_key: str, preemptions: int = 0,
                placement: Placement | None = None, why: str = "") -> DagsterEvent:
        """Launch the step's worker and record the launch (a ``STEP_WORKER_STARTING`` event carrying the backend,
        the handle and the placement). ``preemptions`` > 0: a worker launched again after its scheduler
        preempted that many earlier workers of this attempt, on ``placement`` (the first launch's), with the
        step args' duplicate-run guard off (the step started before and never recorded an outcome)."""
        run = ctx.dagster_run
        keys = self.partition_keys(ctx, step_key)
        attempt = self._attempt(ctx, step_key)
        request = self.request_for(ctx, step_key)
        placement = placement or self.place(request, ctx, step_key, keys)
        backend = self.backend(placement.cluster or placement.backend)
        args = ctx.execute_step_args
        if preemptions:
            args = copy(args, should_verify_step=False)
        pdef = ctx.step_tags.get(step_key, {}).get(TAG_PARTITIONS_DEF)
        launch = StepLaunch(
            run_id=run.run_id,
            step_key=step_key,
            partition_keys=keys,
            attempt=attempt,
            argv=worker_argv(args, worker_python_for(placement.backend, self.cluster_config(placement.cluster or placement.backend))),
            env={**worker_env(args, run.job_name, step_key), **self.step_context(placement, request, pdef).to_env()},
            request=request,
            placement=placement,
            tags=dict(run.tags),
            launches_to_come=self._launches_to_come(ctx) if backend.coalesces_launches and not preemptions else None,
            preemptions=preemptions,
        )
        channel = backend.relay_channel(launch)
        if channel is not None:  # events: relay: the worker writes its events to the channel, this process stores them
            seed = seed_for(ctx.instance, ctx.instance.get_run_by_id(run.run_id) or run,
                            dynamic={pdef: keys} if pdef and keys else None).encode()
            launch = dataclasses.replace(launch, argv=relay_worker_argv(launch.argv),
                                         env={**launch.env, RELAY_ENV: relay_env(channel, seed, backend.relay_storage_options())})
            self.relay.watch(channel, run.run_id, step_key, backend.read_channel)
        try:
            handle = backend.launch(launch)
        except Exception as e:
            raise RuntimeError(f"{backend.name} backend could not launch step {step_key!r} ({describe_partitions(keys)}): {e}") from e
        with self._lock:  # known in memory until the event log has it (storage id None)
            self._launched[(run.run_id, step_key, attempt)] = Launch(step_key, None, {
                BACKEND_KEY: backend.name, HANDLE_KEY: dict(handle), PLACEMENT_KEY: placement.to_json(),
                PREEMPTIONS_KEY: preemptions, **({RELAY_CHANNEL_KEY: channel} if channel else {})})
        self.settler.track(backend, handle, self._relay_hook(ctx.instance, run.run_id, step_key) if channel else None)
        if not preemptions:
            tag_launch(ctx.instance, run.run_id, backend.name, placement.device)  # Runs page: where it ran
        verb = f"Launching step {step_key} again ({why})" if preemptions else f"Launching step {step_key}"
        return DagsterEvent.step_worker_starting(
            ctx.get_step_context(step_key),
            message=f"{verb} ({describe_partitions(keys)}) on {backend.name}: {placement.reason}",
            metadata={
                BACKEND_KEY: MetadataValue.text(backend.name),
                **({CLUSTER_KEY: MetadataValue.text(placement.cluster)} if placement.cluster else {}),
                HANDLE_KEY: MetadataValue.json(dict(handle)),
                PLACEMENT_KEY: MetadataValue.json(placement.to_json()),
                "dagster_gpu/request": MetadataValue.json(request.to_json()),
                **({PREEMPTIONS_KEY: MetadataValue.int(preemptions)} if preemptions else {}),
                **({PREEMPTION_POOL_KEY: MetadataValue.text(backend.preemption_pool)} if backend.preemption_pool else {}),
                **({RELAY_CHANNEL_KEY: MetadataValue.text(channel)} if channel else {}),
                **{k: v for k, v in backend.handle_metadata(handle).items()},
            },
        )

    def _relay_hook(self, instance, run_id: str, step_key: str):
        """The settler's ``before_bill`` of a relayed step: its channel read to the end (``force``), so that the bill
        is split over the materializations the unit relayed, not written before they are stored."""
        return lambda: self.relay.pump(instance, run_id, step_key, force=True)

    @staticmethod
    def _launches_to_come(ctx: StepHandlerContext) -> int | None:
        try:
            return launches_to_come(ctx.instance, ctx.dagster_run)
        except Exception:  # noqa: BLE001 - a hint only: never fail a launch for it
            log.warning("could not count the launches to come of run %s's backfill", ctx.dagster_run.run_id, exc_info=True)
            return None

    def _find_launch(self, ctx: StepHandlerContext, step_key: str) -> Launch | None:
        """The step's latest launch (backend name, handle, storage id of the launch event, preemptions before it,
        placement) from the event log, else from memory (storage id None). A handle found in the event log (a
        resumed run re-attaching) is handed to the settler."""
        run_id = ctx.dagster_run.run_id
        attempt = self._attempt(ctx, step_key)
        for launch in launches(ctx.instance, run_id, latest_first=True, limit=50):
            if launch.step_key == step_key and launch.has_handle:
                with self._lock:
                    self._launched[(run_id, step_key, attempt)] = launch
                if launch.relay_channel:  # a resumed run worker reads the channel again (the pump skips what is stored)
                    self.relay.watch(launch.relay_channel, run_id, step_key, self.backend(_where(launch)).read_channel)
                self.settler.track(self.backend(_where(launch)), launch.handle,
                                   self._relay_hook(ctx.instance, run_id, step_key) if launch.relay_channel else None)
                return launch
        with self._lock:
            return self._launched.get((run_id, step_key, attempt))

    def check_step_health(self, step_handler_context: StepHandlerContext) -> CheckStepHealthResult:
        ctx = step_handler_context
        step_key = self._step_key(ctx)
        found = self._find_launch(ctx, step_key)
        if found is None:
            where = describe_partitions(self.partition_keys(ctx, step_key))
            return CheckStepHealthResult.unhealthy(f"no launch of step {step_key} ({where}) was recorded")
        name, handle, launched_at = _where(found), found.handle, found.storage_id
        backend = self.backend(name)
        state = backend.state(handle)
        if state.status not in TERMINAL:
            return CheckStepHealthResult.healthy()
        self.relay.pump(ctx.instance, ctx.dagster_run.run_id, step_key, force=True)  # what an ended relayed worker wrote last
        if outcome_recorded(ctx.instance, ctx.dagster_run.run_id, [step_key], launched_at):
            return CheckStepHealthResult.healthy()
        where = describe_partitions(self.partition_keys(ctx, step_key))
        if state.status == WorkerStatus.PREEMPTED:
            preemptions = found.preemptions + 1
            if preemptions <= backend.max_preemptions:
                placement = Placement.from_json(found.placement) if found.placement else None
                self._launch(ctx, step_key, preemptions, placement,
                             why=f"preemption {preemptions} of at most {backend.max_preemptions}: {state.message}")
                return CheckStepHealthResult.healthy()
            return CheckStepHealthResult.unhealthy(
                f"{name} worker of step {step_key} ({where}) was preempted {preemptions} time(s), more than its "
                f"backend's max_preemptions ({backend.max_preemptions}); the last one: {state.message}; "
                f"handle {json.dumps(dict(handle))}")
        code = "" if state.exit_code is None else f", exit code {state.exit_code}"
        if state.exit_code == EXIT_PREEMPTED:
            code += (" (the worker stopped gracefully on SIGTERM/SIGUSR1 and committed its checkpoint parts; a retry "
                     "continues after them)")
        if found.preemptions:
            code += f"; it was launched again after {found.preemptions} preemption(s)"
        return CheckStepHealthResult.unhealthy(
            f"{name} worker of step {step_key} ({where}) ended ({state.status.value}: "
            f"{state.message}{code}) without the step recording success or failure; handle {json.dumps(dict(handle))}"
        )

    def terminate_step(self, step_handler_context: StepHandlerContext) -> Iterator[DagsterEvent]:
        ctx = step_handler_context
        step_key = self._step_key(ctx)
        found = self._find_launch(ctx, step_key)
        if found is None:
            return
        name, handle = _where(found), found.handle
        backend = self.backend(name)
        run = ctx.instance.get_run_by_id(ctx.dagster_run.run_id)
        user_cancel = run is not None and run.status in (DagsterRunStatus.CANCELING, DagsterRunStatus.CANCELED)
        if backend.workers_survive_orchestrator and not user_cancel:
            yield DagsterEvent.engine_event(
                ctx.get_step_context(step_key),
                f"Leaving the {name} worker of step {step_key} running: the orchestrator is stopping but the run "
                "was not terminated by a user; a resumed run re-attaches to it.",
                EngineEventData(metadata={HANDLE_KEY: MetadataValue.json(dict(handle))}),
            )
            return
        yield DagsterEvent.engine_event(
            ctx.get_step_context(step_key),
            f"Terminating the {name} worker of step {step_key}",
            EngineEventData(metadata={HANDLE_KEY: MetadataValue.json(dict(handle))}),
        )
        backend.terminate(handle)


def _where(launch: Launch) -> str:
    """The cluster a recorded launch went to (its placement's ``cluster``), else its backend's name."""
    return (launch.placement or {}).get("cluster") or launch.backend
