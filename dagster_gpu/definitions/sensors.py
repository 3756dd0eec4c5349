"""Sensor and schedule for corpus partitions.

- :func:`corpus_sensor`: lists the corpus each tick, adds a dynamic partition for every file whose key
  is not yet a partition, and requests runs over ranges of the new partitions and of the changed ones (a
  file whose source version differs from the one its partition's latest materialization read; none with a
  run in progress), at most the asset's ``max_partitions_per_run`` each, as a backfill would; run key =
  ``<hash of the range's keys and versions>:<first>..<last>``, so a version of a file is never requested
  twice by the sensor. A file rewritten while its run reads it is found changed at the next tick after
  that run (the run recorded the version from before its read). With the asset depending on its corpus
  source asset (:func:`dagster_gpu.instance.source_versions.corpus_source`), the tick also records one observation
  per partition whose file version changed (its data version). With ``prune=True`` it deletes the partitions
  of files gone, their outputs and their index rows (:func:`dagster_gpu.definitions.partitions.prune_partitions`). The
  cursor records how many files and the newest modification time seen (for the UI); the set of existing
  partitions is the authority, so files arriving out of modification-time order are never missed.
- :func:`backfill_missing_schedule`: requests runs for partitions never materialized, or failed (as the
  UI's partitions view shows them: a failed ranged run's partitions that it did not materialize), and with
  ``stale=True`` the stale ones (:mod:`dagster_gpu.instance.stale`), skipping partitions with a run in flight;
  consecutive keys share ranged runs, a key that is fine ends a range.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Mapping, Sequence

import dagster as dg

from dagster_gpu.corpus.listing import CorpusFile, CorpusSource
from dagster_gpu.instance.partition_status import dynamic_partitions_def, partition_status, partitions_to_rerun
from dagster_gpu.definitions.partitions import corpus_of, indexes_following, partition_staleness, prune_partitions
from dagster_gpu.instance.run_ranges import contiguous_ranges, range_run_tags
from dagster_gpu.instance.source_versions import (
    corpus_asset_key, depends_on_corpus, observations, observed_versions, recorded_versions,
)


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
    changed: bool = True,
    prune: bool = False,
    output_storage_options: Mapping[str, Any] | None = None,
) -> dg.SensorDefinition:
    """A sensor adding one partition per new corpus file of ``asset`` and requesting ranged runs over the
    new partitions and (``changed``) the partitions whose file changed since it was embedded.

    ``prune``: each tick also deletes the partitions whose file is gone (none with a run in progress), their
    output parquet files (fsspec with ``output_storage_options``) and their rows in the vector indexes that
    follow ``asset`` in the code location, and logs each (partition, output, index rows).
    """
    pdef = dynamic_partitions_def(asset)
    job = job or asset_job(asset)

    @dg.sensor(
        name=name or f"{asset.key.to_python_identifier()}_corpus_sensor",
        job=job,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=f"New and changed files under {corpus.url} become partitions of {asset.key.to_user_string()} and are materialized.",
    )
    def _sensor(context: dg.SensorEvaluationContext):
        files = corpus.list_files()
        if prune:
            _prune(context, asset, corpus, files, output_storage_options)
        registered = list(context.instance.get_dynamic_partitions(pdef.name))
        existing = set(registered)
        new = [f for f in files if f.key not in existing]
        stale: list = []
        if changed and len(new) < len(files):
            recorded = recorded_versions(context.instance, asset.key)
            candidates = [f for f in files if f.key in existing and f.version
                          and (r := recorded.get(f.key)) is not None and r.source_version not in (None, f.version)]
            if candidates:
                in_progress = partition_status(context.instance, asset)[2]
                stale = [f for f in candidates if f.key not in in_progress]
        events = []
        if depends_on_corpus(asset):
            events = observations(corpus_asset_key(asset.key), files, observed_versions(context.instance, corpus_asset_key(asset.key)))
        cursor = json.dumps({"files": len(files), "newest_mtime": max((f.mtime for f in files), default=0.0)})
        if not new and not stale:
            return dg.SensorResult(skip_reason=dg.SkipReason(f"no new or changed files under {corpus.url}"),
                                   cursor=cursor, asset_events=events)
        keys = [f.key for f in new]
        if stale:
            context.log.info(f"{len(stale)} changed file(s) under {corpus.url}: " + ", ".join(f.key for f in stale[:10])
                             + (" …" if len(stale) > 10 else ""))
        # the new keys are appended to the definition in this order, so they are consecutive
        return dg.SensorResult(
            run_requests=versioned_run_requests(asset, [*registered, *keys], [*stale, *new]),
            dynamic_partitions_requests=[pdef.build_add_request(keys)] if keys else [],
            cursor=cursor,
            asset_events=events,
        )

    return _sensor


def _prune(context: dg.SensorEvaluationContext, asset: dg.AssetsDefinition, corpus: CorpusSource,
           files: Sequence[CorpusFile], output_storage_options: Mapping[str, Any] | None) -> None:
    repo = getattr(context, "repository_def", None)
    assets = list(repo.assets_defs_by_key.values()) if repo is not None else []
    for p in prune_partitions(context.instance, asset, corpus, delete_outputs=True,
                              indexes=indexes_following(assets, asset.key),
                              output_storage_options=output_storage_options, files=files):
        (context.log.warning if p.error else context.log.info)(f"{asset.key.to_user_string()} {p.describe()}")


def versioned_run_requests(asset: dg.AssetsDefinition, all_keys: list[str], files: Sequence[CorpusFile]) -> list[dg.RunRequest]:
    """:func:`ranged_run_requests` over ``files``' keys, each run key prefixed with a hash of its range's
    (key, source version) pairs: a file deleted (``backfill --prune``) and added again under the same name, or
    rewritten, gets a new run, not Dagster's skip of a run key it already ran; the same versions never get two."""
    version = {f.key: (f.version or f"{f.size_bytes}:{f.mtime!r}") for f in files}

    def prefix(keys: Sequence[str]) -> str:
        return hashlib.sha256(json.dumps([(k, version[k]) for k in keys]).encode()).hexdigest()[:12] + ":"

    return ranged_run_requests(asset, all_keys, list(version), run_key_prefix=prefix)


def max_partitions_per_run(asset: dg.AssetsDefinition) -> int:
    """The asset's ``BackfillPolicy.multi_run`` limit (1 without a policy, unbounded for ``single_run``)."""
    policy = asset.backfill_policy
    if policy is None:
        return 1
    return policy.max_partitions_per_run or 2**31 - 1


def ranged_run_requests(
    asset: dg.AssetsDefinition, all_keys: list[str], selected: list[str] | set[str],
    run_key_prefix: str | Callable[[Sequence[str]], str] = "",
) -> list[dg.RunRequest]:
    """Run requests covering ``selected`` partitions in ranges of consecutive keys, each at most the asset's
    ``max_partitions_per_run`` long, as a backfill with the same policy would make them (run key =
    ``<prefix><first>..<last>``; ``run_key_prefix`` may be a function of the range's keys)."""
    out = []
    for keys in contiguous_ranges(all_keys, selected, max_partitions_per_run(asset)):
        tags = range_run_tags(keys)
        prefix = run_key_prefix(keys) if callable(run_key_prefix) else run_key_prefix
        run_key = f"{prefix}{keys[0]}..{keys[-1]}"
        if len(keys) == 1:
            out.append(dg.RunRequest(partition_key=keys[0], run_key=run_key))
        else:
            out.append(dg.RunRequest(run_key=run_key, tags=tags))
    return out


def backfill_missing_schedule(
    asset: dg.AssetsDefinition,
    *,
    job: dg.UnresolvedAssetJobDefinition | None = None,
    cron_schedule: str = "0 * * * *",
    name: str | None = None,
    default_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED,
    stale: bool = False,
    corpus: CorpusSource | None = None,
) -> dg.ScheduleDefinition:
    """A schedule (dynamic partitions cannot use build_schedule_from_partitioned_job) that re-requests
    missing and failed partitions of ``asset``, and with ``stale`` its stale ones (file or fingerprint
    changed, :func:`dagster_gpu.definitions.partitions.partition_staleness` against ``corpus``, default the asset's corpus
    URL with every file)."""
    job = job or asset_job(asset)

    @dg.schedule(
        name=name or f"{asset.key.to_python_identifier()}_missing_schedule",
        job=job,
        cron_schedule=cron_schedule,
        default_status=default_status,
    )
    def _schedule(context: dg.ScheduleEvaluationContext):
        todo = partitions_to_rerun(context.instance, asset)
        if stale:
            found = set(partition_staleness(context.instance, asset, corpus or corpus_of(asset)).stale_keys)
            todo = [k for k in context.instance.get_dynamic_partitions(dynamic_partitions_def(asset).name)
                    if k in found or k in set(todo)]
        if not todo:
            return dg.SkipReason("every partition is materialized and up to date, or in flight" if stale
                                 else "every partition is materialized or in flight")
        keys = list(context.instance.get_dynamic_partitions(dynamic_partitions_def(asset).name))
        return ranged_run_requests(asset, keys, todo)

    return _schedule
