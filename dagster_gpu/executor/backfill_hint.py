"""How many more step launches a run's backfill is about to make: the coalescer's reason to wait.

A backfill makes one run per partition; the daemon creates and starts them a few at a time, so their
step launches trickle in. While more of them can start right now, holding a launch a little longer lets
it share a job array with the next ones. "Can start right now" matters: runs held by the run queue's
``max_concurrent_runs`` cannot arrive until running ones end, and waiting for them would only stall.
"""

from __future__ import annotations

from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus, RunsFilter
from dagster._core.storage.tags import BACKFILL_ID_TAG

_STARTED_OR_DONE = [
    DagsterRunStatus.STARTED,
    DagsterRunStatus.SUCCESS,
    DagsterRunStatus.FAILURE,
    DagsterRunStatus.CANCELING,
    DagsterRunStatus.CANCELED,
]
_IN_FLIGHT = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]


def backfill_runs(backfill) -> int | None:
    """The number of runs a backfill makes (one per targeted partition), or None when it cannot say
    (an asset backfill whose assets target different numbers of partitions)."""
    if backfill.asset_backfill_data is not None:
        return backfill.asset_backfill_data.get_num_partitions()
    if backfill.partition_names is not None:
        return len(backfill.partition_names)
    return None


def run_queue_slots(instance) -> int | None:
    """Free slots in the run queue (``max_concurrent_runs`` minus runs STARTING or STARTED), or None when
    the instance's run coordinator sets no limit."""
    coordinator = instance.run_coordinator
    if not hasattr(coordinator, "get_run_queue_config"):
        return None
    limit = coordinator.get_run_queue_config().max_concurrent_runs
    if limit is None or limit < 0:
        return None
    return max(0, limit - instance.get_runs_count(RunsFilter(statuses=_IN_FLIGHT)))


def launches_to_come(instance, run: DagsterRun) -> int | None:
    """Runs of ``run``'s backfill that have not started yet and could start now: the backfill's runs
    minus those started or finished, capped by the run queue's free slots. None when ``run`` is not part
    of a backfill or its size is unknown. Two run-storage queries and one backfill read."""
    backfill_id = run.tags.get(BACKFILL_ID_TAG)
    if not backfill_id:
        return None
    backfill = instance.get_backfill(backfill_id)
    if backfill is None:
        return None
    total = backfill_runs(backfill)
    if total is None:
        return None
    started = instance.get_runs_count(RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}, statuses=_STARTED_OR_DONE))
    remaining = max(0, total - started)
    slots = run_queue_slots(instance)
    return remaining if slots is None else min(remaining, slots)
