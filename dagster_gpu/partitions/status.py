"""Which partitions of an embedding asset are materialized, failed or in progress, as the UI's partitions view
shows them, for the sensor, the schedule, ``dagster-gpu backfill --missing/--failed/--stale`` and pruning.

The asset must use a :class:`dagster.DynamicPartitionsDefinition` (one partition per corpus file). A partition
is in progress when Dagster's asset status cache says so or when an unfinished run targets it (its
``dagster/partition`` or range tags, :func:`dagster_gpu.partitions.run_ranges.run_partition_keys`).
"""

from __future__ import annotations

from typing import Iterable

import dagster as dg
from dagster import partition_loading_context
from dagster._core.storage.partition_status_cache import get_and_update_asset_status_cache_value

from dagster_gpu.corpus.listing import CorpusFile
from dagster_gpu.partitions.run_ranges import PartitionRangeError, run_partition_keys


def dynamic_partitions_def(asset: dg.AssetsDefinition) -> dg.DynamicPartitionsDefinition:
    """The asset's partitions definition. Raises TypeError when it is not dynamic (one partition per file)."""
    pdef = asset.partitions_def
    if not isinstance(pdef, dg.DynamicPartitionsDefinition):
        raise TypeError(f"asset {asset.key.to_user_string()} must use a DynamicPartitionsDefinition, got {type(pdef).__name__}")
    return pdef


def partition_status(instance: dg.DagsterInstance, asset: dg.AssetsDefinition) -> Status:
    """(materialized, failed, in progress) partition keys of ``asset``, as the UI's partitions view shows them
    (Dagster's asset status cache: a failed ranged run's partitions that it did not materialize are failed),
    with every partition an unfinished run targets counted in progress (:func:`partitions_in_flight`)."""
    pdef = dynamic_partitions_def(asset)
    in_flight = partitions_in_flight(instance, asset)
    cache = get_and_update_asset_status_cache_value(instance, asset.key, pdef)
    if cache is None:
        return set(), set(), in_flight
    with partition_loading_context(dynamic_partitions_store=instance):
        return (
            set(cache.deserialize_materialized_partition_subsets(pdef).get_partition_keys()),
            set(cache.deserialize_failed_partition_subsets(pdef).get_partition_keys()),
            set(cache.deserialize_in_progress_partition_subsets(pdef).get_partition_keys()) | in_flight,
        )


def _run_asset_keys(instance: dg.DagsterInstance, run: dg.DagsterRun) -> frozenset[dg.AssetKey]:
    """The assets a run materializes: its asset selection, else (a whole asset job's run has none) the asset
    keys of its execution plan's step outputs."""
    if run.asset_selection:
        return frozenset(run.asset_selection)
    if not run.execution_plan_snapshot_id:
        return frozenset()
    plan = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
    return frozenset(o.properties.asset_key for step in plan.steps for o in step.outputs
                     if o.properties is not None and o.properties.asset_key is not None)


#: Run statuses before a run ends: created (a schedule's or sensor's request), queued, launched, running.
UNFINISHED_RUN_STATUSES = (
    dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING,
)


def partitions_in_flight(instance: dg.DagsterInstance, asset: dg.AssetsDefinition) -> set[str]:
    """Partition keys of ``asset`` that an unfinished run (:data:`UNFINISHED_RUN_STATUSES`) materializing it
    targets, read from the run's partition tags (:func:`dagster_gpu.partitions.run_ranges.run_partition_keys`).

    The status cache counts a partition in progress only from a per-partition planned event; a ranged run
    whose planned event holds a partition subset (``DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS``,
    dagster/_core/storage/event_log/base.py) is invisible to it, and a schedule that trusted it would request
    the run's partitions a second time while it runs."""
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=list(UNFINISHED_RUN_STATUSES)))
    name = dynamic_partitions_def(asset).name
    out: set[str] = set()
    for r in (r for r in runs if asset.key in _run_asset_keys(instance, r)):
        try:
            out.update(run_partition_keys(instance, r.tags, name))
        except PartitionRangeError:  # a range naming a deleted partition covers no current key
            continue
    return out


#: (materialized, failed, in progress) partition keys, as :func:`partition_status` returns them.
Status = tuple[set[str], set[str], set[str]]


def missing_or_failed(keys: Iterable[str], status: Status, *, missing: bool = True, failed: bool = True) -> list[str]:
    """``keys`` (in their order) that need a run: never materialized (``missing``) and/or failed as the UI's
    partitions view shows them (``failed``), none in progress (pure). What the missing-partitions schedule, a
    ``dagster-gpu backfill --missing --failed`` and :func:`partitions_to_rerun` select."""
    materialized, failed_keys, in_progress = status
    return [k for k in keys if k not in in_progress
            and ((missing and k not in materialized) or (failed and k in failed_keys))]


def bridgeable(files: Iterable[CorpusFile], status: Status) -> dict[str, int]:
    """Partition key -> its file's bytes, for the keys a run may cover though they are not due (pure):
    materialized, not failed, not in progress, and their file in the listing ``files``. What bridging may redo
    between two due ranges (:func:`dagster_gpu.policy.batching.bridge_ranges`)."""
    materialized, failed_keys, in_progress = status
    return {f.key: int(f.size_bytes) for f in files
            if f.key in materialized and f.key not in failed_keys and f.key not in in_progress}


def partitions_to_rerun(instance: dg.DagsterInstance, asset: dg.AssetsDefinition) -> list[str]:
    """Partition keys never materialized or failed (their latest run failed or was canceled without
    materializing them), and not in progress, in the definition's order (:func:`missing_or_failed`)."""
    keys = instance.get_dynamic_partitions(dynamic_partitions_def(asset).name)
    return missing_or_failed(keys, partition_status(instance, asset))


def attempts_since(instance: dg.DagsterInstance, asset: dg.AssetsDefinition, since: dict[str, float],
                   limit: int = 100) -> dict[str, int]:
    """Partition key -> how many runs planned to materialize it (``ASSET_MATERIALIZATION_PLANNED``, one per run
    per partition) after its latest materialization and after ``since[key]`` (epoch seconds: its file's
    modification time), at most ``limit``. One event-log query per key: pass the failed ones only. A run whose
    planned event holds a partition subset (``DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS``) is not counted."""
    latest = instance.get_latest_storage_id_by_partition(asset.key, dg.DagsterEventType.ASSET_MATERIALIZATION, set(since))
    out: dict[str, int] = {}
    for k, t in since.items():
        flt = dg.AssetRecordsFilter(asset_key=asset.key, asset_partitions=[k], after_storage_id=latest.get(k),
                                    after_timestamp=t)
        out[k] = len(instance.fetch_planned_materializations(flt, limit=limit).records)
    return out
