"""The relay channel: what a step worker that cannot reach the Dagster instance writes instead, for its run
worker to store.

One channel per launch of a step: an append-only file of JSON lines on a file system the worker writes and
the run worker can read (the Slurm spool: on this host, or on the cluster and read over the SSH transport), or,
with ``slurm.relay_url``, the same lines as immutable parts under an object-store prefix
(:mod:`dagster_gpu.relay.objects`).
Each line is one record, ``{"event": <serdes JSON of a dagster EventLogEntry>}``: an event the worker's instance
stored (step start, each partition's materialization, check evaluations, log lines, engine events, step success
or failure).

Guarantees:

- **No torn record is ever read.** A record is one ``write(2)`` of a whole line ending in ``\\n``, then
  ``fsync``; the reader takes only complete lines (:func:`decode`). A worker killed in the middle of a write
  (SIGKILL, node loss) leaves a fragment without its ``\\n``; the next writer of the same channel (a requeued
  array task) ends that fragment with a ``\\n`` before its first record, so the fragment becomes one bad line
  that the reader skips and counts, and every record after it reads.
- **Exactly once** is the reader's part (:mod:`dagster_gpu.relay.pump`): it keys each event by
  :func:`event_key` and never stores a key the instance already holds for the run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from dagster import EventLogEntry, deserialize_value, serialize_value

from dagster_gpu.instance.events import OUTCOMES

#: The step worker's environment variable naming its channel and carrying its seed (JSON, see
#: :mod:`dagster_gpu.relay.storage`). Present only for a worker launched with ``events: relay``.
RELAY_ENV = "DAGSTER_GPU_RELAY"


def relay_env(channel: str, seed: str, storage_options: Mapping[str, Any] | None = None) -> str:
    """The value of :data:`RELAY_ENV`: JSON ``{"channel", "seed"}``, with ``"storage_options"`` (an object
    channel's endpoint and the like; never credentials) when there are any."""
    return json.dumps({"channel": channel, "seed": seed, **({"storage_options": dict(storage_options)} if storage_options else {})})


class ChannelWriter:
    """Appends records to the channel file at ``path`` (created 0600 in a 0700 directory).

    Raises OSError when the file cannot be opened or written (the worker then fails like one that cannot
    reach its database)."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        size = os.fstat(self._fd).st_size
        if size:  # an earlier writer's last line may be torn: end it, so it cannot swallow our first record
            with open(path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    self._write(b"\n")

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        os.fsync(self._fd)

    def write_event(self, entry: EventLogEntry) -> None:
        self._write(encode({"event": serialize_value(entry)}))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def encode(record: dict[str, Any]) -> bytes:
    """One record as its line (compact JSON and ``\\n``)."""
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


@dataclass
class Decoded:
    """What :func:`decode` found in a chunk of a channel.

    Attributes:
        events: the events, in channel order.
        consumed: bytes read up to and including the last complete line (the reader's next offset adds it).
        bad_lines: complete lines that are not records (a torn write's fragment), with their byte offsets in
            the chunk.
    """

    events: list[EventLogEntry] = field(default_factory=list)
    consumed: int = 0
    bad_lines: list[tuple[int, str]] = field(default_factory=list)


def decode(chunk: bytes) -> Decoded:
    """The records in ``chunk`` (bytes of a channel from a line start): every complete line; a trailing
    partial line is left for the next read (``consumed`` stops before it)."""
    out = Decoded()
    end = chunk.rfind(b"\n")
    if end < 0:
        return out
    out.consumed = end + 1
    pos = 0
    for line in chunk[: end + 1].split(b"\n")[:-1]:
        at, pos = pos, pos + len(line) + 1
        if not line.strip():
            continue
        try:
            out.events.append(deserialize_value(json.loads(line)["event"], EventLogEntry))
        except Exception as e:  # noqa: BLE001 - a torn or foreign line (not JSON, no "event"): skipped and counted
            out.bad_lines.append((at, f"{type(e).__name__}: {e}"[:200]))
    return out


def event_key(entry: EventLogEntry) -> tuple:
    """What identifies one event across the channel and the instance: its timestamp (seconds, as the worker's
    clock gave it; stored unchanged), step, event type and message. The reader's rewrites change none of these."""
    etype = entry.dagster_event.event_type_value if entry.dagster_event is not None else None
    return (repr(float(entry.timestamp)), entry.step_key, etype, entry.user_message)


def read_from(path: str, offset: int = 0) -> bytes:
    """The bytes of the channel file at ``path`` (on this host) from byte ``offset``; b"" while it does not exist."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read()
    except FileNotFoundError:
        return b""


def outcome_in_channel(path: str, step_keys: set[str]) -> bool:
    """Did one of ``step_keys`` write a step outcome (success, failure, up for retry) to the channel at ``path``?
    False when the channel does not exist. What a requeued array task checks before running a relayed step again
    (:mod:`dagster_gpu.slurm.requeue`): it cannot ask the instance."""
    return step_outcome(decode(read_from(path)), step_keys)


def step_outcome(decoded: Decoded, step_keys: set[str]) -> bool:
    """Whether ``decoded`` holds a step outcome (success, failure, up for retry) of one of ``step_keys``."""
    return any(e.dagster_event is not None and e.dagster_event.event_type in OUTCOMES and e.step_key in step_keys
               for e in decoded.events)
