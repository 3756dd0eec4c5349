"""The work of one partition step: read -> embed -> write, overlapped.

A reader thread (``corpus.prefetch.BatchPrefetcher``) fills a queue of at most ``prefetch`` record
batches (memory stays bounded by ``read_batch_rows × prefetch`` texts, not by the file); the calling
thread drives the device through ``encoder.Encoder`` (tokenizer threads ahead of it, results copied to the
host asynchronously); a writer thread takes each batch's vectors as they reach the host, hashes the texts
and appends to the atomic parquet writer. The calling thread does nothing but launch the model.

A worker that embeds several partitions passes one ``Encoder`` to every call (threads, tokenizer copies,
CUDA stream and a batch size reduced by an out-of-memory error carry over) and may pass a started
``BatchPrefetcher`` so the next file is read while the current one encodes.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import pyarrow as pa

from dagster_gpu.corpus.prefetch import BatchPrefetcher
from dagster_gpu.corpus.readers import RecordBatch, TextFormat
from dagster_gpu.embedding.encoder import Encoder, PendingEncoded
from dagster_gpu.embedding.model import LoadedModel
from dagster_gpu.embedding.writer import AtomicParquetWriter, output_schema

@dataclass(frozen=True)
class EmbeddingResult:
    """What one partition produced.

    Attributes:
        rows: rows written (= records kept).
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

    @property
    def texts_per_second(self) -> float:
        """rows / seconds (0.0 for an empty partition)."""
        return self.rows / self.seconds if self.rows and self.seconds > 0 else 0.0


def _to_table(batch: RecordBatch, vectors: np.ndarray, dim: int, schema: pa.Schema) -> pa.Table:
    hashes = [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in batch.texts]
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1), type=pa.float32())
    return pa.table(
        [pa.array(batch.ids, pa.int64()), pa.array(hashes, pa.string()), pa.FixedSizeListArray.from_arrays(flat, dim)],
        schema=schema,
    )


def embed_partition(
    source: str | BatchPrefetcher,
    output_uri: str,
    model: LoadedModel,
    text_format: TextFormat | None = None,
    *,
    batch_size: int = 64,
    read_batch_rows: int = 4096,
    prefetch: int = 2,
    normalize: bool = True,
    storage_options: Mapping[str, Any] | None = None,
    on_batch: Callable[[int], None] | None = None,
    encoder: Encoder | None = None,
    output_storage_options: Mapping[str, Any] | None = None,
) -> EmbeddingResult:
    """Embed every kept record of ``source`` into ``output_uri`` (parquet, atomic).

    ``source`` is a corpus file URI (read with ``text_format``, ``read_batch_rows``, ``prefetch`` and
    ``storage_options``) or a ``BatchPrefetcher`` (started or not; those four arguments are then its own,
    ``text_format`` may be None); it is closed on return. ``output_storage_options``: fsspec options for
    ``output_uri`` when the output lives on another store than the source (None = the source's:
    ``storage_options``, else the prefetcher's own). ``encoder``: reuse one across calls (not closed
    here; its batch size rules); None = an ``Encoder(model.model, batch_size, normalize=...)`` for this
    call only. ``batch_size`` is texts per forward pass. ``on_batch(rows_done)`` is called after each I/O
    batch is encoded. Raises CorpusReadError naming the file on bad input, ValueError when ``source`` is a
    URI without ``text_format``, EncoderOutOfMemory when one text does not fit the device; on any error
    no output appears and an earlier output at ``output_uri`` is kept.
    """
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
    schema = output_schema(model.dim)
    truncated = 0
    done = 0
    own_encoder = encoder is None
    t0 = time.perf_counter()
    reader.start()
    try:
        enc = encoder if encoder is not None else Encoder(model.model, batch_size, normalize=normalize)
        retries_before = enc.oom_retries
        batch_size_initial = enc.batch_size

        def finish(batch: RecordBatch, pending: PendingEncoded) -> int:
            """Writer thread: wait for the vectors, hash, write; returns the truncated count."""
            r = pending.result()
            writer.write(_to_table(batch, r.vectors, model.dim, schema))
            return r.truncated_rows

        try:
            with AtomicParquetWriter(output_uri, schema, out_options) as writer, ThreadPoolExecutor(1) as wpool:
                writes: deque = deque()
                for batch, pending in enc.encode_stream(reader):
                    writes.append(wpool.submit(finish, batch, pending))
                    while len(writes) > 2:  # bounded: at most 2 batches wait for the host/writer
                        truncated += writes.popleft().result()
                    done += len(batch)
                    if on_batch:
                        on_batch(done)
                while writes:
                    truncated += writes.popleft().result()
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
        truncated_rows=truncated,
        dim=model.dim,
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
    )
