"""Reading a file group (a bucket of ``CorpusSource.group_buckets``): its files' records as one stream of batches.

The files are read in key order; each keeps its own record ids (its records' ordinals, as
:func:`dagster_gpu.corpus.readers.read_batches` numbers them) and, without ``TextFormat.id_column``, its own
``doc_id`` values ``<file key>/<record id>`` (what the file would have as a partition of its own), so the rows of a
bucket are each file's rows. Batches are refilled across files to ``read_batch_rows`` records (a bucket of
thousands of one-record files still reaches the model in full batches); the cut points depend only on the files
and ``read_batch_rows``, so a checkpointed rerun skips the same batches.

Small files are read ``parallel_files`` at a time on a thread pool, whole (the latency of an object store's GET
is paid in parallel, not once per file in turn): memory is bounded by ``parallel_files`` small files plus the
batches being refilled. A file above ``whole_file_bytes`` is streamed batch by batch when its turn comes.

Errors: a file that cannot be read raises its reader's ``CorpusReadError`` (the message names the file), or its
store's error; the whole bucket fails with it and no output is written (an earlier output is kept). With
``id_column``, an id that two files of the bucket share raises ``CorpusReadError`` naming both (memory: one set
entry per record, as the reader's own check within a file). Carried
columns take the types of the bucket's first file that has them; a later file whose values do not convert
raises ``CorpusReadError`` naming that file.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterable, Iterator, Mapping, Sequence

import pyarrow as pa

from dagster_gpu.corpus.prefetch import BatchPrefetcher
from dagster_gpu.corpus.readers import CorpusReadError, ReadStats, RecordBatch, TextFormat, read_batches

#: Files up to this many bytes are read whole on the pool; larger ones are streamed in their turn.
WHOLE_FILE_BYTES = 8 * 1024 * 1024
#: Files read at once on the pool.
PARALLEL_FILES = 8


def read_group_batches(members: Sequence[Any], fmt: TextFormat, batch_rows: int, stats: ReadStats,
                       storage_options: Mapping[str, Any] | None = None, *, parallel_files: int = PARALLEL_FILES,
                       whole_file_bytes: int = WHOLE_FILE_BYTES) -> Iterator[RecordBatch]:
    """Yield the records of ``members`` (CorpusFiles: ``key``, ``uri``, ``size_bytes``), in that order, as batches
    of ``batch_rows`` kept records (the last one shorter); ``stats`` adds up every file's counts. Raises ValueError
    for ``batch_rows`` or ``parallel_files`` below 1, and the first unreadable file's error (see the module doc)."""
    if batch_rows < 1 or parallel_files < 1:
        raise ValueError(f"batch_rows and parallel_files must be >= 1, got {batch_rows}, {parallel_files}")
    options = dict(storage_options or {})
    refill = _Refill(fmt, batch_rows)
    with ThreadPoolExecutor(parallel_files, thread_name_prefix="dagster-gpu-group-read") as pool:
        queued: deque[tuple[Any, Future | None]] = deque()
        todo = iter(members)

        def queue_next() -> None:
            m = next(todo, None)
            if m is not None:
                whole = int(m.size_bytes) <= whole_file_bytes
                queued.append((m, pool.submit(_read_whole, m.uri, fmt, batch_rows, options) if whole else None))

        for _ in range(parallel_files):
            queue_next()
        try:
            while queued:
                m, future = queued.popleft()
                queue_next()
                own = ReadStats()
                batches: Iterable[RecordBatch]
                if future is None:
                    batches = read_batches(m.uri, fmt, batch_rows, own, options)
                else:
                    batches, own = future.result()
                for b in batches:
                    yield from refill.add(m, b)
                _add(stats, own)
            yield from refill.flush()
        finally:
            for _m, future in queued:
                if future is not None:
                    future.cancel()


def _read_whole(uri: str, fmt: TextFormat, batch_rows: int, options: dict) -> tuple[list[RecordBatch], ReadStats]:
    own = ReadStats()
    return list(read_batches(uri, fmt, batch_rows, own, options)), own


def _add(total: ReadStats, one: ReadStats) -> None:
    total.records += one.records
    total.skipped_empty += one.skipped_empty
    total.replaced_rows += one.replaced_rows
    total.skipped_undecodable_rows += one.skipped_undecodable_rows
    for c, t in one.carried_types.items():
        total.carried_types.setdefault(c, t)


class _Refill:
    """Batches of exactly ``batch_rows`` records from parts of any size (the last one shorter)."""

    def __init__(self, fmt: TextFormat, batch_rows: int):
        self.fmt, self.batch_rows = fmt, batch_rows
        self.parts: list[RecordBatch] = []
        self.n = 0
        self.types: dict[str, pa.DataType] = {}
        self.seen: dict[str, str] = {}  # id_column value -> the file key that has it

    def add(self, member, b: RecordBatch) -> Iterator[RecordBatch]:
        if not len(b):
            return
        if self.fmt.id_column is None:  # the file's own ids, as if it were its own partition
            b.doc_ids = [f"{member.key}/{i}" for i in b.ids]
        else:  # the reader checked them within the file; one bucket's rows must not share an id either
            for doc_id, record_id in zip(b.doc_ids or [], b.ids):
                other = self.seen.setdefault(doc_id, member.key)
                if other != member.key:
                    raise CorpusReadError(
                        f"{member.uri}: record_id {record_id}: id {doc_id!r} in column {self.fmt.id_column!r} is also "
                        f"in file {other!r} of this file group; ids must be unique within a file group")
        for c, a in list(b.columns.items()):
            known = self.types.setdefault(c, a.type)
            if a.type != known:
                try:
                    b.columns[c] = a.cast(known)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                    raise CorpusReadError(f"{member.uri}: carried column {c!r} is {a.type}, which does not convert to "
                                          f"{known} (its type in this group's earlier files): {e}") from e
        self.parts.append(b)
        self.n += len(b)
        while self.n >= self.batch_rows:
            yield self._take(self.batch_rows)

    def flush(self) -> Iterator[RecordBatch]:
        if self.n:
            yield self._take(self.n)

    def _take(self, k: int) -> RecordBatch:
        out = RecordBatch(doc_ids=[])
        columns: dict[str, list[pa.Array]] = {}
        left = k
        while left:
            b = self.parts[0]
            if len(b) <= left:
                self.parts.pop(0)
                head = b
            else:
                head, self.parts[0] = _slice(b, 0, left), _slice(b, left, len(b))
            out.ids += head.ids
            out.texts += head.texts
            out.doc_ids += head.doc_ids or []
            for c, a in head.columns.items():
                columns.setdefault(c, []).append(a)
            left -= len(head)
        self.n -= k
        out.columns = {c: pa.concat_arrays(arrays) for c, arrays in columns.items()}
        return out


def _slice(b: RecordBatch, start: int, end: int) -> RecordBatch:
    return RecordBatch(ids=b.ids[start:end], texts=b.texts[start:end],
                       doc_ids=b.doc_ids[start:end] if b.doc_ids is not None else None,
                       columns={c: a.slice(start, end - start) for c, a in b.columns.items()})


class GroupPrefetcher(BatchPrefetcher):
    """A :class:`dagster_gpu.corpus.prefetch.BatchPrefetcher` of a whole file group: ``group`` is the bucket's
    CorpusFile (its ``members`` are read, see :func:`read_group_batches`); ``uri`` is the bucket's (the corpus
    root), ``stats`` the sum over its files."""

    def __init__(self, group, text_format: TextFormat, read_batch_rows: int = 4096,
                 storage_options: Mapping[str, Any] | None = None, depth: int = 2,
                 parallel_files: int = PARALLEL_FILES):
        super().__init__(group.uri, text_format, read_batch_rows, storage_options, depth)
        self.members = tuple(group.members)
        self.parallel_files = parallel_files

    def _batches(self) -> Iterator[RecordBatch]:
        return read_group_batches(self.members, self.text_format, self.read_batch_rows, self.stats,
                                  self.storage_options, parallel_files=self.parallel_files)


__all__ = ["GroupPrefetcher", "PARALLEL_FILES", "WHOLE_FILE_BYTES", "read_group_batches"]
