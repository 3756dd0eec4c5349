"""A relay channel on an object store (``slurm.relay_url``, e.g. ``s3://bucket/prefix``), through fsspec: the
writer a relayed step worker uses, the reader the run worker uses, and the dispatch between a channel file
(:mod:`dagster_gpu.relay.channel`) and an object channel by the channel's name.

The channel is a prefix of immutable parts (:mod:`dagster_gpu.relay.parts`): the writer buffers
records and uploads the buffer as one part (one PUT of whole lines) at most every ``flush_interval_s``
(0.2 s by default, from a daemon thread) and at :meth:`ObjectChannelWriter.close`. So:

- **No torn record.** A part is one PUT; an object store shows all of it or none. A worker killed mid-flight
  loses at most its buffered records (not yet stored anywhere, as a direct worker killed before its database
  write), never leaves half a part.
- **A requeued array task** re-using the channel lists it when it opens and continues after the highest part.
- **Promptly.** A record is in the store at most ``flush_interval_s`` plus one PUT after it was written.

Credentials are never in the storage options: each side takes them from its provider chain (environment,
shared credentials file, instance profile or workload identity); the options carry the endpoint and the like.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Any, Callable, Mapping

import fsspec
from dagster import EventLogEntry, serialize_value

from dagster_gpu.relay.channel import ChannelWriter, decode, encode, read_from, step_outcome
from dagster_gpu.relay.parts import (
    LOG_SUFFIX,
    is_object_channel,
    next_sequence,
    part_name,
    part_sequence,
    parts_to_read,
)

log = logging.getLogger(__name__)

#: Seconds between two uploads of a busy writer's buffer (well under the run worker's 0.5 s fastest read).
FLUSH_INTERVAL_S = 0.2


def _fs(url: str, storage_options: Mapping[str, Any] | None):
    """(fsspec filesystem, channel path without protocol, no trailing slash) of channel ``url``."""
    fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    return fs, root.rstrip("/")


def _entries(fs, root: str) -> list[dict]:
    """The files directly under ``root``, listed afresh (no listing cache); [] when the prefix holds nothing."""
    try:
        return [e for e in fs.ls(root, detail=True, refresh=True) if e.get("type", "file") == "file"]
    except FileNotFoundError:
        return []


def _sizes(entries: list[dict]) -> dict[int, int]:
    """Sequence number -> size in bytes of each part among ``entries`` (other files left out)."""
    return {seq: int(e["size"]) for e in entries if (seq := part_sequence(str(e["name"]))) is not None}


class ObjectChannelWriter:
    """Writes records to the object channel ``url`` as parts (see the module doc). ``write_event`` only
    buffers; a daemon thread uploads. Raises OSError from the constructor when the channel cannot be listed,
    and from :meth:`close` when its last upload fails (the records then never reached the run worker)."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None,
                 flush_interval_s: float = FLUSH_INTERVAL_S):
        self.path = url
        self._fs, self._root = _fs(url, storage_options)
        self._next = next_sequence(str(e["name"]) for e in _entries(self._fs, self._root))
        self._buf: list[bytes] = []
        self._cond = threading.Condition()
        self._upload = threading.Lock()
        self._closed = False
        self._interval = flush_interval_s
        self._thread = threading.Thread(target=self._run, name="relay-channel-uploader", daemon=True)
        self._thread.start()

    @property
    def next_part(self) -> int:
        """The sequence number the next uploaded part gets."""
        return self._next

    def write_event(self, entry: EventLogEntry) -> None:
        """Buffer one event's record (uploaded within ``flush_interval_s``)."""
        self.write_record(encode({"event": serialize_value(entry)}))

    def write_record(self, line: bytes) -> None:
        """Buffer one whole record line (ending in ``\\n``). Raises ValueError for anything else."""
        if not line.endswith(b"\n") or b"\n" in line[:-1]:
            raise ValueError("a relay channel record is one line ending in \\n")
        with self._cond:
            self._buf.append(line)
            self._cond.notify()

    def flush(self) -> None:
        """Upload what is buffered now, as one part. Raises OSError (the buffer is kept for the next try)."""
        with self._upload:
            with self._cond:
                data, self._buf = b"".join(self._buf), []
            if not data:
                return
            try:
                self._fs.pipe_file(f"{self._root}/{part_name(self._next)}", data)
            except BaseException:
                with self._cond:
                    self._buf.insert(0, data)
                raise
            self._next += 1

    def _run(self) -> None:
        failing = False
        while True:
            with self._cond:
                while not self._buf and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
            try:
                self.flush()
                failing = False
            except Exception as e:  # noqa: BLE001 - kept, retried next interval; close() raises if it persists
                if not failing:
                    log.warning("relay channel %s: upload failed (%s: %s); retrying every %.1f s", self.path,
                                type(e).__name__, e, self._interval)
                failing = True
            with self._cond:
                self._cond.wait_for(lambda: self._closed, timeout=self._interval)

    def close(self) -> None:
        """Stop the uploader and upload what is left. Raises OSError when that upload fails."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
        try:
            self.flush()
        except Exception as e:
            raise OSError(f"relay channel {self.path}: could not upload the last records: {type(e).__name__}: {e}") from e


def read_object_channel(url: str, offset: int = 0, storage_options: Mapping[str, Any] | None = None) -> bytes:
    """The bytes of object channel ``url`` from byte ``offset``: its parts 1, 2, … up to the first missing one,
    concatenated (:func:`~dagster_gpu.relay.parts.parts_to_read`); b"" while it has none. Raises what
    fsspec raises when the store cannot be reached."""
    fs, root = _fs(url, storage_options)
    chunks = []
    for seq, start in parts_to_read(_sizes(_entries(fs, root)), offset):
        data = fs.cat_file(f"{root}/{part_name(seq)}")
        chunks.append(data[start:])
    return b"".join(chunks)


def open_channel_writer(channel: str, storage_options: Mapping[str, Any] | None = None) -> ChannelWriter | ObjectChannelWriter:
    """The writer of ``channel``: an :class:`ObjectChannelWriter` for a URL, else a channel file's
    :class:`~dagster_gpu.relay.channel.ChannelWriter`."""
    if is_object_channel(channel):
        return ObjectChannelWriter(channel, storage_options)
    return ChannelWriter(channel)


def channel_reader(storage_options: Mapping[str, Any] | None = None) -> Callable[[str, int], bytes]:
    """``read(channel, offset) -> bytes`` for either kind of channel on this host (a URL with
    ``storage_options``, else a local file)."""
    def read(channel: str, offset: int) -> bytes:
        if is_object_channel(channel):
            return read_object_channel(channel, offset, storage_options)
        return read_from(channel, offset)
    return read


def outcome_in_any_channel(channel: str, step_keys: set[str], storage_options: Mapping[str, Any] | None = None) -> bool:
    """Did one of ``step_keys`` write a step outcome to ``channel`` (a file or an object channel)? False when the
    channel has nothing yet. Raises what fsspec raises when the store cannot be reached."""
    return step_outcome(decode(channel_reader(storage_options)(channel, 0)), step_keys)


def put_new_object(url: str, data: bytes, storage_options: Mapping[str, Any] | None = None) -> str:
    """Write ``data`` as the new object ``url`` (a job array's manifest) and return the SHA-256 (hex) of what the
    store gives back. Raises FileExistsError when ``url`` already exists (someone else wrote under the prefix: it is
    never overwritten nor used), OSError when the store refuses or cannot be reached."""
    fs, path = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    if fs.exists(path):
        raise FileExistsError(f"refusing to write {url}: it already exists (someone else wrote under the prefix)")
    fs.pipe_file(path, data)
    return hashlib.sha256(fs.cat_file(path)).hexdigest()


def object_log_tail(url: str, lines: int = 8, max_bytes: int = 4096,
                    storage_options: Mapping[str, Any] | None = None) -> str:
    """The last ``lines`` lines of a task log shipped as ``<seq>.log`` parts under ``url``
    (:mod:`dagster_gpu.slurm.object_runner`): of its contiguous parts' last ``max_bytes`` bytes, decoded as UTF-8
    with replacement; ``(no log under <url> yet)`` when it has no part, ``(log unreadable: <error>)`` when the
    store cannot be read. Raises nothing."""
    try:
        fs, root = _fs(url, storage_options)
        sizes = {seq: int(e["size"]) for e in _entries(fs, root)
                 if (seq := part_sequence(str(e["name"]), LOG_SUFFIX)) is not None}
        total = sum(size for _, size in _contiguous(sizes))
        if not total:
            return f"(no log under {url} yet)"
        data = b"".join(fs.cat_file(f"{root}/{part_name(seq, LOG_SUFFIX)}")[start:]
                        for seq, start in parts_to_read(sizes, max(0, total - max_bytes)))
    except Exception as e:  # noqa: BLE001 - a failure message must not fail for its tail
        return f"(log unreadable: {type(e).__name__}: {e})"
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def _contiguous(sizes: Mapping[int, int]) -> list[tuple[int, int]]:
    """(sequence number, size) of parts 1, 2, … up to the first missing one."""
    out, seq = [], 1
    while seq in sizes:
        out.append((seq, sizes[seq]))
        seq += 1
    return out
