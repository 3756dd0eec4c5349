"""Sensor and schedule for corpus partitions.

- :func:`corpus_sensor`: lists the corpus each tick, adds a dynamic partition for every file whose key
  is not yet a partition, and requests runs over ranges of the new partitions and of the changed ones (a
  file whose source version differs from the one its partition's latest materialization read; none with a
  run in progress), at most the asset's ``max_partitions_per_run`` each, as a backfill would; run key =
  ``<hash of the range's keys and versions>:<first>..<last>``, so a version of a file is never requested
  twice by the sensor. A file rewritten while its run reads it is found changed at the next tick after
  that run (the run recorded the version from before its read). With the asset depending on its corpus
  source asset (:func:`dagster_gpu.partitions.source_versions.corpus_source`), the tick also records an observation and a runless
  materialization of the corpus asset per partition whose file is new or changed (its data version; why both:
  :mod:`dagster_gpu.partitions.source_versions`). With ``prune=True`` it deletes the partitions
  of files gone, their outputs and their index rows (:func:`dagster_gpu.definitions.partitions.prune_partitions`). The
  cursor records how many files and the newest modification time seen (for the UI); the set of existing
  partitions is the authority, so files arriving out of modification-time order are never missed.
- :func:`backfill_missing_schedule`: requests runs for partitions never materialized, or failed (as the
  UI's partitions view shows them: a failed ranged run's partitions that it did not materialize), and with
  ``stale=True`` the stale ones (:mod:`dagster_gpu.partitions.stale`), skipping partitions with a run in flight;
  consecutive keys share ranged runs, a key that is fine ends a range.
"""

from __future__ import annotations

import json
import time
from typing import Any, Mapping, Sequence

import dagster as dg

from dagster_gpu.corpus.listing import CorpusFile, CorpusNotFound, CorpusSource, CorpusUnreadable
from dagster_gpu.definitions.partitions import (
    NoCorpus,
    corpus_of,
    indexes_following,
    partition_staleness,
    prune_partitions,
)
from dagster_gpu.partitions.run_ranges import max_partitions_per_run
from dagster_gpu.partitions.run_requests import (
    planned_ranges,
    ranged_run_requests,
    shard_groups,
    versioned_run_requests,
)
from dagster_gpu.partitions.source_versions import (
    corpus_asset_key,
    corpus_updates,
    corpus_versions,
    depends_on_corpus,
    failed_reads,
    recorded_versions,
)
from dagster_gpu.partitions.status import (
    attempts_since,
    bridgeable,
    dynamic_partitions_def,
    missing_or_failed,
    partition_status,
)
from dagster_gpu.partitions.unit_cost import unit_cost
from dagster_gpu.policy.batching import Held, hold_decision


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
    max_delay_seconds: float | None = None,
    target_useful_fraction: float = 0.5,
    bridge: bool = True,
) -> dg.SensorDefinition:
    """A sensor adding one partition per new corpus file of ``asset`` and requesting ranged runs over the
    new partitions and (``changed``) the partitions whose file changed since it was embedded, or since an
    attempt at it failed (a broken file that was fixed).

    A failed partition is requested again when its file's version differs from the one the failed attempt
    read (recorded on its failed checks, :data:`dagster_gpu.instance.checks.FAILED_SOURCE_VERSION`; when the attempt
    read none, when the file was modified after the failure). An unchanged failed file is never requested
    again by the sensor (the missing-partitions schedule retries it a bounded number of times).

    ``max_delay_seconds`` (the freshness knob; None: every due file is requested at the tick that finds it):
    the files due are planned into the runs they would be requested in
    (:func:`dagster_gpu.partitions.run_requests.planned_ranges`), and each run is requested, as planned, once it
    would reach ``target_useful_fraction`` (:func:`dagster_gpu.policy.batching.hold_decision`, with
    :func:`dagster_gpu.partitions.unit_cost.unit_cost`: the measured start-up and the embedding seconds per byte
    learned from the asset's history; a changed file's bytes its last materialization read and a bridged file's
    bytes priced as reuse) or its oldest file has waited ``max_delay_seconds``. The cursor remembers when each held file was first found due (a daemon
    restart loses nothing: the files due are found again from the listing and the instance; run keys are
    content hashes, so nothing is requested twice). New files are registered as partitions when requested.
    The tick's skip reason or log line says why it held or requested; a tick that requests runs logs how many
    new and how many changed or fixed files (file groups for a file-grouped corpus) it requests, naming the
    first of each (:func:`requested_files_line`).

    ``bridge``: neighbouring ranges of due keys become one run over the keys between them too, when those
    are materialized and current and redoing them costs less than the start-up saved
    (:func:`dagster_gpu.policy.batching.bridge_ranges`).

    ``prune``: each tick also deletes the partitions whose file is gone (none with a run in progress), their
    output parquet files (fsspec with ``output_storage_options``) and their rows in the vector indexes that
    follow ``asset`` in the code location, and logs each (partition, output, index rows).

    Raises ValueError for ``target_useful_fraction`` outside (0, 1] or a negative ``max_delay_seconds``.
    """
    pdef = dynamic_partitions_def(asset)
    job = job or asset_job(asset)
    if not 0 < target_useful_fraction <= 1:
        raise ValueError(f"corpus_sensor: target_useful_fraction must be in (0, 1], got {target_useful_fraction}")
    if max_delay_seconds is not None and max_delay_seconds < 0:
        raise ValueError(f"corpus_sensor: max_delay_seconds must be >= 0, got {max_delay_seconds}")

    @dg.sensor(
        name=name or f"{asset.key.to_python_identifier()}_corpus_sensor",
        job=job,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=f"New and changed files under {corpus.url} become partitions of {asset.key.to_user_string()} and are materialized"
                    + (f" (held up to {max_delay_seconds:g} s for a unit {target_useful_fraction:.0%} useful)." if max_delay_seconds is not None else "."),
    )
    def _sensor(context: dg.SensorEvaluationContext):
        if corpus.group_buckets is not None:  # streamed or incremental: the plans keep the members
            files, listing = corpus.list_buckets()
            context.log.info(f"{corpus.url}: {listing.describe()}")
        else:
            files = corpus.list_files(members=False)
        if prune:
            _prune(context, asset, corpus, files, output_storage_options)
        registered = list(context.instance.get_dynamic_partitions(pdef.name))
        existing = set(registered)
        new = [f for f in files if f.key not in existing]
        due_again, status, recorded = ([], None, {})
        if changed and len(new) < len(files):
            due_again, status, recorded = _due_again(context.instance, asset, [f for f in files if f.key in existing])
        events = []
        if depends_on_corpus(asset):
            events = corpus_updates(corpus_asset_key(asset.key), files, corpus_versions(context.instance, corpus_asset_key(asset.key)))
        cursor: dict[str, Any] = {"files": len(files), "newest_mtime": max((f.mtime for f in files), default=0.0)}
        due = [*due_again, *new]
        if not due:
            return dg.SensorResult(skip_reason=dg.SkipReason(f"no new or changed files under {corpus.url}"),
                                   cursor=json.dumps(cursor), asset_events=events)
        cost = unit_cost(context.instance, asset) if (max_delay_seconds is not None or (bridge and status is not None)) else None
        bridge_keys = bridgeable(files, status) if bridge and status is not None else None
        ranges = None  # the runs to request: as the freshness knob priced them, else planned below
        if max_delay_seconds is not None:
            now = time.time()
            held = _held(context.cursor, due, now, {k: r.size_bytes for k, r in recorded.items() if r.size_bytes})
            due_keys = {f.key for f in due}
            # the runs these files would be requested in, each priced as it will run
            units = planned_ranges(asset, [*registered, *(f.key for f in new)], [f.key for f in due],
                                   bridgeable=bridge_keys, cost=cost, apart=shard_groups(files))
            decision = hold_decision(held, now, cost, target_useful_fraction, max_delay_seconds, units=units,
                                     bridged={k: (bridge_keys or {}).get(k, 0) for u in units for k in u if k not in due_keys})
            ranges = decision.units
            if decision.kept:
                cursor["held"] = {h.key: [h.version, h.size_bytes, h.since] for h in decision.kept}
            if not decision.release:
                return dg.SensorResult(skip_reason=dg.SkipReason(decision.why), cursor=json.dumps(cursor), asset_events=events)
            context.log.info(decision.why)
            now_keys = {h.key for h in decision.released}
            new, due_again = [f for f in new if f.key in now_keys], [f for f in due_again if f.key in now_keys]
            due = [*due_again, *new]
        keys = [f.key for f in new]
        what = "file group(s)" if corpus.group_buckets is not None else "file(s)"
        context.log.info(requested_files_line(keys, [f.key for f in due_again], what, corpus.url))
        all_keys = [*registered, *keys]
        # the new keys are appended to the definition in this order, so they are consecutive
        return dg.SensorResult(
            run_requests=versioned_run_requests(asset, all_keys, due, bridgeable=bridge_keys, cost=cost, all_files=files,
                                                ranges=ranges),
            dynamic_partitions_requests=[pdef.build_add_request(keys)] if keys else [],
            cursor=json.dumps(cursor),
            asset_events=events,
        )

    return _sensor


def first_keys(keys: Sequence[str], n: int = 10) -> str:
    """The first ``n`` of ``keys``, comma-separated, followed by `` …`` when there are more."""
    return ", ".join(keys[:n]) + (" …" if len(keys) > n else "")


def requested_files_line(new: Sequence[str], again: Sequence[str], what: str, url: str) -> str:
    """The corpus sensor's line for a tick that requests runs: how many new and how many changed or fixed
    partitions (``what``: ``file(s)``, or ``file group(s)`` for a file-grouped corpus) under ``url``, naming
    the first keys of each."""
    named = [f"{label}: {first_keys(keys)}" for label, keys in (("new", new), ("changed or fixed", again)) if keys]
    return f"requesting {len(new)} new and {len(again)} changed or fixed {what} under {url}: " + "; ".join(named)


def requested_partitions_line(todo: Sequence[str], failed: set[str], stale: set[str], tries: Mapping[str, int],
                              max_failed_attempts: int | None) -> str:
    """The missing-partitions schedule's line for a tick that requests runs over ``todo``: how many missing,
    failed (retried) and stale partitions, naming the first keys of each; each retried failed one with its
    try since its file last changed (``tries``: runs since then, as counted by
    :func:`dagster_gpu.partitions.status.attempts_since`; this is try ``tries + 1`` of
    ``max_failed_attempts``, or without a bound only "retried")."""
    stale_keys = [k for k in todo if k in stale]
    retried = [k for k in todo if k in failed and k not in stale]
    missing = [k for k in todo if k not in failed and k not in stale]
    if max_failed_attempts is not None:
        retried = [f"{k} (try {tries.get(k, 0) + 1} of {max_failed_attempts} on this file version)" for k in retried]
    parts = [f"{len(keys)} {label}: {first_keys(keys)}" for label, keys in
             (("missing", missing), ("failed, retried", retried), ("stale", stale_keys)) if keys]
    return f"requesting {len(todo)} partition(s): " + "; ".join(parts)


def _due_again(instance: dg.DagsterInstance, asset: dg.AssetsDefinition, files: Sequence[CorpusFile]):
    """(registered files due again, none in progress, in the listing's order), (materialized, failed, in
    progress) keys, and each partition's latest materialization
    (:func:`dagster_gpu.partitions.source_versions.recorded_versions`). A file is due when its version differs from the one its latest attempt *read*: its latest
    materialization, or for a failed partition its latest failed attempt that read the file, whichever is later
    (an attempt that failed before reading it, e.g. its worker was lost, does not count: the same versions
    make the same run key, which Dagster does not run twice; the schedule retries those). A failed attempt
    that recorded no version counts as having read the file if it failed after the file's modification."""
    status = partition_status(instance, asset)
    _, failed, in_progress = status
    recorded = recorded_versions(instance, asset.key)
    fails = failed_reads(instance, asset.key, [f.key for f in files if f.key in failed and f.key not in in_progress])
    due = []
    for f in files:
        if f.key in in_progress or not f.version:
            continue
        r, fr = recorded.get(f.key), fails.get(f.key)
        if fr is not None and (r is None or r.timestamp is None or fr.timestamp >= r.timestamp):
            if fr.source_version != f.version if fr.source_version else f.mtime > fr.timestamp:
                due.append(f)
        elif r is not None and r.source_version not in (None, f.version):
            due.append(f)
    return due, status, recorded


def _held(raw_cursor: str | None, due: Sequence[CorpusFile], now: float,
          read_before: Mapping[str, int] | None = None) -> list[Held]:
    """The files due as :class:`Held`, each since when the cursor says it was first found due (now if new).
    ``read_before``: key -> the corpus bytes its latest materialization read; that many of a file's bytes
    (at most its size) count as reused: an estimate that holds for a file that grew (its earlier text's
    vectors are reused, :mod:`dagster_gpu.embedding.reuse`) and overcounts the reuse of one rewritten in place."""
    try:
        before = json.loads(raw_cursor or "{}").get("held") or {}
    except (ValueError, AttributeError):
        before = {}
    out = []
    for f in due:
        prev = before.get(f.key)
        since = float(prev[2]) if isinstance(prev, list) and len(prev) == 3 else now
        size = int(f.size_bytes)
        out.append(Held(f.key, f.version or "", size, since, min(size, int((read_before or {}).get(f.key, 0)))))
    return out


def _prune(context: dg.SensorEvaluationContext, asset: dg.AssetsDefinition, corpus: CorpusSource,
           files: Sequence[CorpusFile], output_storage_options: Mapping[str, Any] | None) -> None:
    repo = getattr(context, "repository_def", None)
    assets = list(repo.assets_defs_by_key.values()) if repo is not None else []
    for p in prune_partitions(context.instance, asset, corpus, delete_outputs=True,
                              indexes=indexes_following(assets, asset.key),
                              output_storage_options=output_storage_options, files=files):
        (context.log.warning if p.error else context.log.info)(f"{asset.key.to_user_string()} {p.describe()}")


def backfill_missing_schedule(
    asset: dg.AssetsDefinition,
    *,
    job: dg.UnresolvedAssetJobDefinition | None = None,
    cron_schedule: str = "0 * * * *",
    name: str | None = None,
    default_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED,
    stale: bool = False,
    corpus: CorpusSource | None = None,
    max_failed_attempts: int | None = 3,
    bridge: bool = True,
) -> dg.ScheduleDefinition:
    """A schedule (dynamic partitions cannot use build_schedule_from_partitioned_job) that re-requests
    missing and failed partitions of ``asset``, and with ``stale`` its stale ones (file or fingerprint
    changed, :func:`dagster_gpu.definitions.partitions.partition_staleness` against ``corpus``, default the asset's corpus
    URL with every file).

    Failed partitions are retried with a bounded back-off: at most ``max_failed_attempts`` runs per version of
    the file (runs planned to materialize it since its latest materialization and since its file's
    modification time, :func:`dagster_gpu.partitions.status.attempts_since`); then the schedule leaves it
    (the tick says which), until its file changes (the corpus sensor then requests it, as does the schedule's
    count starting over) or ``dagster-gpu backfill --failed`` runs it by hand. A bound, not "only when the
    file changes": a failure whose cause is not the file (a node lost, a model cache not mounted, the
    scheduler down) is fixed without the file changing and deserves a few tries; a broken file does not
    deserve one every hour forever. None: retried at every tick (the behaviour before the bound).

    ``bridge``: neighbouring ranges become one run over the materialized keys between them when that costs
    less than a second unit's start-up (:func:`dagster_gpu.policy.batching.bridge_ranges`).

    A tick that requests runs logs one line: how many missing, failed (each with its try on this file version)
    and stale partitions, naming the first of each (:func:`requested_partitions_line`)."""
    job = job or asset_job(asset)
    if max_failed_attempts is not None and max_failed_attempts < 1:
        raise ValueError(f"backfill_missing_schedule: max_failed_attempts must be >= 1 or None, got {max_failed_attempts}")

    @dg.schedule(
        name=name or f"{asset.key.to_python_identifier()}_missing_schedule",
        job=job,
        cron_schedule=cron_schedule,
        default_status=default_status,
    )
    def _schedule(context: dg.ScheduleEvaluationContext):
        keys = list(context.instance.get_dynamic_partitions(dynamic_partitions_def(asset).name))
        status = partition_status(context.instance, asset)
        failed = status[1]
        todo = missing_or_failed(keys, status)
        found = set()
        files = None
        if stale:
            files = (corpus or corpus_of(asset)).list_files(members=False)
            found = set(partition_staleness(context.instance, asset, corpus or corpus_of(asset), files=files).stale_keys)
            todo = [k for k in keys if k in found or k in set(todo)]
        given_up: list[str] = []
        tries: dict[str, int] = {}
        retry = [k for k in todo if k in failed and k not in found]
        if retry and max_failed_attempts is not None:
            files = files if files is not None else _listing_or_empty(corpus or _corpus_or_none(asset))
            mtime = {f.key: f.mtime for f in files}
            tries = attempts_since(context.instance, asset, {k: mtime.get(k, 0.0) for k in retry}, limit=max_failed_attempts)
            given_up = [k for k in retry if tries.get(k, 0) >= max_failed_attempts]
            todo = [k for k in todo if k not in set(given_up)]
        if given_up:
            context.log.info(f"{len(given_up)} failed partition(s) not retried: failed {max_failed_attempts} time(s) since "
                             f"their file last changed: {first_keys(given_up)}")
        if not todo:
            why = ("every partition is materialized and up to date, or in flight" if stale
                   else "every partition is materialized or in flight")
            if given_up:
                why += f"; {len(given_up)} failed partition(s) left until their file changes (failed {max_failed_attempts} time(s))"
            return dg.SkipReason(why)
        cost = bridge_keys = None
        if bridge:
            files = files if files is not None else _listing_or_empty(corpus or _corpus_or_none(asset))
            bridge_keys = bridgeable(files, status)
            cost = unit_cost(context.instance, asset)
        context.log.info(requested_partitions_line(todo, failed, found, tries, max_failed_attempts))
        return ranged_run_requests(asset, keys, todo, bridgeable=bridge_keys, cost=cost)

    return _schedule


def _corpus_or_none(asset: dg.AssetsDefinition) -> CorpusSource | None:
    try:
        return corpus_of(asset)
    except NoCorpus:
        return None


def _listing_or_empty(corpus: CorpusSource | None) -> list[CorpusFile]:
    """The corpus listing; [] when there is no corpus or it cannot be listed (then nothing is bridged and
    every failed partition counts its attempts since the epoch)."""
    if corpus is None:
        return []
    try:
        return corpus.list_files(members=False)
    except (CorpusNotFound, CorpusUnreadable):
        return []
