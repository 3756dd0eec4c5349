"""The run worker's side of the relay: read each relayed step's channel and store its events into the instance.

A step launched with ``events: relay`` writes its events to a channel (:mod:`dagster_gpu.relay.channel`)
instead of the database. :class:`RelayPump` reads every channel this run worker watches, from where it stopped,
and stores each new event with ``DagsterInstance.handle_new_event`` (what the worker's instance would have done).
The executor calls :meth:`RelayPump.pump` before it reads the run's events (``_pop_events``, every
``sleep_seconds``) and before a health check decides that an ended worker recorded no outcome, so a relayed
step is seen by Dagster as a direct one is, one poll later.

**How often.** Each read of a remote channel is a command on the login node (``tail -c +<offset>`` over the SSH
master, a process sshd starts), so a channel that had nothing new is read less often: the gap between reads doubles
from :data:`MIN_READ_INTERVAL_S` to :data:`MAX_READ_INTERVAL_S` while reads come back empty or fail (a task still
pending in the queue, a model loading, the login node unreachable) and drops back to the minimum as soon as one
brings bytes. A materialization written during a quiet spell is stored at most ``MAX_READ_INTERVAL_S`` later. The
health check reads regardless of the gap (``force``): it must see an ended worker's last events before it decides.

**Exactly once.** A channel's offset lives in this process; a run worker that starts (a resumed run, a restarted
run worker) reads its channels from the beginning and skips every event whose :func:`event_key` the instance
already holds for the run (one query per channel, at its first read). An event is stored before its key is
remembered, so a run worker killed between the two stores nothing twice: its successor finds the event stored.

**What the instance decides.** Two fields the worker filled from its own ephemeral instance are the real
instance's, and are set here when the event is stored, as the direct path sets them at the same point:

- a check evaluation's target materialization: the real record of the materialization the worker's evaluation
  targeted (same timestamp and run; stored just before by this same pump), else the partition's latest
  (:func:`dagster_gpu.instance.checks.materialization_target`, what the direct path reads);
- a materialization's ``dagster/input_event_pointer/<corpus>`` tag (the storage id of the partition's latest
  corpus observation).

The run's ``dagster_gpu/cost_usd`` tag grows by the ``billing/cost_usd`` of each relayed materialization, one tag
update per pump (the direct worker updates it once per unit).

**Delay.** For each relayed materialization, seconds from the event's timestamp (the compute node's clock, when
the worker stored it) to its store here; :meth:`RelayPump.delays` hands them to whoever reports them.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import dagster as dg
from dagster import DagsterEventType, EventLogEntry
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluationTargetMaterializationData
from dagster._core.definitions.data_version import INPUT_EVENT_POINTER_TAG_PREFIX
from dagster._core.events import PIPELINE_EVENTS, EngineEventData
from dagster._record import copy

from dagster_gpu.billing.keys import COST_USD
from dagster_gpu.instance.checks import materialization_target
from dagster_gpu.instance.events import OUTCOMES
from dagster_gpu.instance.run_tags import add_cost
from dagster_gpu.partitions.source_versions import input_event_pointer
from dagster_gpu.relay.channel import decode, event_key

log = logging.getLogger(__name__)

#: Reads the bytes of a channel from an offset (b"" while the channel does not exist yet). May raise what the
#: backend's transport raises when the cluster cannot be reached now: the pump logs it and tries next time.
ChannelReader = Callable[[str, int], bytes]

#: Dagster's tag prefix for an input's event pointer (``dagster/input_event_pointer/<asset key>``): the value is
#: the storage id of the input's latest record.
INPUT_EVENT_POINTER_PREFIX = INPUT_EVENT_POINTER_TAG_PREFIX + "/"


#: Seconds between two reads of a channel whose last read brought bytes: under the executor's poll period
#: (``sleep_seconds``, Dagster's 1 s by default), so a busy channel is read at each poll.
MIN_READ_INTERVAL_S = 0.5
#: The longest gap between two reads of a channel that keeps coming back empty.
MAX_READ_INTERVAL_S = 8.0


@dataclass
class _Channel:
    path: str
    run_id: str
    step_key: str
    read: ChannelReader
    offset: int = 0
    seen: set | None = None
    bad_lines: int = 0
    refused: int = 0
    relayed: int = 0
    delays: list[float] = field(default_factory=list)
    interval: float = 0.0
    next_read: float = 0.0
    polls: int = 0
    reads: int = 0

    def schedule(self, now: float, got_bytes: bool) -> None:
        """The next read: :data:`MIN_READ_INTERVAL_S` after one that brought bytes, else twice the last gap (at
        most :data:`MAX_READ_INTERVAL_S`)."""
        self.interval = MIN_READ_INTERVAL_S if got_bytes else min(MAX_READ_INTERVAL_S, max(MIN_READ_INTERVAL_S, 2 * self.interval))
        self.next_read = now + self.interval


class RelayPump:
    """Every relay channel a run worker watches, and what was stored from each (see the module doc)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._channels: dict[str, _Channel] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def watch(self, path: str, run_id: str, step_key: str, read: ChannelReader) -> None:
        """Start reading the channel at ``path`` (a no-op when it is watched already)."""
        with self._lock:
            self._channels.setdefault(path, _Channel(path, run_id, step_key, read))

    def pump(self, instance: dg.DagsterInstance, run_id: str, step_key: str | None = None, *, force: bool = False) -> int:
        """Store every new event of the run's channels (only ``step_key``'s when given) into ``instance``; a channel
        is read only when its gap has passed (see the module doc), or always with ``force``. Returns how many events
        were stored. A channel that cannot be read now is left for a later call."""
        with self._lock:
            now = self._clock()
            channels = self._of(run_id, step_key)
            for c in channels:
                c.polls += 1
            return sum(self._drain(instance, c, now) for c in channels if force or now >= c.next_read)

    def reads(self, run_id: str, step_key: str | None = None) -> int:
        """How many times the run's channels (``step_key``'s when given) were read by this process."""
        with self._lock:
            return sum(c.reads for c in self._of(run_id, step_key))

    def delays(self, run_id: str, step_key: str | None = None) -> list[float]:
        """Seconds from each relayed materialization's timestamp to its store, in channel order."""
        with self._lock:
            return [d for c in self._of(run_id, step_key) for d in c.delays]

    def _of(self, run_id: str, step_key: str | None) -> list[_Channel]:
        return [c for c in self._channels.values() if c.run_id == run_id and step_key in (None, c.step_key)]

    def _drain(self, instance: dg.DagsterInstance, ch: _Channel, now: float) -> int:
        ch.reads += 1
        try:
            chunk = ch.read(ch.path, ch.offset)
        except Exception as e:  # noqa: BLE001 - the cluster unreachable now: the events wait in the channel
            ch.schedule(now, got_bytes=False)
            log.warning("relay: could not read %s now (%s: %s); trying again in %.0f s", ch.path, type(e).__name__, e,
                        ch.interval)
            return 0
        ch.schedule(now, got_bytes=bool(chunk))
        decoded = decode(chunk)
        for at, why in decoded.bad_lines:
            log.warning("relay: %s: skipped a line at byte %d that is not a record (a write cut short?): %s",
                        ch.path, ch.offset + at, why)
        ch.bad_lines += len(decoded.bad_lines)
        if decoded.events and ch.seen is None:
            ch.seen = stored_keys(instance, ch.run_id)
        stored, cost = 0, 0.0
        for entry in decoded.events:
            key = event_key(entry)
            if key in ch.seen:
                continue
            why = refusal(entry, ch.run_id, ch.step_key)
            if why:
                ch.seen.add(key)
                ch.refused += 1
                log.warning("relay: %s: not storing an event %s", ch.path, why)
                continue
            entry = rewrite(instance, entry)
            instance.handle_new_event(entry)
            ch.seen.add(key)
            stored += 1
            mat = _materialization(entry)
            if mat is not None:
                ch.delays.append(max(0.0, time.time() - entry.timestamp))
                value = mat.metadata.get(COST_USD)
                cost += float(getattr(value, "value", value) or 0.0) if value is not None else 0.0
        ch.offset += decoded.consumed
        ch.relayed += stored
        if cost:
            add_cost(instance, ch.run_id, cost)
        if stored and any(e.dagster_event is not None and e.dagster_event.event_type in OUTCOMES for e in decoded.events):
            report(instance, ch)  # the attempt ended: say what was relayed
        return stored


def quantile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``values`` by the nearest-rank method (None for none)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def report(instance: dg.DagsterInstance, ch: _Channel) -> None:
    """One engine event on the step: events relayed from the channel by this process, materializations' delay
    (p50, p95, max seconds), skipped lines, and the channel's reads against the polls that could have read it
    (``dagster_gpu/relay_*`` metadata)."""
    run = instance.get_run_by_id(ch.run_id)
    if run is None:
        return
    p50, p95 = quantile(ch.delays, 0.5), quantile(ch.delays, 0.95)
    md = {"dagster_gpu/relay_channel": ch.path, "dagster_gpu/relay_events": ch.relayed,
          "dagster_gpu/relay_bad_lines": ch.bad_lines, "dagster_gpu/relay_refused": ch.refused, "dagster_gpu/relay_materializations": len(ch.delays),
          "dagster_gpu/relay_reads": ch.reads, "dagster_gpu/relay_polls": ch.polls}
    if p50 is not None:
        md.update({"dagster_gpu/relay_delay_p50_s": round(p50, 3), "dagster_gpu/relay_delay_p95_s": round(p95, 3),
                   "dagster_gpu/relay_delay_max_s": round(max(ch.delays), 3)})
    said = f"; materializations stored {p50:.2f} s (p50), {p95:.2f} s (p95) after the worker wrote them" if p50 is not None else ""
    instance.report_engine_event(
        f"dagster-gpu relay: stored {ch.relayed} event(s) of step {ch.step_key} from {ch.path}{said}"
        + (f"; skipped {ch.bad_lines} line(s) that were not records" if ch.bad_lines else "")
        + (f"; refused {ch.refused} event(s) of another run, step or the run worker's own" if ch.refused else ""),
        run, EngineEventData(metadata=md), step_key=ch.step_key)


#: Events a step worker never writes: the run's own lifecycle and what its run worker plans. A channel holding one
#: is not trusted to change the run's status.
RUN_WORKER_EVENTS = frozenset(PIPELINE_EVENTS | {DagsterEventType.ASSET_MATERIALIZATION_PLANNED,
                                                 DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED})


def refusal(entry: EventLogEntry, run_id: str, step_key: str) -> str | None:
    """Why a channel's event is not stored (None: it is): another run's, another step's, or a run-level event
    (:data:`RUN_WORKER_EVENTS`)."""
    if entry.run_id != run_id:
        return f"of run {entry.run_id} (the channel is run {run_id}'s)"
    if entry.step_key is not None and entry.step_key != step_key:
        return f"of step {entry.step_key!r} (the channel is step {step_key!r}'s)"
    ev = entry.dagster_event
    if ev is not None and ev.event_type in RUN_WORKER_EVENTS:
        return f"{ev.event_type_value}: only the run worker writes it"
    return None


def stored_keys(instance: dg.DagsterInstance, run_id: str) -> set:
    """:func:`event_key` of every event of ``run_id`` the instance holds (a step worker's events without a step key
    included)."""
    keys: set = set()
    cursor = None
    while True:
        conn = instance.get_records_for_run(run_id, cursor=cursor, limit=10_000)
        keys.update(event_key(r.event_log_entry) for r in conn.records)
        if not conn.has_more:
            return keys
        cursor = conn.cursor


def _materialization(entry: EventLogEntry) -> dg.AssetMaterialization | None:
    ev = entry.dagster_event
    if ev is None or ev.event_type != DagsterEventType.ASSET_MATERIALIZATION:
        return None
    return ev.step_materialization_data.materialization


def real_target(instance: dg.DagsterInstance, asset_key: dg.AssetKey, partition: str | None,
                local: AssetCheckEvaluationTargetMaterializationData) -> AssetCheckEvaluationTargetMaterializationData | None:
    """The real instance's record of the materialization a worker's evaluation targets: the one with the same
    timestamp (a relayed event keeps the worker's; searched among the asset's 50 newest, of ``partition`` when
    the evaluation names one), else the partition's latest, as the direct path targets."""
    recs = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[partition] if partition is not None else None),
        limit=50).records
    for rec in recs:
        if rec.timestamp == local.timestamp and rec.event_log_entry.run_id == local.run_id:
            return AssetCheckEvaluationTargetMaterializationData(storage_id=rec.storage_id, run_id=rec.run_id,
                                                                 timestamp=rec.timestamp)
    return materialization_target(instance, asset_key, partition) if partition is not None else None


def rewrite(instance: dg.DagsterInstance, entry: EventLogEntry) -> EventLogEntry:
    """``entry`` with the fields the real instance decides (see the module doc) taken from ``instance``."""
    ev = entry.dagster_event
    if ev is None:
        return entry
    if ev.event_type == DagsterEventType.ASSET_CHECK_EVALUATION:
        evaluation = ev.event_specific_data
        if evaluation.target_materialization_data is not None:
            target = real_target(instance, evaluation.asset_key, evaluation.partition, evaluation.target_materialization_data)
            ev = ev._replace(event_specific_data=copy(evaluation, target_materialization_data=target))
    mat = _materialization(entry)
    if mat is not None and mat.partition is not None and any(t.startswith(INPUT_EVENT_POINTER_PREFIX) for t in mat.tags or {}):
        tags = dict(mat.tags)
        for tag in [t for t in tags if t.startswith(INPUT_EVENT_POINTER_PREFIX)]:
            upstream = dg.AssetKey.from_user_string(tag[len(INPUT_EVENT_POINTER_PREFIX):])
            tags[tag] = input_event_pointer(instance, upstream, mat.partition)
        data = ev.step_materialization_data
        ev = ev._replace(event_specific_data=data._replace(materialization=mat._replace(tags=tags)))
    return entry._replace(dagster_event=ev)
