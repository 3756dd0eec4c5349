"""Sensor and schedule for corpus partitions.

- :func:`corpus_sensor`: lists the corpus each tick, adds a dynamic partition for every file whose key
  is not yet a partition, and requests one run per new partition (run key = partition key, so a
  partition is never requested twice by the sensor). The cursor records how many files and the newest
  modification time seen (for the UI); the set of existing partitions is the authority, so files
  arriving out of modification-time order are never missed.
- :func:`backfill_missing_schedule`: requests runs for partitions never materialized, or whose latest
  run failed or was canceled, skipping partitions with a run in flight; the run key names the run it
  replaces, so each failure is retried once per tick-cycle, not on every tick.
"""

from __future__ import annotations

import json

import dagster as dg
from dagster._core.storage.dagster_run import IN_PROGRESS_RUN_STATUSES, RunsFilter

from dagster_gpu.corpus.listing import CorpusSource

PARTITION_TAG = "dagster/partition"


def _partitions_def(asset: dg.AssetsDefinition) -> dg.DynamicPartitionsDefinition:
    pdef = asset.partitions_def
    if not isinstance(pdef, dg.DynamicPartitionsDefinition):
        raise TypeError(f"asset {asset.key.to_user_string()} must use a DynamicPartitionsDefinition, got {type(pdef).__name__}")
    return pdef


def asset_job(asset: dg.AssetsDefinition) -> dg.UnresolvedAssetJobDefinition:
    """The job materializing ``asset`` one partition per run (``<asset>_job``)."""
    return dg.define_asset_job(f"{asset.key.to_python_identifier()}_job", selection=[asset])


def corpus_sensor(
    asset: dg.AssetsDefinition,
    corpus: CorpusSource,
    *,
    job: dg.UnresolvedAssetJobDefinition | None = None,
    name: str | None = None,
    minimum_interval_seconds: int = 30,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.SensorDefinition:
    """A sensor adding one partition and one run request per new corpus file of ``asset``."""
    pdef = _partitions_def(asset)
    job = job or asset_job(asset)

    @dg.sensor(
        name=name or f"{asset.key.to_python_identifier()}_corpus_sensor",
        job=job,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=f"New files under {corpus.url} become partitions of {asset.key.to_user_string()} and are materialized.",
    )
    def _sensor(context: dg.SensorEvaluationContext):
        files = corpus.list_files()
        existing = set(context.instance.get_dynamic_partitions(pdef.name))
        new = [f for f in files if f.key not in existing]
        cursor = json.dumps({"files": len(files), "newest_mtime": max((f.mtime for f in files), default=0.0)})
        if not new:
            return dg.SensorResult(skip_reason=dg.SkipReason(f"no new files under {corpus.url}"), cursor=cursor)
        keys = [f.key for f in new]
        return dg.SensorResult(
            run_requests=[dg.RunRequest(partition_key=k, run_key=k) for k in keys],
            dynamic_partitions_requests=[pdef.build_add_request(keys)],
            cursor=cursor,
        )

    return _sensor


def _latest_runs(instance: dg.DagsterInstance, asset: dg.AssetsDefinition, keys: list[str]) -> dict[str, dg.DagsterRun]:
    """The newest run of each partition key that targets ``asset`` (one runs query)."""
    latest: dict[str, dg.DagsterRun] = {}
    if not keys:
        return latest
    for rec in instance.get_run_records(RunsFilter(tags={PARTITION_TAG: keys}), order_by="id", ascending=False):
        run = rec.dagster_run
        pk = run.tags.get(PARTITION_TAG)
        if pk is not None and pk not in latest and asset.key in (run.asset_selection or {asset.key}):
            latest[pk] = run
    return latest


def partitions_to_rerun(instance: dg.DagsterInstance, asset: dg.AssetsDefinition) -> dict[str, str | None]:
    """Partition key -> id of its latest run (None if never run), for every partition never
    materialized or whose latest run failed/was canceled, and with no run in flight."""
    pdef = _partitions_def(asset)
    keys = list(instance.get_dynamic_partitions(pdef.name))
    materialized = instance.get_materialized_partitions(asset.key)
    latest = _latest_runs(instance, asset, keys)
    out: dict[str, str | None] = {}
    for k in keys:
        run = latest.get(k)
        if run is not None and run.status in IN_PROGRESS_RUN_STATUSES:
            continue
        if k not in materialized or (run is not None and run.status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)):
            out[k] = run.run_id if run else None
    return out


def backfill_missing_schedule(
    asset: dg.AssetsDefinition,
    *,
    job: dg.UnresolvedAssetJobDefinition | None = None,
    cron_schedule: str = "0 * * * *",
    name: str | None = None,
    default_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED,
) -> dg.ScheduleDefinition:
    """A schedule (dynamic partitions cannot use build_schedule_from_partitioned_job) that re-requests
    missing and failed partitions of ``asset``."""
    job = job or asset_job(asset)

    @dg.schedule(
        name=name or f"{asset.key.to_python_identifier()}_missing_schedule",
        job=job,
        cron_schedule=cron_schedule,
        default_status=default_status,
    )
    def _schedule(context: dg.ScheduleEvaluationContext):
        todo = partitions_to_rerun(context.instance, asset)
        if not todo:
            return dg.SkipReason("every partition is materialized or in flight")
        # the run key names the failed run being replaced, so a partition is requested once per failure
        return [dg.RunRequest(partition_key=k, run_key=f"{k}:after:{run_id or 'none'}") for k, run_id in todo.items()]

    return _schedule
