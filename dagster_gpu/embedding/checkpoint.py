"""Checkpoints inside a partition: committed parts of its output that a stopped unit continues after.

A unit that is preempted (or killed) mid-file would otherwise embed the file again from its first record. With
checkpoints the pipeline (:func:`dagster_gpu.embedding.pipeline.embed_partition`) commits the output rows of every
``every_batches`` read batches as one *part*, beside the output; a unit that starts the partition again copies the
committed parts into the new output, skips the read batches they cover (they are read, not embedded) and embeds the
rest. The final output is the file an uninterrupted run writes: the same rows in the same order, the same vectors
bit for bit (the encoder plans, sorts and pads each read batch on its own, so a read batch's vectors do not depend
on the batches before it), the same schema and key-value metadata, one row group per read batch as before. The
parts are removed once the output is written.

Layout, for the output ``<dir>/<name>``::

    <dir>/.<name>.parts/<digest>/part-000000.parquet                committed parts, in order
    <dir>/.<name>.parts/<digest>/.part-000001.parquet.tmp-<hex>     a part being written: never read

``digest``: the first 16 hex digits of sha256 over the JSON of the :class:`CheckpointKey` (partition key, source
version, fingerprint, records per read batch). Parts of another source version, fingerprint or read layout live
in another directory: they are never read, and :meth:`Checkpoints.load` removes them. Each part's parquet
key-value metadata holds the output's own metadata plus ``dagster_gpu.checkpoint`` (JSON): the key, the part's
index and the progress after it, cumulative: read batches, kept records and rows consumed, and the pipeline's
counts (tokens, truncated rows, ...).

Commit (temp + rename): a part is written completely under a temp name in its directory, then renamed to its
committed name. Local files: write, ``fsync`` the file, ``os.replace`` (atomic on POSIX: rename(2)), ``fsync`` the
directory, so a committed part survives a crash of the host too. Object stores (fsspec, e.g. s3fs): the temp key is
uploaded completely (an S3 object becomes visible only when its PUT or multipart upload completes), then ``fs.mv``
copies it to the part's key (the key appears only complete) and deletes the temp key. A unit killed at any
instant, SIGKILL included, leaves a committed part or a temp object, never a torn part, and its committed parts are
always ``0 … k`` (they are removed last first); :meth:`Checkpoints.load`
ignores and removes temp objects, and reads only parts ``0, 1, 2, ...`` whose footer reads back with this key
(the first one that does not ends the list; it and the later ones are removed).

Starting a partition also removes the temp file of the output that a killed attempt left (local files).

Memory: the rows of one part wait in memory until it is committed (``every_batches × read_batch_rows`` output
rows; with chunking, their chunks).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import posixpath
import re
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Mapping

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

#: The part's key-value metadata key holding its :class:`PartInfo` (JSON).
META_CHECKPOINT = "dagster_gpu.checkpoint"
#: Suffix of the staging directory beside an output: ``.<output name>.parts``.
STAGING_SUFFIX = ".parts"
_PART = re.compile(r"^part-(\d{6})\.parquet$")


@dataclass(frozen=True)
class CheckpointKey:
    """What a part's rows depend on besides the corpus file's bytes: ``partition_key``, ``source_version`` (the
    file's version as the unit read it: ETag, version id or size + mtime), ``fingerprint`` (everything that
    changes a vector) and ``read_batch_rows`` (the read batches a part's boundaries follow)."""

    partition_key: str
    source_version: str
    fingerprint: str
    read_batch_rows: int

    @property
    def digest(self) -> str:
        """First 16 hex digits of sha256 over this key's sorted JSON: the staging subdirectory's name."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Progress:
    """How far committed parts reach, cumulative from the start of the file: ``batches`` read batches,
    ``records`` kept records of them, ``rows`` output rows, and ``counts`` (the pipeline's named counters)."""

    batches: int = 0
    records: int = 0
    rows: int = 0
    counts: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Resume:
    """The committed parts a unit continues after (``paths`` in order; empty = start from the first record),
    ``progress`` after the last of them and ``schema`` the output schema they were written with (None when no
    part)."""

    paths: tuple[str, ...] = ()
    progress: Progress = Progress()
    schema: pa.Schema | None = None


def staging_dir(output_uri: str, storage_options: Mapping[str, Any] | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, path) of the staging directory beside ``output_uri``: ``<dir>/.<name>.parts``."""
    fs, path = fsspec.core.url_to_fs(output_uri, **dict(storage_options or {}))
    head, tail = posixpath.split(path)
    return fs, posixpath.join(head, f".{tail}{STAGING_SUFFIX}")


class Checkpoints:
    """The checkpoints of one partition's output at ``output_uri`` under ``key``.

    ``load()`` once at the start (it removes other keys' parts and temp objects), ``part_writer(...)`` for the
    run, ``remove()`` once the output is written. Raises nothing for a missing staging directory; store errors
    (permissions, network) propagate from ``commit`` and ``load``.
    """

    def __init__(self, output_uri: str, key: CheckpointKey, storage_options: Mapping[str, Any] | None = None):
        self.output_uri = output_uri
        self.key = key
        self.fs, self.root = staging_dir(output_uri, storage_options)
        self.dir = posixpath.join(self.root, key.digest)
        self.local = isinstance(self.fs, LocalFileSystem)

    # -- reading --------------------------------------------------------------------------------------
    def load(self) -> Resume:
        """The committed parts of this key, in order, after removing everything else under the staging
        directory: other keys' directories, temp objects, and parts after a gap or an unreadable part. On a local
        filesystem it also removes the output's own temp files (``.<name>.tmp-*``, what a writer killed before
        its rename leaves; on an object store an unfinished upload leaves no object)."""
        if self.local:
            head, tail = posixpath.split(self.root[: -len(STAGING_SUFFIX)])  # <dir>/.<name>
            for stale in glob.glob(posixpath.join(glob.escape(head), f"{glob.escape(tail)}.tmp-*")):
                _unlink(stale)
        if not self.fs.exists(self.root):
            return Resume()
        for entry in self._ls(self.root):
            if posixpath.basename(entry.rstrip("/")) != self.key.digest:
                self._rm(entry)
        if not self.fs.exists(self.dir):
            return Resume()
        parts: dict[int, str] = {}
        for entry in self._ls(self.dir):
            m = _PART.match(posixpath.basename(entry))
            if m:
                parts[int(m.group(1))] = entry
            else:  # a temp object of an attempt that was killed while writing, or a stranger: never read
                self._rm(entry)
        paths: list[str] = []
        progress, schema = Progress(), None
        for i in range(len(parts) + 1):
            if i not in parts:
                break
            info = self._read_info(parts[i])
            if info is None or info.get("key") != asdict(self.key) or info.get("index") != i:
                break
            progress = Progress(int(info["batches"]), int(info["records"]), int(info["rows"]),
                                {k: int(v) for k, v in dict(info.get("counts") or {}).items()})
            if schema is None:
                schema = _strip(self._schema(parts[i]))
            paths.append(parts[i])
        for i, p in parts.items():  # after a gap or a part that does not read back: not continued after
            if i >= len(paths):
                self._rm(p)
        return Resume(tuple(paths), progress, schema)

    def read_row_groups(self, path: str) -> Iterator[pa.Table]:
        """A committed part's row groups (one per read batch), in order."""
        with self.fs.open(path, "rb") as f:
            pf = pq.ParquetFile(f)
            for i in range(pf.num_row_groups):
                yield pf.read_row_group(i)

    def _read_info(self, path: str) -> dict | None:
        try:
            kv = self._schema(path).metadata or {}
            return json.loads(kv[META_CHECKPOINT.encode()])
        except Exception:  # noqa: BLE001 - a part that does not read back is not continued after
            return None

    def _schema(self, path: str) -> pa.Schema:
        with self.fs.open(path, "rb") as f:
            return pq.ParquetFile(f).schema_arrow

    def _ls(self, path: str) -> list[str]:
        try:
            return [e["name"] if isinstance(e, dict) else e for e in self.fs.ls(path, detail=False)]
        except FileNotFoundError:
            return []

    def _rm(self, path: str) -> None:
        try:
            self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass

    # -- writing --------------------------------------------------------------------------------------
    def part_writer(self, schema: pa.Schema, every_batches: int, resume: Resume) -> "PartWriter":
        """A writer of this key's next parts, continuing after ``resume``."""
        return PartWriter(self, schema, every_batches, len(resume.paths), resume.progress)

    def commit(self, index: int, schema: pa.Schema, tables: list[pa.Table], info: Mapping[str, Any]) -> str:
        """Write part ``index`` (``tables``: one row group each) atomically; returns its path."""
        meta = {**(schema.metadata or {}), META_CHECKPOINT.encode(): json.dumps(dict(info), sort_keys=True).encode()}
        part_schema = schema.with_metadata(meta)
        name = f"part-{index:06d}.parquet"
        final = posixpath.join(self.dir, name)
        tmp = posixpath.join(self.dir, f".{name}.tmp-{uuid.uuid4().hex[:12]}")
        if self.local:
            os.makedirs(self.dir, exist_ok=True)
            try:
                with open(tmp, "wb") as f:
                    _write(f, part_schema, tables)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, final)
            except BaseException:
                _unlink(tmp)
                raise
            _fsync_dir(self.dir)
        else:
            try:
                with self.fs.open(tmp, "wb") as f:
                    _write(f, part_schema, tables)
                self.fs.mv(tmp, final)
            except BaseException:
                try:
                    self._rm(tmp)
                except Exception:  # noqa: BLE001 - best effort: never mask the original error
                    pass
                raise
        return final

    def remove(self) -> None:
        """Remove this output's staging directory (every key's parts); no error when there is none.

        Each key's parts go last first, one at a time, before the directory: a unit killed while removing them
        leaves parts ``0 … k``, which the next :meth:`load` continues after, never a gap that would make it
        drop the parts behind it (a recursive remove deletes in directory order)."""
        for entry in self._ls(self.root):
            parts = {int(m.group(1)): e for e in self._ls(entry) if (m := _PART.match(posixpath.basename(e)))}
            for i in sorted(parts, reverse=True):
                self._rm(parts[i])
        self._rm(self.root)


class PartWriter:
    """Collects one read batch's output rows at a time (``add``) and commits a part every ``every_batches``
    batches; ``commit()`` commits what is pending (a stopping unit's last, shorter part). Not thread-safe: call
    it from one thread (the pipeline's writer thread, then the embedding thread after that one is idle)."""

    def __init__(self, store: Checkpoints, schema: pa.Schema, every_batches: int, next_index: int, progress: Progress):
        if every_batches < 1:
            raise ValueError(f"every_batches must be >= 1, got {every_batches}")
        self.store, self.schema, self.every = store, schema, every_batches
        self.index = next_index
        self.progress = progress
        self._tables: list[pa.Table] = []
        self._records = 0
        self._counts: dict[str, int] = dict(progress.counts)
        self.committed = 0  # parts committed by this writer

    def add(self, table: pa.Table, records: int, counts: Mapping[str, int]) -> None:
        """The rows of the next read batch (``records`` kept records) and its ``counts``; commits a part when
        ``every_batches`` are pending."""
        self._tables.append(table)
        self._records += records
        for k, v in counts.items():
            self._counts[k] = self._counts.get(k, 0) + int(v)
        if len(self._tables) >= self.every:
            self.commit()

    def commit(self) -> None:
        """Commit the pending batches as the next part (nothing pending: nothing written)."""
        if not self._tables:
            return
        p = self.progress
        progress = Progress(p.batches + len(self._tables), p.records + self._records,
                            p.rows + sum(t.num_rows for t in self._tables), dict(self._counts))
        info = {"key": asdict(self.store.key), "index": self.index, "batches": progress.batches,
                "records": progress.records, "rows": progress.rows, "counts": dict(progress.counts)}
        self.store.commit(self.index, self.schema, self._tables, info)
        self.progress = progress
        self.index += 1
        self.committed += 1
        self._tables, self._records = [], 0


def _write(f, schema: pa.Schema, tables: list[pa.Table]) -> None:
    with pq.ParquetWriter(f, schema, compression="zstd") as w:
        for t in tables:
            w.write_table(t)


def _strip(schema: pa.Schema) -> pa.Schema:
    """``schema`` without the part's own key-value entry (what the output itself carries)."""
    meta = {k: v for k, v in (schema.metadata or {}).items() if k != META_CHECKPOINT.encode()}
    return schema.with_metadata(meta) if meta else schema.remove_metadata()


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
