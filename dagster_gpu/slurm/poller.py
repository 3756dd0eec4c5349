"""The shared poller: one ``squeue`` and one ``sacct`` per poll interval for every job array in the spool.

Every process that asks for a task's state reads the last snapshot (``<spool>/poll.json``); when it is
older than ``interval_s`` (or predates a submission the caller cares about) the first process to take
``poll.lock`` refreshes it for *all* active job arrays in the spool, so the controller sees the same two
queries per interval however many runs (processes) are in flight. A failed query (controller or
slurmdbd unreachable after the client's retries) is recorded as an error snapshot: callers then report
WorkerStatus.UNKNOWN, which never changes a step's state.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from dagster_gpu.contracts import WorkerStatus
from dagster_gpu.slurm import parse as P
from dagster_gpu.slurm.client import SlurmClient, SlurmError
from dagster_gpu.slurm.spool import Spool, read_json, write_json

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Poll:
    """One poll: when it started (epoch s), the array job ids it covered, and parsed rows (or the error)."""

    started_at: float
    ids: frozenset[int]
    queue: tuple[P.QueueRow, ...]
    acct: tuple[P.AcctRow, ...]
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class SharedPoller:
    """See module doc.

    Args:
        spool: the shared spool (its active batches are what gets polled).
        client: the Slurm client (a short retry budget keeps health checks responsive).
        interval_s: minimum seconds between two polls of the controller (across all processes).
    """

    def __init__(self, spool: Spool, client: SlurmClient, interval_s: float = 2.0):
        self.spool = spool
        self.client = client
        self.interval_s = interval_s
        self._cache: Poll | None = None
        self._cache_mtime: float = -1.0
        self.polls = 0  # polls this process made (benchmarks/tests)

    def _read(self) -> Poll | None:
        path = self.spool.poll_file
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return None
        if self._cache is not None and mtime == self._cache_mtime:
            return self._cache
        d = read_json(path)
        if d is None:
            return None
        try:
            snap = Poll(
                started_at=float(d["started_at"]),
                ids=frozenset(int(i) for i in d["ids"]),
                queue=tuple(P.parse_squeue(d.get("squeue", ""))),
                acct=tuple(P.parse_sacct(d.get("sacct", ""))),
                error=d.get("error"),
            )
        except (KeyError, ValueError) as e:
            log.warning("ignoring unreadable poll snapshot %s: %s", path, e)
            return None
        self._cache, self._cache_mtime = snap, mtime
        return snap

    def _fresh(self, snap: Poll | None, need: set[int], not_before: float) -> bool:
        return (
            snap is not None
            and time.time() - snap.started_at < self.interval_s
            and need <= snap.ids
            and snap.started_at >= not_before
        )

    def poll(self, need: set[int], not_before: float = 0.0) -> Poll:
        """A snapshot covering array jobs ``need`` taken after ``not_before`` (epoch s), refreshing it
        (for every active job array in the spool) when the last one is too old."""
        snap = self._read()
        if self._fresh(snap, need, not_before):
            return snap  # type: ignore[return-value]
        with self.spool.lock("poll.lock", timeout_s=120):
            snap = self._read()
            if self._fresh(snap, need, not_before):
                return snap  # type: ignore[return-value]
            if snap is not None and time.time() - snap.started_at < min(0.5, self.interval_s) and need <= snap.ids:
                return snap  # polled a moment ago: do not hammer the controller for one late submission
            return self._poll(need)

    def _poll(self, need: set[int]) -> Poll:
        ids = set(need) | {int(sub["array_job_id"]) for _, sub in self.spool.active_batches()}
        started = time.time()
        doc: dict = {"started_at": started, "ids": sorted(ids)}
        try:
            if ids:
                # raw text is stored so every reader parses exactly what Slurm printed
                q = self.client.run(
                    ["squeue", "--noheader", "--array", "--states=all", f"--jobs={','.join(map(str, sorted(ids)))}", "-o", P.SQUEUE_FORMAT],
                    attempts=2,
                )
                doc["squeue"] = q.stdout
                a = self.client.run(
                    ["sacct", "--parsable2", "--noheader", "--allocations", "--duplicates", "--allusers",
                     f"--jobs={','.join(map(str, sorted(ids)))}", "--format", P.SACCT_FORMAT],
                    attempts=2,
                )  # fmt: skip
                doc["sacct"] = a.stdout
        except SlurmError as e:
            if "invalid job id specified" in (e.stderr or "").lower() and "squeue" not in doc:
                doc["squeue"] = ""  # every id purged from squeue: sacct still knows them
                try:
                    doc["sacct"] = self.client.run(
                        ["sacct", "--parsable2", "--noheader", "--allocations", "--duplicates", "--allusers",
                         f"--jobs={','.join(map(str, sorted(ids)))}", "--format", P.SACCT_FORMAT], attempts=2,
                    ).stdout  # fmt: skip
                except SlurmError as e2:
                    doc["error"] = str(e2)
            else:
                doc["error"] = str(e)
        if doc.get("error"):
            log.warning("slurm poll failed (states stay unknown until the next poll): %s", doc["error"])
        self.polls += 1
        write_json(self.spool.poll_file, doc, mode=self.spool.public_mode)
        snap = self._read()
        assert snap is not None
        if snap.ok:
            self._mark_done(snap)
        return snap

    def _mark_done(self, snap: Poll) -> None:
        """Mark job arrays whose every task is final in sacct and gone from the queue (no more polling)."""
        for batch, sub in self.spool.active_batches():
            aid, n = int(sub["array_job_id"]), int(sub["tasks"])
            if aid not in snap.ids:
                continue
            final = {
                r.id.task_id for r in snap.acct if r.id.job_id == aid and r.id.task_id is not None and r.state.final
            }
            live = any(
                r.array_job_id == aid and r.state.status not in (WorkerStatus.SUCCEEDED, WorkerStatus.FAILED)
                for r in snap.queue
            )
            # the last record of a task decides: a requeued task has an old final-looking record only if
            # its latest is final too, which the "live" check covers while squeue still lists it
            if len(final) >= n and not live:
                write_json(self.spool.batch_dir(batch) / "done", {"at": time.time()})
