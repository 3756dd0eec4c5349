"""Sensor and schedule for corpus partitions.

- :func:`corpus_sensor`: lists the corpus each tick, adds a dynamic partition for every file whose key
  is not yet a partition, and requests runs over ranges of the new partitions (at most the asset's
  ``max_partitions_per_run`` each, as a backfill would; run key = ``<first>..<last>``, so a partition is
  never requested twice by the sensor). The cursor records how many files and the newest
  modification time seen (for the UI); the set of existing partitions is the authority, so files
  arriving out of modification-time order are never missed.
- :func:`backfill_missing_schedule`: requests runs for partitions never materialized, or failed (as the
  UI's partitions view shows them: a failed ranged run's partitions that it did not materialize), skipping
  partitions with a run in flight; consecutive keys share ranged runs, a key that is fine ends a range.
"""

from __future__ import annotations

import hashlib
import json

import dagster as dg
from dagster._core.definitions.partitions.context import partition_loading_context

from dagster_gpu.corpus.listing import CorpusSource
from dagster_gpu.ranges import contiguous_ranges, range_run_tags


def dynamic_partitions_def(asset: dg.AssetsDefinition) -> dg.DynamicPartitionsDefinition:
    """The asset's partitions definition. Raises TypeError when it is not dynamic (one partition per file)."""
    pdef = asset.partitions_def
    if not isinstance(pdef, dg.DynamicPartitionsDefinition):
        raise TypeError(f"asset {asset.key.to_user_string()} must use a DynamicPartitionsDefinition, got {type(pdef).__name__}")
    return pdef


def asset_job(asset: dg.AssetsDefinition) -> dg.UnresolvedAssetJobDefinition:
    """The job materializing ``asset`` (``<asset>_job``); a run covers one partition or a range."""
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
    """A sensor adding one partition per new corpus file of ``asset`` and requesting ranged runs over them."""
    pdef = dynamic_partitions_def(asset)
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
        # the run key names the files' versions: a file deleted (backfill --prune) and added again under the
        # same name gets a new run, not Dagster's skip of a run key it already ran
        version = hashlib.sha256(json.dumps(sorted((f.key, f.size_bytes, f.mtime) for f in new)).encode()).hexdigest()[:12]
        # the new keys are appended to the definition in this order, so they are consecutive
        return dg.SensorResult(
            run_requests=ranged_run_requests(
                asset, [*context.instance.get_dynamic_partitions(pdef.name), *keys], keys, run_key_prefix=f"{version}:"),
            dynamic_partitions_requests=[pdef.build_add_request(keys)],
            cursor=cursor,
        )

    return _sensor


def max_partitions_per_run(asset: dg.AssetsDefinition) -> int:
    """The asset's ``BackfillPolicy.multi_run`` limit (1 without a policy, unbounded for ``single_run``)."""
    policy = asset.backfill_policy
    if policy is None:
        return 1
    return policy.max_partitions_per_run or 2**31 - 1


def ranged_run_requests(
    asset: dg.AssetsDefinition, all_keys: list[str], selected: list[str] | set[str], run_key_prefix: str = ""
) -> list[dg.RunRequest]:
    """Run requests covering ``selected`` partitions in ranges of consecutive keys, each at most the asset's
    ``max_partitions_per_run`` long, as a backfill with the same policy would make them (run key =
    ``<prefix><first>..<last>``)."""
    out = []
    for keys in contiguous_ranges(all_keys, selected, max_partitions_per_run(asset)):
        tags = range_run_tags(keys)
        run_key = f"{run_key_prefix}{keys[0]}..{keys[-1]}"
        if len(keys) == 1:
            out.append(dg.RunRequest(partition_key=keys[0], run_key=run_key))
        else:
            out.append(dg.RunRequest(run_key=run_key, tags=tags))
    return out


def partition_status(instance: dg.DagsterInstance, asset: dg.AssetsDefinition) -> tuple[set[str], set[str], set[str]]:
    """(materialized, failed, in progress) partition keys of ``asset``, as the UI's partitions view shows them
    (Dagster's asset status cache: a failed ranged run's partitions that it did not materialize are failed)."""
    from dagster._core.storage.partition_status_cache import get_and_update_asset_status_cache_value

    pdef = dynamic_partitions_def(asset)
    cache = get_and_update_asset_status_cache_value(instance, asset.key, pdef)
    if cache is None:
        return set(), set(), set()
    with partition_loading_context(dynamic_partitions_store=instance):
        return (
            set(cache.deserialize_materialized_partition_subsets(pdef).get_partition_keys()),
            set(cache.deserialize_failed_partition_subsets(pdef).get_partition_keys()),
            set(cache.deserialize_in_progress_partition_subsets(pdef).get_partition_keys()),
        )


def partitions_to_rerun(instance: dg.DagsterInstance, asset: dg.AssetsDefinition) -> list[str]:
    """Partition keys never materialized or failed (their latest run failed or was canceled without
    materializing them), and not in progress, in the definition's order."""
    pdef = dynamic_partitions_def(asset)
    keys = list(instance.get_dynamic_partitions(pdef.name))
    materialized, failed, in_progress = partition_status(instance, asset)
    return [k for k in keys if k not in in_progress and (k not in materialized or k in failed)]


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
        keys = list(context.instance.get_dynamic_partitions(dynamic_partitions_def(asset).name))
        return ranged_run_requests(asset, keys, todo)

    return _schedule
