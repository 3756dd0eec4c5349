"""The work unit's own lines in the worker's log (its stderr: the local backend's ``local/log_file``, the Slurm
array task's output file, the pod's log): a line when a partition starts, a line when it ends, and a heartbeat
every ``every_s`` seconds while one runs, so one long file is visible in a unit of many partitions.

These are not the run's event log (each line there is a storage write; the unit writes one per tenth of its
partitions there). A heartbeat names the records encoded so far, counted per I/O batch
(``embed_partition``'s ``on_batch``: every ``read_batch_rows`` records), and of how many when the partition is a
shard that knows its record count.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

#: Seconds between two heartbeats of one running partition.
HEARTBEAT_S = 30.0

LOGGER_NAME = "dagster_gpu.unit"
HANDLER_NAME = "dagster_gpu.unit.stderr"


def unit_logger() -> logging.Logger:
    """The logger of these lines: INFO and above on stderr (one handler, added once), not propagated (the
    worker's root logger is Dagster's)."""
    log = logging.getLogger(LOGGER_NAME)
    if not any(h.get_name() == HANDLER_NAME for h in log.handlers):  # others may be there (a test's log capture)
        handler = logging.StreamHandler(sys.stderr)
        handler.set_name(HANDLER_NAME)
        handler.setFormatter(logging.Formatter("%(asctime)s dagster-gpu unit: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


class PartitionWatch:
    """Around one partition's embedding (a context manager): logs its start, a heartbeat every ``every_s``
    seconds from a daemon thread, and its end (with the records encoded and the seconds taken) or failure.

    Args:
        key: the partition key. index, n: its place in the unit (0-based) and the unit's partition count.
        source: the partition's ``CorpusFile`` (its ``uri``, ``size_bytes``, and a shard's ``shard.records``),
            or None.
        every_s: seconds between heartbeats. logger: where the lines go (default :func:`unit_logger`).
    """

    def __init__(self, key: str, index: int, n: int, source: Any = None, every_s: float = HEARTBEAT_S,
                 logger: logging.Logger | None = None):
        self.key, self.index, self.n, self.every_s = key, index, n, every_s
        self.log = logger or unit_logger()
        self.uri = getattr(source, "uri", None)
        self.size = getattr(source, "size_bytes", None)
        shard = getattr(source, "shard", None)
        self.total = getattr(shard, "records", None) if shard is not None else None
        self.records = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    @property
    def name(self) -> str:
        return f"partition {self.key!r} ({self.index + 1}/{self.n})"

    def on_batch(self, records_done: int) -> None:
        """``embed_partition``'s ``on_batch``: records encoded so far."""
        self.records = int(records_done)

    def _done_so_far(self) -> str:
        return f"{self.records} records" + (f" of {self.total}" if self.total else "")

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            self.log.info("%s still embedding: %s encoded, %.0f s elapsed", self.name, self._done_so_far(),
                          time.monotonic() - self._t0)

    def __enter__(self) -> "PartitionWatch":
        self._t0 = time.monotonic()
        where = f": {self.uri}" + (f" ({self.size} bytes)" if self.size is not None else "") if self.uri else ""
        self.log.info("%s started%s", self.name, where)
        self._thread = threading.Thread(target=self._beat, name=f"dagster-gpu-heartbeat-{self.index}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        took = time.monotonic() - self._t0
        if exc is None:
            self.log.info("%s finished in %.1f s: %s encoded", self.name, took, self._done_so_far())
        else:
            self.log.info("%s failed after %.1f s: %s: %s", self.name, took, type(exc).__name__, exc)
