"""A unit's partitions embedded on a thread, ahead of the Dagster events that report them.

A unit reports each partition with a materialization and five check evaluations (:mod:`dagster_gpu.worker.unit`),
each a write to the instance's event log: ~100 ms per partition on this 2-core host with PostgreSQL, as much
as embedding a 20-record file. ``EmbedAhead`` runs the embedding loop (read the next file while this one
encodes, write the output atomically) on its own thread and hands finished partitions to the step's thread
through a bounded queue, so those writes overlap the next partition's encoding instead of stalling it.

At most ``depth`` finished partitions wait for their events. A unit killed meanwhile leaves their outputs
written but not materialized: the retry (or the next run) embeds them again and replaces the files
atomically, so a partition is never materialized twice and never lost.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from dagster_gpu.corpus.listing import CorpusFile
from dagster_gpu.corpus.prefetch import BatchPrefetcher, put_until_stopped
from dagster_gpu.corpus.readers import CorpusReadError
from dagster_gpu.embedding.pipeline import EmbeddingResult, Preempted
from dagster_gpu.telemetry.nvml import TelemetrySummary

_DONE = object()


@dataclass(frozen=True)
class PartitionDone:
    """One partition the embedding thread finished: ``result`` and ``telemetry`` when it succeeded, else
    ``error`` (naming the partition) and whether a retry could help (False for unreadable input).

    ``interval_s``: seconds from the end of the previous partition (or the unit's ``ready`` time) to the end
    of this one, on the embedding thread's clock; the intervals of a unit add up to its embedding span.
    """

    index: int
    key: str
    source: CorpusFile
    result: EmbeddingResult | None
    telemetry: TelemetrySummary | None
    interval_s: float
    error: str | None = None
    retryable: bool = False


EmbedOne = Callable[[str, CorpusFile, BatchPrefetcher], tuple[EmbeddingResult, TelemetrySummary]]


class EmbedAhead:
    """Embed ``items`` (key, file) in order on a thread; iterate the ``PartitionDone`` records as they end.

    ``embed_one(key, file, prefetcher)`` embeds one partition from its started prefetcher (it may raise:
    ``CorpusReadError`` fails the partition for good, any other ``Exception`` fails it retryably; the unit
    goes on; ``Preempted`` ends the thread and is raised on the iterating thread after the partitions finished
    before it). ``prefetch(file)`` starts a file's reader; the next file's reader is started before the
    current one encodes. Iterate once; ``close()`` (also on an early stop or an interrupt) stops the thread
    after the partition it is embedding and closes its readers.
    """

    def __init__(self, items: Sequence[tuple[str, CorpusFile]], embed_one: EmbedOne,
                 prefetch: Callable[[CorpusFile], BatchPrefetcher], ready: float, depth: int = 2):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._items = list(items)
        self._embed_one = embed_one
        self._prefetch = prefetch
        self._ready = ready
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dagster-gpu-embed", daemon=True)

    def start(self) -> "EmbedAhead":
        self._thread.start()
        return self

    def _put(self, item) -> bool:
        return put_until_stopped(self._q, item, self._stop)

    def _run(self) -> None:
        upcoming: BatchPrefetcher | None = None
        try:
            previous_end, n = self._ready, len(self._items)
            upcoming = self._prefetch(self._items[0][1]) if n else None
            for i, (key, source) in enumerate(self._items):
                if self._stop.is_set():
                    return
                current = upcoming
                upcoming = self._prefetch(self._items[i + 1][1]) if i + 1 < n else None
                result = telemetry = error = None
                retryable = False
                try:
                    result, telemetry = self._embed_one(key, source, current)
                except Preempted as e:  # asked to stop: no partition after this one; the step's thread decides
                    self._put(e)
                    return
                except CorpusReadError as e:
                    error = f"partition {key!r}: {e}"
                except Exception as e:  # noqa: BLE001 - one partition's fault must not lose the others
                    error, retryable = f"partition {key!r}: {type(e).__name__}: {e}", True
                finally:
                    current.close()
                now = time.time()
                done = PartitionDone(i, key, source, result, telemetry, max(0.0, now - previous_end), error, retryable)
                previous_end = now
                if not self._put(done):
                    return
            self._put(_DONE)
        except BaseException as e:  # handed to the step's thread, which re-raises it
            self._put(e)
        finally:
            if upcoming is not None:
                upcoming.close()

    def __iter__(self) -> Iterator[PartitionDone]:
        while True:
            try:
                item = self._q.get(timeout=1.0)
            except queue.Empty:
                if not self._thread.is_alive() and self._q.empty():
                    raise RuntimeError("the embedding thread ended without reporting its last partition") from None
                continue
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop after the partition being embedded; wait up to ``timeout_s`` seconds for the thread."""
        self._stop.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                self._q.get_nowait()
            except queue.Empty:
                break
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
