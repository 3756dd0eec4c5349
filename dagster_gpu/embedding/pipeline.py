"""The work of one partition step: read -> embed -> write, overlapped.

A reader thread (``corpus.prefetch.BatchPrefetcher``) fills a queue of at most ``prefetch`` record
batches (memory stays bounded by ``read_batch_rows × prefetch`` texts, not by the file); the calling
thread drives the device through ``encoder.Encoder`` (tokenizer threads ahead of it, results copied to the
host asynchronously); a writer thread takes each batch's vectors as they reach the host, hashes the texts
and appends to the atomic parquet writer. The calling thread does nothing but launch the model.

Each model row (a record, or one chunk of it with ``chunking``) is one output row; the row's ``doc_id`` is the
record's ``id_column`` value, else ``<partition key>/<record_id>`` (a pure function of the partition key and the
record's ordinal in its file: the same on a re-run, in another range and on a retry). Columns and key-value
metadata: :mod:`dagster_gpu.embedding.writer`.

A worker that embeds several partitions passes one ``Encoder`` to every call (threads, tokenizer copies,
CUDA stream and a batch size reduced by an out-of-memory error carry over) and may pass a started
``BatchPrefetcher`` so the next file is read while the current one encodes.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import posixpath
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any, Callable, Mapping

import numpy as np
import pyarrow as pa

from dagster_gpu.corpus.prefetch import BatchPrefetcher
from dagster_gpu.corpus.readers import RecordBatch, TextFormat
from dagster_gpu.embedding.checkpoint import CheckpointKey, Checkpoints, Resume
from dagster_gpu.embedding.encoder import Encoder, PendingEncoded
from dagster_gpu.embedding.model import LoadedModel
from dagster_gpu.embedding.reuse import ReuseMap, load_previous, merge, plan
from dagster_gpu.embedding.spec import EmbeddingSpec
from dagster_gpu.embedding.writer import (
    RECORD_HASH_COLUMN,
    AtomicParquetWriter,
    lineage_metadata,
    output_schema,
    output_table,
)


@dataclass(frozen=True)
class CheckpointPolicy:
    """Checkpoints of one partition (:mod:`dagster_gpu.embedding.checkpoint`): ``source_version`` of the corpus
    file as the unit read it (part of the parts' key), a part committed every ``every_batches`` read batches."""

    source_version: str
    every_batches: int = 1


class Preempted(Exception):
    """``embed_partition`` stopped because its ``stop`` event was set: the batches it embedded are committed as
    parts (with a :class:`CheckpointPolicy`; else they are lost), no output was written. ``records``: kept records
    the committed parts cover, ``rows``: their output rows, ``parts_committed``: parts committed by this call;
    ``partition_key``: the partition's (the doc id prefix)."""

    def __init__(self, uri: str, records: int, rows: int, parts_committed: int, partition_key: str = ""):
        self.uri, self.records, self.rows, self.parts_committed = uri, records, rows, parts_committed
        self.partition_key = partition_key
        super().__init__(f"{uri}: stopped on request after {records} record(s) ({rows} row(s)) committed "
                         f"in checkpoint parts ({parts_committed} part(s) committed by this attempt)")


@dataclass(frozen=True)
class EmbeddingResult:
    """What one partition produced.

    Attributes:
        rows: rows written: chunks (= records kept without chunking).
        records_embedded: records with at least one row in the output (= records kept).
        tokens: tokens the model saw, over every row (prompt and special tokens included).
        record_tokens / covered_tokens: tokens of the records' own texts, and how many of them reached the
            model in at least one row (see :attr:`token_coverage`).
        records: records read, including skipped empty ones.
        skipped_empty_rows: empty/whitespace/null records not embedded.
        truncated_rows: kept records longer than the model's max sequence length (tokens).
        dim: vector dimension.
        seconds: wall seconds of read+embed+write (excludes model load).
        output_uri: where the parquet file is.
        dtype: the model's weight dtype (``float32``, ``float16``, ``bfloat16``).
        batch_size_initial / batch_size_final: texts per forward pass at the start and at the end (smaller
            after a CUDA out-of-memory error halved it).
        oom_retries: model batches retried at half size during this partition.
        tokenizer_threads, torch_threads: the encoder's threads (torch's intra-op threads at the end).
        tokenization: ``fast`` (per-thread Rust tokenizers, token-count order) or ``preprocess``.
        replaced_rows / skipped_undecodable_rows: records whose undecodable bytes were replaced (embedded) or
            that were left out, under ``TextFormat.decode_errors`` ``replace`` / ``skip``.
        reused_rows: output rows whose vector was taken from the previous output (its text unchanged, same
            fingerprint: :mod:`dagster_gpu.embedding.reuse`), not embedded; ``tokens``, ``record_tokens`` and
            ``covered_tokens`` count the embedded rows/records only.
        resumed_rows: output rows copied from checkpoint parts committed by an earlier, stopped attempt
            (:mod:`dagster_gpu.embedding.checkpoint`), not embedded by this one; the other counts cover the
            whole file (the parts carry theirs).
    """

    rows: int
    records: int
    skipped_empty_rows: int
    truncated_rows: int
    dim: int
    seconds: float
    output_uri: str
    dtype: str = "float32"
    batch_size_initial: int = 0
    batch_size_final: int = 0
    oom_retries: int = 0
    tokenizer_threads: int = 0
    torch_threads: int = 0
    tokenization: str = ""
    replaced_rows: int = 0
    skipped_undecodable_rows: int = 0
    records_embedded: int = 0
    tokens: int = 0
    record_tokens: int = 0
    covered_tokens: int = 0
    output_dtype: str = "float32"
    reused_rows: int = 0
    resumed_rows: int = 0

    @property
    def token_coverage(self) -> float:
        """covered_tokens / record_tokens: the share of the records' tokens that reached the model (1.0 for 0/0)."""
        return self.covered_tokens / self.record_tokens if self.record_tokens else 1.0

    @property
    def rows_embedded(self) -> int:
        """Output rows whose vector the model computed: ``rows`` less ``reused_rows``."""
        return max(0, self.rows - self.reused_rows)

    @property
    def texts_per_second(self) -> float:
        """Texts that reached the model per second: ``rows_embedded`` / ``seconds`` (0.0 when none did: an
        empty partition, or a file whose every row was reused; reused rows cost no model time and would
        inflate the figure the cost policy learns runtimes from)."""
        return self.rows_embedded / self.seconds if self.rows_embedded and self.seconds > 0 else 0.0


@dataclass
class _Counts:
    truncated: int = 0
    records: int = 0
    tokens: int = 0
    record_tokens: int = 0
    covered_tokens: int = 0
    reused: int = 0


def rows_of(batch: RecordBatch, r, doc_id_prefix: str, schema: pa.Schema, include_text: bool,
            record_hashes: list[str] | None = None) -> tuple[pa.Table, _Counts]:
    """The output rows of one read batch and its encoder result ``r`` (``Encoded``), and the batch's counts.

    ``r``'s per-row fields (record_index, chunk_index, char_start, char_end) say which record and which part
    of its text each vector is; an ``Encoded`` without them is one row per record, its whole text.
    ``record_hashes``: sha256 of each of the batch's texts, when known (the ``record_sha256`` column's source)."""
    n, m = len(batch), len(r.vectors)
    ri = np.asarray(getattr(r, "record_index", None) if getattr(r, "record_index", None) is not None else np.arange(n), np.int64)
    ci = getattr(r, "chunk_index", None)
    ci = np.zeros(m, np.int64) if ci is None else np.asarray(ci, np.int64)
    cs = getattr(r, "char_start", None)
    cs = np.zeros(m, np.int64) if cs is None else np.asarray(cs, np.int64)
    ce = getattr(r, "char_end", None)
    ce = np.array([len(batch.texts[i]) for i in ri], np.int64) if ce is None else np.asarray(ce, np.int64)
    if not (len(ri) == len(ci) == len(cs) == len(ce) == m):
        raise AssertionError(f"encoder returned {m} vectors for {len(ri)} row indices")
    texts = [batch.texts[i][a:b] for i, a, b in zip(ri.tolist(), cs.tolist(), ce.tolist())]
    if batch.doc_ids is not None:
        doc_ids = [batch.doc_ids[i] for i in ri.tolist()]
    else:
        doc_ids = [f"{doc_id_prefix}/{batch.ids[i]}" for i in ri.tolist()]
    rh = None
    if RECORD_HASH_COLUMN in schema.names:
        if record_hashes is None:
            record_hashes = [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in batch.texts]
        rh = [record_hashes[i] for i in ri.tolist()]
    take = pa.array(ri)
    table = output_table(
        schema, doc_ids=doc_ids, record_ids=np.asarray(batch.ids, np.int64)[ri] if m else [], chunk_index=ci,
        char_start=cs, char_end=ce, token_count=np.asarray(r.tokens, np.int64),
        hashes=[hashlib.sha256(t.encode("utf-8")).hexdigest() for t in texts], vectors=np.asarray(r.vectors).reshape(m, schema.field("vector").type.list_size),
        carried={c: a.take(take) for c, a in batch.columns.items()}, texts=texts if include_text else None,
        record_hashes=rh,
    )
    rt, cov = getattr(r, "record_tokens", None), getattr(r, "covered_tokens", None)
    counts = _Counts(
        truncated=int(r.truncated_rows), records=int(len(np.unique(ri))), tokens=int(np.sum(r.tokens)),
        record_tokens=int(np.sum(rt)) if rt is not None else 0, covered_tokens=int(np.sum(cov)) if cov is not None else 0,
        reused=int(getattr(r, "reused_rows", 0)),
    )
    counts.tokens -= int(getattr(r, "reused_tokens", 0))
    return table, counts


def _to_table(batch: RecordBatch, vectors: np.ndarray, dim: int, schema: pa.Schema, doc_id_prefix: str = "") -> pa.Table:
    """One output row per record of ``batch`` (its whole text, ``token_count`` 0: not counted) from ``vectors``
    [n, dim] computed elsewhere (bench/worker_rss.py's in-memory baseline)."""
    r = SimpleNamespace(vectors=np.asarray(vectors).reshape(len(batch), dim), tokens=np.zeros(len(batch), np.int64),
                        truncated_rows=0)
    return rows_of(batch, r, doc_id_prefix, schema, include_text=False)[0]


def _same_schema(a: pa.Schema, b: pa.Schema | None) -> bool:
    """Same fields (types, nullability) and the same key-value metadata. A parquet round trip names a
    fixed_size_list's child ``element`` where Arrow wrote ``item``: ``equals`` without metadata ignores that."""
    return b is not None and a.equals(b) and (a.metadata or {}) == (b.metadata or {})


def make_encoder(st, batch_size: int = 64, **options) -> Encoder:
    """``Encoder(st, batch_size, **options)``, passing only the options that differ from the Encoder's defaults
    (an encoder that predates an option still builds when it is left at its default). Raises ValueError (e.g.
    a chunk window with no room for the prompt) and TypeError for an option the Encoder does not have."""
    params = inspect.signature(Encoder).parameters
    given = {k: v for k, v in options.items()
             if not (k in params and params[k].default is not inspect.Parameter.empty and v == params[k].default)
             and not (k not in params and k in _ENCODER_DEFAULTS and v == _ENCODER_DEFAULTS[k])}
    return Encoder(st, batch_size, **given)


#: The Encoder's option defaults (dagster_gpu.embedding.encoder.Encoder).
_ENCODER_DEFAULTS = {"normalize": True, "prompt": "", "truncate_dim": None, "output_dtype": "float32", "chunking": None}


def embed_partition(
    source: str | BatchPrefetcher,
    output_uri: str,
    model: LoadedModel,
    text_format: TextFormat | None = None,
    *,
    spec: EmbeddingSpec = EmbeddingSpec(),
    read_batch_rows: int = 4096,
    prefetch: int = 2,
    storage_options: Mapping[str, Any] | None = None,
    on_batch: Callable[[int], None] | None = None,
    encoder: Encoder | None = None,
    output_storage_options: Mapping[str, Any] | None = None,
    partition_key: str | None = None,
    lineage: Mapping[str, Any] | None = None,
    reuse: bool = True,
    checkpoint: CheckpointPolicy | None = None,
    stop: threading.Event | None = None,
    doc_id_prefix: str | None = None,
) -> EmbeddingResult:
    """Embed every kept record of ``source`` into ``output_uri`` (parquet, atomic).

    ``source`` is a corpus file URI (read with ``text_format``, ``read_batch_rows``, ``prefetch`` and
    ``storage_options``) or a ``BatchPrefetcher`` (started or not; those four arguments are then its own,
    ``text_format`` may be None); it is closed on return. ``output_storage_options``: fsspec options for
    ``output_uri`` when the output lives on another store than the source (None = the source's:
    ``storage_options``, else the prefetcher's own). ``spec``: the model's options, prompt, chunking, vectors and
    columns (:class:`dagster_gpu.embedding.spec.EmbeddingSpec`; the model itself is ``model``, loaded by the
    caller). ``encoder``: reuse one across calls (not closed here; its batch size and options rule, ``spec``'s
    columns and ``output_dtype`` still apply); None = ``make_encoder(model.model, spec.batch_size, prompt=<the
    spec's prompt for this model>, **spec.encoder_options())`` for this call only.
    ``on_batch(rows_done)`` is called after each I/O batch is encoded (records, not chunks).

    ``partition_key``: the ``doc_id`` prefix when the corpus has no id column (None = the source file's
    name), and the checkpoint parts' key. ``doc_id_prefix``: another ``doc_id`` prefix than ``partition_key`` (a
    shard's: the whole file's key, so that its rows' ids are the file's). ``lineage``: ``{"fingerprint", "model", "model_revision", ...}`` written as the file's
    key-value metadata (:func:`dagster_gpu.embedding.writer.lineage_metadata`); None = none.

    ``reuse``: when the output at ``output_uri`` was written under ``lineage["fingerprint"]``, records whose text
    is unchanged take its vectors (and chunks) instead of the encoder's (:mod:`dagster_gpu.embedding.reuse`):
    only new or changed texts reach the device; rows and their order are those of a full embed. No lineage
    fingerprint, another fingerprint, or no readable previous output: everything is embedded.

    ``checkpoint``: commit the output rows every ``checkpoint.every_batches`` read batches as a part beside the
    output (keyed by ``partition_key``, ``checkpoint.source_version``, ``lineage["fingerprint"]`` and the read
    batch size), and continue after the parts an earlier stopped attempt committed
    (:mod:`dagster_gpu.embedding.checkpoint`): the output is the file an uninterrupted call writes; the parts are
    removed once it is written. ``stop``: checked after each read batch is handed to the writer (and once before
    the first): when set, the batches encoded so far are written and committed as a part, and ``Preempted`` is
    raised (the batch on the device when it was set is finished first: at most one read batch of encoding).

    Raises Preempted (see ``stop``), CorpusReadError naming the file on bad input, ValueError when ``source`` is a URI without
    ``text_format``, EncoderOutOfMemory when one text does not fit the device; on any error no output
    appears and an earlier output at ``output_uri`` is kept.
    """
    include_text, output_dtype = spec.include_text, spec.output_dtype
    if isinstance(source, BatchPrefetcher):
        reader = source
    else:
        if text_format is None:
            raise ValueError(f"embed_partition({source!r}): text_format is required for a URI source")
        reader = BatchPrefetcher(source, text_format, read_batch_rows, storage_options, depth=max(1, prefetch))
    # The output's storage options: its own when given, else the source's (the caller's, else the prefetcher's).
    if output_storage_options is not None:
        out_options = output_storage_options
    else:
        out_options = storage_options if storage_options is not None or reader is not source else reader.storage_options
    prefix = partition_key if partition_key is not None else posixpath.basename(reader.uri.rstrip("/"))
    id_prefix = doc_id_prefix if doc_id_prefix is not None else prefix
    kv = None
    if lineage is not None:
        rest = {k: v for k, v in lineage.items() if k not in ("fingerprint", "model", "model_revision")}
        kv = lineage_metadata(fingerprint=str(lineage.get("fingerprint", "")), model=str(lineage.get("model", model.name)),
                              model_revision=str(lineage.get("model_revision", getattr(model, "revision", ""))),
                              lineage={**rest, "partition_key": prefix, "source": reader.uri})
    total = _Counts()
    done = 0
    own_encoder = encoder is None
    t0 = time.perf_counter()
    reader.start()
    try:
        if stop is not None and stop.is_set():  # asked to stop before anything was embedded
            raise Preempted(output_uri, 0, 0, 0, prefix)
        enc = encoder if encoder is not None else make_encoder(
            model.model, spec.batch_size, prompt=spec.resolve_prompt(model.model)[0], **spec.encoder_options())
        dim = int(enc.dim)
        retries_before = enc.oom_retries
        batch_size_initial = enc.batch_size
        writer: AtomicParquetWriter | None = None
        chunked = getattr(enc, "chunking", None) is not None
        previous = ReuseMap(reason="reuse off")
        store: Checkpoints | None = None
        resume, parts, resumed_rows, stopped = Resume(), None, 0, False
        if checkpoint is not None:
            store = Checkpoints(output_uri, CheckpointKey(prefix, str(checkpoint.source_version),
                                                          str((lineage or {}).get("fingerprint", "")),
                                                          int(reader.read_batch_rows)), out_options)
            resume = store.load()
        if reuse and lineage is not None:
            previous = load_previous(output_uri, str(lineage.get("fingerprint", "")), chunked=chunked,
                                     max_seq_length=getattr(enc, "max_seq_length", None), dim=dim,
                                     output_dtype=output_dtype, storage_options=out_options)

        def schema_for(batch: RecordBatch | None) -> pa.Schema:
            types = {c: a.type for c, a in batch.columns.items()} if batch is not None else dict(reader.stats.carried_types)
            carried = [pa.field(c, types.get(c, pa.string())) for c in reader.text_format.carry_columns]
            return output_schema(dim, carried=carried, include_text=include_text, output_dtype=output_dtype, metadata=kv,
                                 record_hash=chunked)

        def finish(batch, pending: PendingEncoded) -> _Counts:
            """Writer thread: wait for the vectors, hash, write; returns the batch's counts."""
            if len(previous):  # batch is a reuse.Planned: merge the embedded texts' rows with the reused ones
                table, counts = rows_of(batch.batch, merge(batch, pending.result(), previous), id_prefix, writer.schema,
                                        include_text, batch.hashes)
            else:
                table, counts = rows_of(batch, pending.result(), id_prefix, writer.schema, include_text)
            writer.write(table)
            if parts is not None:
                parts.add(table, len(batch.batch if len(previous) else batch), asdict(counts))
            return counts

        def open_writer(stack: ExitStack, batch: RecordBatch | None) -> AtomicParquetWriter:
            nonlocal parts
            w = stack.enter_context(AtomicParquetWriter(output_uri, schema_for(batch), out_options))
            if store is not None:
                parts = store.part_writer(w.schema, checkpoint.every_batches, resume)
            return w

        def add(c: _Counts) -> None:
            total.truncated += c.truncated
            total.records += c.records
            total.tokens += c.tokens
            total.record_tokens += c.record_tokens
            total.covered_tokens += c.covered_tokens
            total.reused += c.reused

        try:
            with ExitStack() as stack:
                wpool = stack.enter_context(ThreadPoolExecutor(1))
                writes: deque = deque()
                batches = iter(reader)
                if resume.paths:  # continue after the committed parts, if they are this file's first batches
                    first = next(batches, None)
                    if first is not None and _same_schema(schema_for(first), resume.schema):
                        writer = open_writer(stack, first)
                        for path in resume.paths:
                            for table in store.read_row_groups(path):
                                writer.write(table)
                        resumed_rows = writer.rows
                        batches = itertools.islice(itertools.chain([first], batches), resume.progress.batches, None)
                        for name, value in resume.progress.counts.items():
                            if hasattr(total, name):
                                setattr(total, name, int(value))
                        done = resume.progress.records
                    else:  # another layout than this run's: start over
                        store.remove()
                        resume = Resume()
                        batches = itertools.chain([first] if first is not None else [], batches)
                if len(previous):
                    stream = enc.encode_stream((plan(b, previous) for b in batches), texts=lambda p: p.embed_texts)
                else:
                    stream = enc.encode_stream(batches)
                for item, pending in stream:
                    batch = item.batch if len(previous) else item
                    if writer is None:  # the carried columns' types are those of the first batch
                        writer = open_writer(stack, batch)
                    writes.append(wpool.submit(finish, item, pending))
                    while len(writes) > 2:  # bounded: at most 2 batches wait for the host/writer
                        add(writes.popleft().result())
                    done += len(batch)
                    if on_batch:
                        on_batch(done)
                    if stop is not None and stop.is_set():
                        stopped = True
                        break
                while writes:
                    add(writes.popleft().result())
                if stopped:  # commit what was embedded; the output's temp file is discarded
                    if parts is None:
                        raise Preempted(output_uri, 0, 0, 0, prefix)
                    parts.commit()
                    raise Preempted(output_uri, parts.progress.records, parts.progress.rows, parts.committed, prefix)
                if writer is None:  # no record kept: a valid file with no rows
                    writer = open_writer(stack, None)
            if store is not None:  # the output is written: its parts are no longer needed
                store.remove()
        finally:
            if own_encoder:
                enc.close()
    finally:
        reader.close()
    seconds = time.perf_counter() - t0
    stats = reader.stats
    return EmbeddingResult(
        rows=writer.rows,
        records=stats.records,
        skipped_empty_rows=stats.skipped_empty,
        truncated_rows=total.truncated,
        dim=dim,
        seconds=seconds,
        output_uri=output_uri,
        dtype=enc.dtype,
        batch_size_initial=batch_size_initial,
        batch_size_final=enc.batch_size,
        oom_retries=enc.oom_retries - retries_before,
        tokenizer_threads=enc.tokenizer_threads,
        torch_threads=enc.torch_threads,
        tokenization=enc.mode,
        replaced_rows=stats.replaced_rows,
        skipped_undecodable_rows=stats.skipped_undecodable_rows,
        records_embedded=total.records,
        tokens=total.tokens,
        record_tokens=total.record_tokens,
        covered_tokens=total.covered_tokens,
        output_dtype=output_dtype,
        reused_rows=total.reused,
        resumed_rows=resumed_rows,
    )
