"""The shared poller: one ``squeue`` and one ``sacct`` per poll interval for every job array in the spool.

Every process that asks for a task's state reads the last snapshot (``<spool>/poll.json``); when it is
older than ``interval_s`` (or predates a submission the caller cares about) the first process to take
``poll.lock`` refreshes it for *all* active job arrays in the spool, so the controller sees the same two
queries per interval however many runs (processes) are in flight. A failed query (controller or
slurmdbd unreachable after the client's retries), or output that does not parse, is recorded as an
error snapshot: callers then report WorkerStatus.UNKNOWN, which never changes a step's state.

Job arrays submitted to a named cluster (``submitted.json`` ``cluster``, from ``sbatch --parsable``'s
``123;gpu2``) are polled with ``-M <cluster>``: one squeue and one sacct per cluster. Array job ids are
assumed unique across those clusters (true in a federation).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime

from dagster_gpu.contracts import WorkerStatus
from dagster_gpu.slurm import parse as P
from dagster_gpu.slurm import rest_parse as RP
from dagster_gpu.slurm.client import SlurmClient, SlurmError
from dagster_gpu.slurm.spool import Spool, read_json, write_json
from dagster_gpu.slurm.status import acct_since, sacct_caught_up

log = logging.getLogger(__name__)


def parse_poll_queue(fmt: str, text: str) -> list[P.QueueRow]:
    """The queue rows of a stored poll: ``cli`` squeue text, or ``rest``: one slurmrestd ``job/<id>`` response
    (JSON) per line. Raises SlurmParseError."""
    if fmt == "rest":
        return [r for line in text.splitlines() if line.strip() for r in RP.queue_rows(_json_line(line))]
    return P.parse_squeue(text)


def parse_poll_acct(fmt: str, text: str) -> list[P.AcctRow]:
    """The accounting rows of a stored poll: ``cli`` sacct text, or ``rest``: one slurmrestd ``slurmdb/jobs``
    response (JSON) per line. Raises SlurmParseError."""
    if fmt == "rest":
        return [r for line in text.splitlines() if line.strip() for r in RP.acct_rows(_json_line(line))]
    return P.parse_sacct(text)


def _json_line(line: str) -> dict:
    try:
        d = json.loads(line)
    except ValueError as e:
        raise P.SlurmParseError(f"not a slurmrestd JSON document: {line[:200]!r}") from e
    if not isinstance(d, dict):
        raise P.SlurmParseError(f"not a slurmrestd JSON object: {line[:200]!r}")
    return d


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
                queue=tuple(parse_poll_queue(d.get("format", "cli"), d.get("squeue", ""))),
                acct=tuple(parse_poll_acct(d.get("format", "cli"), d.get("sacct", ""))),
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

    def poll(self, need: set[int], not_before: float = 0.0, clusters: dict[int, str | None] | None = None) -> Poll:
        """A snapshot covering array jobs ``need`` taken after ``not_before`` (epoch s), refreshing it
        (for every active job array in the spool) when the last one is too old. ``clusters`` names the
        cluster of needed array jobs the spool may no longer list (from their handles)."""
        snap = self._read()
        if self._fresh(snap, need, not_before):
            return snap  # type: ignore[return-value]
        with self.spool.lock("poll.lock", timeout_s=120):
            snap = self._read()
            if self._fresh(snap, need, not_before):
                return snap  # type: ignore[return-value]
            if snap is not None and time.time() - snap.started_at < min(0.5, self.interval_s) and need <= snap.ids:
                return snap  # polled a moment ago: do not hammer the controller for one late submission
            return self._poll(need, clusters)

    def _query(self, ids: list[int], cluster: str | None) -> tuple[str, str]:
        """(queue text, accounting text) for array jobs ``ids`` on one cluster (the client's
        :meth:`~dagster_gpu.slurm.client.SlurmClient.poll_query`). Raises SlurmError."""
        return self.client.poll_query(ids, cluster)

    def _poll(self, need: set[int], clusters: dict[int, str | None] | None = None) -> Poll:
        cluster_of = {int(sub["array_job_id"]): sub.get("cluster") for _, sub in self.spool.active_batches()}
        for aid, c in (clusters or {}).items():
            cluster_of.setdefault(int(aid), c)
        ids = set(need) | set(cluster_of)
        groups: dict[str | None, list[int]] = {}
        for aid in sorted(ids):
            groups.setdefault(cluster_of.get(aid), []).append(aid)
        started = time.time()
        fmt = self.client.poll_format
        doc: dict = {"started_at": started, "ids": sorted(ids), "format": fmt}
        try:
            # raw text is stored so every reader parses exactly what Slurm printed
            parts = [self._query(gids, cluster) for cluster, gids in sorted(groups.items(), key=lambda kv: kv[0] or "")]
            doc["squeue"] = "".join(q if q.endswith("\n") or not q else q + "\n" for q, _ in parts)
            doc["sacct"] = "".join(a if a.endswith("\n") or not a else a + "\n" for _, a in parts)
            parse_poll_queue(fmt, doc["squeue"])
            parse_poll_acct(fmt, doc["sacct"])
        except SlurmError as e:
            doc = {"started_at": started, "ids": sorted(ids), "error": str(e)}
        except P.SlurmParseError as e:
            doc = {"started_at": started, "ids": sorted(ids), "error": f"unparseable Slurm output: {e}"}
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
            latest: dict[int, P.AcctRow] = {}
            for r in acct_since(snap.acct, sub.get("submitted_at")):
                if r.id.job_id == aid and r.id.task_id is not None:
                    prev = latest.get(r.id.task_id)
                    if prev is None or (r.submit or datetime.min) >= (prev.submit or datetime.min):
                        latest[r.id.task_id] = r  # sacct's order breaks ties, as in records_for
            final = {t for t, r in latest.items() if r.state.final}
            rows = [r for r in snap.queue if r.array_job_id == aid]
            live = any(r.state.status not in (WorkerStatus.SUCCEEDED, WorkerStatus.FAILED) for r in rows)
            # a task squeue shows ended in an attempt sacct has not recorded yet (a requeued task's rerun
            # while slurmdbd lags) is not done: its bill would miss that attempt
            lagging = any(
                r.array_task_id is not None and not sacct_caught_up(r, [latest[r.array_task_id]] if r.array_task_id in latest else [])
                for r in rows
            )  # fmt: skip
            if len(final) >= n and not live and not lagging:
                write_json(self.spool.batch_dir(batch) / "done", {"at": time.time()})
