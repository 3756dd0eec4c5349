"""The step worker's own instance when it cannot reach the Dagster instance's database (``events: relay``).

The worker runs the step exactly as ``dagster api execute_step`` does, against an ephemeral instance built
from a **seed** the run worker put in the worker's environment (:data:`~dagster_gpu.relay.channel.RELAY_ENV`):

- the run (a ``DagsterRun``, as ``execute_step`` reads it from run storage), and the run's execution plan
  snapshot when the run has repository load data (Dagster reads it back in ``_execute_step_command_body``);
- the partitions this run already materialized per asset, so a retry skips them
  (:func:`dagster_gpu.worker.unit.already_materialized` reads the run's materializations as in direct mode);
- the run's partition keys in their dynamic partitions definition, in order (Dagster resolves a ranged run's
  keys, and the worker its range, from the instance's dynamic partitions).

Every event the worker's instance stores goes, after the in-memory store, to the channel
(:class:`~dagster_gpu.relay.channel.ChannelWriter`); the run worker stores it into the real instance
(:mod:`dagster_gpu.relay.pump`). What the worker reads from its instance besides the seed (the latest
materialization a check evaluation targets, the corpus observation a materialization's input pointer names)
is the real instance's business: the run worker rewrites those fields when it stores the event.

The seed is zlib-compressed serdes JSON in base64, at most :data:`MAX_SEED_BYTES` (an environment string
longer than 128 KiB is refused by ``execve``: Linux ``MAX_ARG_STRLEN``). It holds the run's config and tags
as the run storage has them; like the step args, it travels in the manifest (0600, in a spool checked by
``docs/security.md``'s rules), never on a command line.
"""

from __future__ import annotations

import base64
import json
import zlib
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import dagster as dg
from dagster import (
    DagsterEvent,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    EventLogEntry,
    deserialize_value,
    serialize_value,
)
from dagster._core.events import StepMaterializationData
from dagster._core.instance import InstanceType
from dagster._core.launcher.sync_in_memory_run_launcher import SyncInMemoryRunLauncher
from dagster._core.run_coordinator import DefaultRunCoordinator
from dagster._core.snap import ExecutionPlanSnapshot
from dagster._core.storage.event_log import InMemoryEventLogStorage
from dagster._core.storage.noop_compute_log_manager import NoOpComputeLogManager
from dagster._core.storage.root import TemporaryLocalArtifactStorage
from dagster._core.storage.runs import InMemoryRunStorage
from dagster._record import copy

from dagster_gpu.relay.channel import ChannelWriter

#: The largest seed (base64 characters) an environment variable can carry with the rest of the JSON around it.
MAX_SEED_BYTES = 120_000


class RelaySeedTooLarge(ValueError):
    """The run's seed does not fit an environment variable (see :data:`MAX_SEED_BYTES`)."""


@dataclass(frozen=True)
class RelaySeed:
    """What the worker's ephemeral instance starts with (see the module doc).

    Attributes:
        run: the run, as the real instance's run storage holds it.
        done: asset key (user string) -> partition keys the run materialized before this launch.
        plan_snapshot: the run's execution plan snapshot, only when the run has repository load data.
        dynamic: dynamic partitions definition name -> the run's keys in it, in the definition's order.
    """

    run: DagsterRun
    done: Mapping[str, Sequence[str]] = field(default_factory=dict)
    plan_snapshot: ExecutionPlanSnapshot | None = None
    dynamic: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def encode(self) -> str:
        """The seed as the value :func:`decode_seed` reads. Raises RelaySeedTooLarge."""
        doc = {"run": serialize_value(self.run), "done": {k: list(v) for k, v in self.done.items()},
               "plan": serialize_value(self.plan_snapshot) if self.plan_snapshot is not None else None,
               "dynamic": {k: list(v) for k, v in self.dynamic.items()}}
        text = base64.b64encode(zlib.compress(json.dumps(doc).encode(), 9)).decode()
        if len(text) > MAX_SEED_BYTES:
            raise RelaySeedTooLarge(
                f"relay: run {self.run.run_id}'s seed is {len(text)} bytes compressed, more than the {MAX_SEED_BYTES} "
                "an environment variable can carry (its run config, tags or execution plan snapshot are too large); "
                "use events: direct for this job")
        return text


def decode_seed(text: str) -> RelaySeed:
    """The seed :meth:`RelaySeed.encode` wrote. Raises ValueError when ``text`` is not one."""
    try:
        doc = json.loads(zlib.decompress(base64.b64decode(text.encode())))
    except (zlib.error, ValueError) as e:
        raise ValueError(f"relay seed is not base64 of zlib-compressed JSON: {e}") from e
    plan = doc.get("plan")
    return RelaySeed(run=deserialize_value(doc["run"], DagsterRun), done=dict(doc.get("done") or {}),
                     plan_snapshot=deserialize_value(plan, ExecutionPlanSnapshot) if plan else None,
                     dynamic=dict(doc.get("dynamic") or {}))


def seed_for(instance: DagsterInstance, run: DagsterRun, dynamic: Mapping[str, Sequence[str]] | None = None) -> RelaySeed:
    """The seed of a launch of one of ``run``'s steps: the run as stored, the partitions it materialized so far
    (one event-log query), the plan snapshot when Dagster will read it back, and ``dynamic`` (the run's keys per
    dynamic partitions definition)."""
    done: dict[str, list[str]] = {}
    for rec in instance.get_records_for_run(run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION).records:
        ev = rec.event_log_entry.dagster_event
        mat = ev.step_materialization_data.materialization if ev is not None else None
        if mat is not None and mat.partition is not None:
            done.setdefault(mat.asset_key.to_user_string(), []).append(mat.partition)
    plan = None
    if run.has_repository_load_data and run.execution_plan_snapshot_id:
        plan = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
    return RelaySeed(run=run, done=done, plan_snapshot=plan, dynamic=dict(dynamic or {}))


class RelayEventLogStorage(InMemoryEventLogStorage):
    """An in-memory event log that also appends every stored event to the relay channel.

    The seed's materializations are stored without being relayed (the real instance has them)."""

    def __init__(self, writer: ChannelWriter):
        super().__init__()
        self.writer = writer

    def seed(self, entries: Sequence[EventLogEntry]) -> None:
        for entry in entries:
            super().store_event(entry)

    def store_event(self, event: EventLogEntry) -> None:
        super().store_event(event)
        self.writer.write_event(event)

    def store_event_batch(self, events: Sequence[EventLogEntry]) -> None:
        for event in events:
            self.store_event(event)


def _materialized(run: DagsterRun, asset: str, partition: str) -> EventLogEntry:
    mat = dg.AssetMaterialization(asset_key=dg.AssetKey.from_user_string(asset), partition=partition)
    event = DagsterEvent(event_type_value=DagsterEventType.ASSET_MATERIALIZATION.value, job_name=run.job_name,
                         event_specific_data=StepMaterializationData(mat))
    return EventLogEntry(error_info=None, level="DEBUG", user_message="", run_id=run.run_id, timestamp=0.0,
                         job_name=run.job_name, dagster_event=event)


def relay_instance(seed: RelaySeed, writer: ChannelWriter) -> DagsterInstance:
    """An ephemeral instance (in-memory run and event storage, a temporary artifact directory, no compute
    logs) holding the seed, whose event log relays to ``writer``."""
    storage = RelayEventLogStorage(writer)
    instance = DagsterInstance(
        instance_type=InstanceType.EPHEMERAL,
        local_artifact_storage=TemporaryLocalArtifactStorage(),
        run_storage=InMemoryRunStorage(),
        event_storage=storage,
        compute_log_manager=NoOpComputeLogManager(),
        run_coordinator=DefaultRunCoordinator(),
        run_launcher=SyncInMemoryRunLauncher(),
    )
    if seed.plan_snapshot is not None:
        instance.run_storage.add_execution_plan_snapshot(seed.plan_snapshot)
    # run storage refuses a run whose job snapshot it lacks; the step never reads that snapshot (it loads the job
    # from its code), so the stored copy names none; the step body gets the run as seeded
    instance.add_run(copy(seed.run, job_snapshot_id=None))
    for name, keys in seed.dynamic.items():
        instance.add_dynamic_partitions(name, list(keys))
    storage.seed([_materialized(seed.run, a, k) for a, keys in seed.done.items() for k in keys])
    return instance

