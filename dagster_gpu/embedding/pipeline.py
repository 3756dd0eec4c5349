"""The work of one partition step: read -> embed -> write, overlapped.

A reader thread fills a queue of at most ``prefetch`` record batches (memory stays bounded by
``read_batch_rows × prefetch`` texts, not by the file), the calling thread encodes (with tokenization
overlapped, see ``encoder.py``), and a writer thread
counts truncated texts, hashes and appends to the atomic parquet writer, so I/O and the extra
tokenization hide behind the model (the calling thread does nothing but encode).

The writer thread counts with its own copy of the tokenizer: a Hugging Face fast tokenizer's truncation and
padding settings are state on the tokenizer, which ``encode`` sets on every call, so sharing one between
threads could count with truncation switched on (or fail with "Already borrowed").
"""

from __future__ import annotations

import copy
import hashlib
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import pyarrow as pa

from dagster_gpu.corpus.readers import ReadStats, RecordBatch, TextFormat, read_batches
from dagster_gpu.embedding.encoder import OverlappedEncoder
from dagster_gpu.embedding.model import LoadedModel
from dagster_gpu.embedding.truncation import count_truncated
from dagster_gpu.embedding.writer import AtomicParquetWriter, output_schema

_DONE = object()

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
    """

    rows: int
    records: int
    skipped_empty_rows: int
    truncated_rows: int
    dim: int
    seconds: float
    output_uri: str

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
    source_uri: str,
    output_uri: str,
    model: LoadedModel,
    text_format: TextFormat,
    *,
    batch_size: int = 64,
    read_batch_rows: int = 4096,
    prefetch: int = 2,
    normalize: bool = True,
    storage_options: Mapping[str, Any] | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> EmbeddingResult:
    """Embed every kept record of ``source_uri`` into ``output_uri`` (parquet, atomic).

    ``batch_size`` is the model's batch (texts per forward pass); ``read_batch_rows`` the I/O batch.
    ``on_batch(rows_done)`` is called after each I/O batch is encoded. Raises CorpusReadError naming the
    file on bad input; on any error no output appears and an earlier output at ``output_uri`` is kept.
    """
    schema = output_schema(model.dim)
    stats = ReadStats()
    truncated = 0
    done = 0
    q: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
    stop = threading.Event()

    def produce() -> None:
        try:
            for b in read_batches(source_uri, text_format, read_batch_rows, stats, dict(storage_options or {})):
                while not stop.is_set():
                    try:
                        q.put(b, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(_DONE)
        except BaseException as e:  # handed to the consumer, which re-raises it
            q.put(e)

    st = model.model
    encoder = OverlappedEncoder(st, batch_size, normalize=normalize)
    counting_tokenizer = copy.deepcopy(st.tokenizer)  # the encoder's thread owns the model's tokenizer

    def finish(batch: RecordBatch, vectors: np.ndarray, tokens: np.ndarray) -> int:
        """Writer thread: count truncated texts, hash, write; returns the truncated count.

        Only texts that filled the whole sequence (tokens == max_seq_length) can have been truncated;
        those are tokenized again without truncation to count exactly."""
        full = [t for t, k in zip(batch.texts, tokens) if k >= model.max_seq_length]
        n = count_truncated(counting_tokenizer, full, model.max_seq_length) if full else 0
        writer.write(_to_table(batch, vectors, model.dim, schema))
        return n

    t0 = time.perf_counter()
    reader = threading.Thread(target=produce, name="dagster-gpu-reader", daemon=True)
    reader.start()
    try:
        with AtomicParquetWriter(output_uri, schema, storage_options) as writer, ThreadPoolExecutor(1) as wpool:
            pending = None
            while True:
                item = q.get()
                if item is _DONE:
                    break
                if isinstance(item, BaseException):
                    raise item
                vectors, tokens = encoder.encode(item.texts)
                if pending is not None:
                    truncated += pending.result()
                pending = wpool.submit(finish, item, vectors, tokens)
                done += len(item)
                if on_batch:
                    on_batch(done)
            if pending is not None:
                truncated += pending.result()
    finally:
        stop.set()
        encoder.close()
        reader.join(timeout=5)
    seconds = time.perf_counter() - t0
    return EmbeddingResult(
        rows=writer.rows,
        records=stats.records,
        skipped_empty_rows=stats.skipped_empty,
        truncated_rows=truncated,
        dim=model.dim,
        seconds=seconds,
        output_uri=output_uri,
    )
