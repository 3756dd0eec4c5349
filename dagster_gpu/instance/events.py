"""The event log as dagster-gpu reads it: one reader each for the step launches, the outcomes a step recorded
after its launch, and metadata values.

A launch is the step's ``STEP_WORKER_STARTING`` engine event; the step handler writes the backend's name
(:data:`BACKEND_KEY`) and handle (:data:`HANDLE_KEY`) into its metadata, so a resumed run re-attaches and a
terminate finds the worker. An outcome is one of :data:`OUTCOMES` (success, failure, up for retry): once a
step recorded one after its launch, its worker ending is no failure and a requeued attempt has nothing to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from dagster import DagsterEventType

#: The launch event's metadata keys: the backend's name and its handle (JSON); the placement (JSON); on a
#: launch after a preemption, how many earlier workers of the attempt their scheduler preempted.
HANDLE_KEY = "dagster_gpu/handle"
BACKEND_KEY = "dagster_gpu/backend"
PLACEMENT_KEY = "dagster_gpu/placement"
PREEMPTIONS_KEY = "dagster_gpu/preemptions"
#: the launch's preemption pool (``Backend.preemption_pool``: ``slurm:<slurm partition>/<qos>``, ...)
PREEMPTION_POOL_KEY = "dagster_gpu/preemption_pool"
#: on the engine event a step worker records when it stopped for a preemption: the partition it was on
PREEMPTED_PARTITION_KEY = "dagster_gpu/preempted_partition"
#: the relay channel of a launch with ``events: relay`` (absent: the worker writes to the instance itself)
RELAY_CHANNEL_KEY = "dagster_gpu/relay_channel"

#: The events that record a step's outcome.
OUTCOMES = frozenset({DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE, DagsterEventType.STEP_UP_FOR_RETRY})


def metadata_value(v: Any) -> Any:
    """A metadata entry's plain value: ``MetadataValue.value``, or ``v`` itself when it is plain already."""
    return getattr(v, "value", v)


def metadata_get(md: Mapping[str, Any], key: str) -> Any:
    """The plain value of entry ``key`` of ``md``; None when it has none."""
    return metadata_value(md.get(key))


def metadata_number(md: Mapping[str, Any], key: str) -> float | None:
    """Entry ``key`` of ``md`` as a float: a number, or a setting stored as numeric text (``"0.142857"``);
    None when absent or not a number."""
    v = metadata_get(md, key)
    if isinstance(v, bool):
        return None
    try:
        return float(v) if isinstance(v, (int, float, str)) else None
    except ValueError:
        return None


def metadata_values(md: Mapping[str, Any]) -> dict[str, Any]:
    """Every entry of ``md`` as its plain value (:func:`metadata_value`)."""
    return {k: metadata_value(v) for k, v in md.items()}


@dataclass(frozen=True)
class Launch:
    """One recorded step launch.

    Attributes:
        step_key: the launched step. storage_id: the launch event's id in the event log (later events have
            larger ids; None for a launch known only in memory). metadata: the event's metadata as recorded
            (MetadataValues, or plain values for a launch known only in memory).
    """

    step_key: str | None
    storage_id: int | None
    metadata: Mapping[str, Any]

    @property
    def backend(self) -> str | None:
        """The backend's name, None when the event carries no handle (not launched by gpu_executor)."""
        return metadata_value(self.metadata[BACKEND_KEY]) if self.has_handle else None

    @property
    def handle(self) -> dict | None:
        """The backend's handle (JSON), None when the event carries none."""
        return metadata_value(self.metadata[HANDLE_KEY]) if self.has_handle else None

    @property
    def has_handle(self) -> bool:
        return HANDLE_KEY in self.metadata and BACKEND_KEY in self.metadata

    @property
    def preemptions(self) -> int:
        """How many earlier workers of this attempt were preempted before this launch (0 for the first)."""
        return int(metadata_number(self.metadata, PREEMPTIONS_KEY) or 0)

    @property
    def preemption_pool(self) -> str | None:
        """The launch's preemption pool (:data:`PREEMPTION_POOL_KEY`), None for a launch that recorded none."""
        v = metadata_get(self.metadata, PREEMPTION_POOL_KEY)
        return v if isinstance(v, str) and v else None

    @property
    def placement(self) -> dict | None:
        """The placement the launch was made with (JSON), None when the event carries none."""
        v = metadata_get(self.metadata, PLACEMENT_KEY)
        return v if isinstance(v, dict) else None

    @property
    def relay_channel(self) -> str | None:
        """Where the launched worker relays its events (``events: relay``), None when it writes them itself."""
        v = metadata_get(self.metadata, RELAY_CHANNEL_KEY)
        return v if isinstance(v, str) and v else None


def launches(instance, run_id: str, *, latest_first: bool = False, limit: int | None = None) -> list[Launch]:
    """The run's ``STEP_WORKER_STARTING`` events, oldest first (``latest_first``: newest first), at most
    ``limit`` of them (None: all)."""
    kw = {"limit": limit} if limit is not None else {}
    recs = instance.get_records_for_run(run_id, of_type=DagsterEventType.STEP_WORKER_STARTING,
                                        ascending=not latest_first, **kw).records
    out = []
    for rec in recs:
        ev = rec.event_log_entry.dagster_event
        if ev is None:
            continue
        md = ev.engine_event_data.metadata if ev.engine_event_data else {}
        out.append(Launch(ev.step_key, rec.storage_id, md or {}))
    return out


def latest_launch_metadata(instance, run_id: str) -> Mapping[str, Any]:
    """The metadata of the run's latest step launch (the backend's handle, e.g. ``slurm/job_id``, ``k8s/pod``,
    ``local/unit``, the log file); {} when the run launched no worker."""
    found = launches(instance, run_id, latest_first=True, limit=1)
    return found[0].metadata if found else {}


def last_outcomes(instance, run_id: str) -> dict[str, int]:
    """step key -> storage id of the latest outcome (:data:`OUTCOMES`) the step recorded in the run."""
    done: dict[str, int] = {}
    for rec in instance.get_records_for_run(run_id, of_type=set(OUTCOMES)).records:
        ev = rec.event_log_entry.dagster_event
        if ev is not None and ev.step_key:
            done[ev.step_key] = max(done.get(ev.step_key, 0), rec.storage_id)
    return done


def outcome_recorded(instance, run_id: str, step_keys: Iterable[str], after_storage_id: int | None = None) -> bool:
    """Did one of ``step_keys`` record an outcome in the run, after event ``after_storage_id`` (None: ever)?"""
    keys = set(step_keys)
    return any(k in keys and (after_storage_id is None or sid > after_storage_id)
               for k, sid in last_outcomes(instance, run_id).items())
