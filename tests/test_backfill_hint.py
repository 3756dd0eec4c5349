"""launches_to_come: a backfill's runs not yet started, capped by the run queue's free slots, on a real
(SQLite) instance with the QueuedRunCoordinator."""

from __future__ import annotations

import dagster as dg
from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus
from dagster._core.storage.tags import BACKFILL_ID_TAG

from dagster_gpu.commands.backfill import submit_asset_backfill
from dagster_gpu.executor.backfill_hint import launches_to_come, run_queue_slots

parts = dg.StaticPartitionsDefinition([f"p{i}" for i in range(10)])


@dg.asset(partitions_def=parts)
def a(): ...


defs = dg.Definitions(assets=[a])


def _instance(tmp_path, max_runs: int):
    (tmp_path / "dagster.yaml").write_text(
        "run_coordinator:\n  module: dagster._core.run_coordinator\n  class: QueuedRunCoordinator\n"
        f"  config: {{max_concurrent_runs: {max_runs}}}\ntelemetry: {{enabled: false}}\n"
    )
    return dg.DagsterInstance.from_config(str(tmp_path))


def _run(instance, status, backfill_id=None, run_id=None) -> DagsterRun:
    kw = {"run_id": run_id} if run_id else {}
    run = DagsterRun(job_name="__ASSET_JOB", status=status, tags={BACKFILL_ID_TAG: backfill_id} if backfill_id else {}, **kw)
    return instance.add_run(run)


def _daemon_reserves(instance, backfill_id: str, run_ids: list[str]) -> None:
    """What the backfill daemon writes before it submits an iteration's run requests (then shrinks)."""
    backfill = instance.get_backfill(backfill_id)
    requests = [dg.RunRequest(partition_key=f"p{i}") for i in range(len(run_ids))]
    instance.update_backfill(backfill.with_submitting_run_requests(requests, run_ids))


def test_ranged_backfill_counts_its_runs_not_its_partitions(tmp_path):
    # 8 partitions in ranges of 3 -> 3 runs, not 8: the daemon reserved their ids
    with _instance(tmp_path, max_runs=6) as inst:
        bid = submit_asset_backfill(inst, defs, a.key, [f"p{i}" for i in range(8)])
        _daemon_reserves(inst, bid, ["r1", "r2", "r3"])
        me = _run(inst, DagsterRunStatus.STARTED, bid, "r1")
        assert launches_to_come(inst, me) == 2  # r2, r3 not created yet
        _run(inst, DagsterRunStatus.NOT_STARTED, bid, "r2")
        _run(inst, DagsterRunStatus.STARTING, bid, "r3")
        _daemon_reserves(inst, bid, [])  # all submitted: the daemon empties the list
        assert launches_to_come(inst, me) == 2  # created, not started yet
        _run(inst, DagsterRunStatus.STARTED)  # another job's run: 6 - 3 in flight = 3 free slots, still 2
        assert launches_to_come(inst, me) == 2


def test_counts_the_backfills_runs_still_to_start_capped_by_free_run_slots(tmp_path):
    with _instance(tmp_path, max_runs=6) as inst:
        bid = submit_asset_backfill(inst, defs, a.key, [f"p{i}" for i in range(8)])
        ids = [f"r{i}" for i in range(8)]  # one run per partition
        _daemon_reserves(inst, bid, ids)
        me = _run(inst, DagsterRunStatus.STARTED, bid, ids[0])
        for rid, st in zip(ids[1:], (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING)):
            _run(inst, st, bid, rid)
        # 8 runs; started or done: me, SUCCESS, FAILURE -> 5 to come; run queue: 6 - (STARTED + STARTING) = 4 free
        assert run_queue_slots(inst) == 4
        assert launches_to_come(inst, me) == 4
        _run(inst, DagsterRunStatus.STARTED)  # another job's run takes a slot
        _run(inst, DagsterRunStatus.STARTED)
        assert launches_to_come(inst, me) == 2
        assert launches_to_come(inst, _run(inst, DagsterRunStatus.STARTED)) is None  # not in a backfill


def test_unlimited_queue_counts_only_the_backfill(tmp_path):
    with _instance(tmp_path, max_runs=-1) as inst:
        bid = submit_asset_backfill(inst, defs, a.key, ["p0", "p1", "p2"])
        _daemon_reserves(inst, bid, ["r0", "r1", "r2"])
        me = _run(inst, DagsterRunStatus.STARTED, bid, "r0")
        assert run_queue_slots(inst) is None and launches_to_come(inst, me) == 2
        for rid in ("r1", "r2"):
            _run(inst, DagsterRunStatus.SUCCESS, bid, rid)
        _daemon_reserves(inst, bid, [])
        assert launches_to_come(inst, me) == 0
