"""Read a corpus file's record batches on a thread, ahead of their consumer.

A worker that embeds many partitions back to back starts the next file's ``BatchPrefetcher`` while the
current one encodes, so reading never stalls the device between files. Memory is bounded by
``depth`` record batches of ``read_batch_rows`` records (plus the one the reader is building).
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Iterator, Mapping

from dagster_gpu.corpus.readers import ReadStats, RecordBatch, TextFormat, read_batches

_DONE = object()


def put_until_stopped(q: queue.Queue, item, stop: threading.Event, poll_s: float = 0.1) -> bool:
    """Put ``item`` on the bounded queue ``q``, waiting while it is full; False (not put) once ``stop`` is set.

    The producer side of a reader/consumer thread pair: a consumer that stops early sets ``stop`` and the
    producer gives up within ``poll_s`` seconds instead of blocking forever on a full queue.
    """
    while not stop.is_set():
        try:
            q.put(item, timeout=poll_s)
            return True
        except queue.Full:
            continue
    return False


class BatchPrefetcher:
    """``read_batches(uri, ...)`` on a reader thread feeding a queue of at most ``depth`` batches.

    Use: ``p = BatchPrefetcher(uri, fmt, 4096, opts).start()``; iterate it once (``RecordBatch`` per
    item; an error of the reader, e.g. ``CorpusReadError`` naming the file, is re-raised in the
    consumer); ``p.stats`` is the ``ReadStats`` (complete once iteration ended); ``p.close()`` stops the
    reader (also when the consumer stops early). Iterating starts it if ``start()`` was not called.
    ``shard`` (a :class:`dagster_gpu.corpus.shards.Shard`): read only that shard of the file, with the whole
    file's record ids (``read_batches(shard=)``); None = the whole file.
    """

    def __init__(self, uri: str, text_format: TextFormat, read_batch_rows: int = 4096,
                 storage_options: Mapping[str, Any] | None = None, depth: int = 2, shard=None):
        if depth < 1 or read_batch_rows < 1:
            raise ValueError(f"depth and read_batch_rows must be >= 1, got {depth}, {read_batch_rows}")
        self.uri = uri
        self.text_format = text_format
        self.read_batch_rows = read_batch_rows
        self.storage_options = dict(storage_options or {})
        self.depth = depth
        self.shard = shard
        self.stats = ReadStats()
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumed = False

    def start(self) -> "BatchPrefetcher":
        """Start the reader thread (idempotent); returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._produce, name="dagster-gpu-reader", daemon=True)
            self._thread.start()
        return self

    def _put(self, item) -> bool:
        return put_until_stopped(self._q, item, self._stop)

    def _batches(self) -> Iterator[RecordBatch]:
        """What the reader thread reads (a subclass reads something else: :mod:`dagster_gpu.corpus.group_reads`)."""
        return read_batches(self.uri, self.text_format, self.read_batch_rows, self.stats, self.storage_options,
                            shard=self.shard)

    def _produce(self) -> None:
        try:
            for b in self._batches():
                if not self._put(b):
                    return
            self._put(_DONE)
        except BaseException as e:  # handed to the consumer, which re-raises it
            self._put(e)

    def __iter__(self) -> Iterator[RecordBatch]:
        if self._consumed:
            raise RuntimeError(f"BatchPrefetcher of {self.uri} can be iterated once")
        self._consumed = True
        self.start()
        while True:
            item = self._q.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        """Stop the reader thread and wait for it (at most 5 s; it is a daemon thread)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "BatchPrefetcher":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
