"""How many more step launches a run's backfill is about to make: the coalescer's reason to wait.

A backfill makes one run per partition, or one per range of partitions (``BackfillPolicy.multi_run``); the
daemon creates and starts them one after another, so their step launches trickle in. While more of them
can start right now, holding a launch a little longer lets it share a job array with the next ones. "Can
start right now" matters: runs held by the run queue's ``max_concurrent_runs`` cannot arrive until running
ones end, and waiting for them would only stall.

How many runs an asset backfill makes is read from what the daemon wrote, not from its partition count
(that is N, the runs N/K): before it submits an iteration's run requests, the daemon stores their run ids
on the backfill (``PartitionBackfill.reserved_run_ids``) and shrinks that list as it creates them
(``dagster._core.execution.asset_backfill._submit_runs_and_update_backfill_in_chunks``, every 25 runs).
"""

from __future__ import annotations

from dagster import DagsterRun, DagsterRunStatus, RunsFilter
from dagster._core.storage.tags import BACKFILL_ID_TAG

_STARTED_OR_DONE = [
    DagsterRunStatus.STARTED,
    DagsterRunStatus.SUCCESS,
    DagsterRunStatus.FAILURE,
    DagsterRunStatus.CANCELING,
    DagsterRunStatus.CANCELED,
]
_IN_FLIGHT = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]


def job_backfill_runs(backfill) -> int | None:
    """The runs a job's partition backfill makes (one per partition), or None when it names none."""
    return len(backfill.partition_names) if backfill.partition_names is not None else None


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


def asset_backfill_runs(instance, backfill) -> int:
    """The runs an asset backfill has made or is making now: those created (tagged with its id) plus the
    reserved run ids of the daemon's current submission not created yet. Runs of a later daemon iteration
    (partitions waiting for upstream assets) are not counted: they cannot start now anyway."""
    created = instance.get_runs_count(RunsFilter(tags={BACKFILL_ID_TAG: backfill.backfill_id}))
    reserved = list(getattr(backfill, "reserved_run_ids", None) or ())
    if not reserved:
        return created
    return created + len(reserved) - instance.get_runs_count(RunsFilter(run_ids=reserved))


def launches_to_come(instance, run: DagsterRun) -> int | None:
    """Runs of ``run``'s backfill that have not started yet and could start now: the backfill's runs
    (``asset_backfill_runs`` for an asset backfill, one per partition for a job's) minus those started or
    finished, capped by the run queue's free slots. None when ``run`` is not part of a backfill or its size
    is unknown. At most four run-storage queries and one backfill read."""
    backfill_id = run.tags.get(BACKFILL_ID_TAG)
    if not backfill_id:
        return None
    backfill = instance.get_backfill(backfill_id)
    if backfill is None:
        return None
    total = asset_backfill_runs(instance, backfill) if backfill.asset_backfill_data is not None else job_backfill_runs(backfill)
    if total is None:
        return None
    started = instance.get_runs_count(RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}, statuses=_STARTED_OR_DONE))
    remaining = max(0, total - started)
    slots = run_queue_slots(instance)
    return remaining if slots is None else min(remaining, slots)
