"""Source versions of corpus files in Dagster's own terms (I/O: the Dagster instance's event log).

Each materialization of a partition records the version of the file it read (``corpus/source_version``
metadata, from :func:`dagster_gpu.corpus.listing.source_version`, read right before the read: see
:func:`version_at_read`). The unit tags each materialization with ``dagster/code_version`` and
``dagster/data_version`` (:func:`dagster_gpu.worker.unit.version_tags`) and, when the asset depends on its
corpus source asset (:func:`corpus_source`), with the input tags Dagster itself writes on a materialization
made from an ``Output`` (``dagster/_core/execution/plan/execute_step.py`` ``_build_data_version_tags``,
dagster 1.13.27): ``dagster/input_data_version/<corpus asset>`` and ``dagster/input_event_pointer/<corpus
asset>`` (:func:`input_tags`).

With :func:`corpus_source`, the corpus is an external asset with the embedding asset's dynamic partitions
definition, and ``corpus_sensor`` records two runless events per partition whose file is new or changed
(:func:`corpus_updates`, both tagged ``dagster/data_version`` = the source version, from the listing the sensor
makes anyway), because Dagster 1.13 reads each for a different purpose:

- an ``AssetObservation``: the staleness machinery reads a partitioned external dependency's observations
  only (``CachingStaleStatusResolver._is_dep_updated`` → ``get_latest_data_version_record(is_source=True)``),
  so a partition of the embeddings whose file or code version changed shows as "Unsynced" with those causes;
- an ``AssetMaterialization`` (the file was updated outside Dagster): the UI's partition counts of an asset
  are materializations only (dagster-graphql ``AssetNode.partitionStats``: the lineage node's "% filled", the
  partitions view's "Missing"), as is the overview's "Latest materialization" of an asset that is not
  observable; with observations alone the corpus showed "0% filled" and "Missing (n)" after every file was seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import dagster as dg
from dagster import AssetCheckKey
from dagster._core.definitions.data_version import (
    CODE_VERSION_TAG,
    DATA_VERSION_TAG,
    get_input_data_version_tag,
    get_input_event_pointer_tag,
)
from dagster._core.event_api import PartitionKeyFilter
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from dagster_gpu.corpus.listing import CorpusFile, CorpusNotFound, CorpusSource, CorpusUnreadable
from dagster_gpu.instance.checks import FAILED_SOURCE_VERSION, OUTPUT_READABLE
from dagster_gpu.instance.events import metadata_value
from dagster_gpu.instance.history import SIZE_KEYS

#: Materialization metadata: the source version of the file the partition was embedded from.
SOURCE_VERSION_KEY = "corpus/source_version"
#: Materialization metadata written by the embedding side: the embedding fingerprint of the output.
FINGERPRINT_KEY = "embedding/fingerprint"
#: Materialization metadata: the embedding options the partition ran under (JSON, ``config_fields``).
CONFIG_KEY = "embedding/config"

_NULL_POINTER = "NULL"  # dagster's NULL_EVENT_POINTER
_BATCH = 500  # storage ids per event-log query


def corpus_asset_key(asset_key: dg.AssetKey) -> dg.AssetKey:
    """The corpus source asset of ``asset_key``: same prefix, name ``<name>_corpus``."""
    return dg.AssetKey([*asset_key.path[:-1], f"{asset_key.path[-1]}_corpus"])


def corpus_source(asset: dg.AssetsDefinition, corpus: CorpusSource) -> tuple[dg.AssetSpec, dg.AssetsDefinition]:
    """(the corpus as an external asset, ``asset`` depending on it partition by partition).

    Put both in the Definitions instead of ``asset``. The spec has ``asset``'s dynamic partitions
    definition (identity mapping: partition k of the embeddings reads partition k of the corpus) and
    group. Raises TypeError when ``asset``'s partitions are not dynamic.
    """
    pdef = asset.partitions_def
    if not isinstance(pdef, dg.DynamicPartitionsDefinition):
        raise TypeError(f"asset {asset.key.to_user_string()} must use a DynamicPartitionsDefinition, got {type(pdef).__name__}")
    key = corpus_asset_key(asset.key)
    spec = dg.AssetSpec(
        key, partitions_def=pdef, group_name=asset.group_names_by_key.get(asset.key),
        description=(f"The files under {corpus.url} (one partition per file); each partition's data version is its "
                     "file's source version (S3 VersionId or ETag, else size and modification time), observed by the corpus sensor."
                     if corpus.group_buckets is None else
                     f"The files under {corpus.url} in {corpus.group_buckets} buckets by a hash of their paths (one partition "
                     "per non-empty bucket); each partition's data version digests its files' source versions, observed by "
                     "the corpus sensor."),
        metadata={"dagster_gpu/corpus_url": corpus.url}, kinds={"s3" if corpus.url.startswith("s3://") else "file"},
    )
    (linked,) = dg.map_asset_specs(lambda s: s.merge_attributes(deps=[key]) if s.key == asset.key else s, [asset])
    return spec, linked


def depends_on_corpus(asset: dg.AssetsDefinition, asset_key: dg.AssetKey | None = None) -> bool:
    """True when the asset reads its corpus source asset (made by :func:`corpus_source`)."""
    asset_key = asset_key or asset.key
    return corpus_asset_key(asset_key) in asset.asset_deps.get(asset_key, set())


def input_tags(instance: dg.DagsterInstance, asset: dg.AssetsDefinition, asset_key: dg.AssetKey,
               partition_key: str, source_version: str) -> dict[str, str]:
    """The input provenance tags of partition ``partition_key``'s materialization when ``asset_key`` depends on
    its corpus source asset (else ``{}``: Dagster reads an input the asset does not depend on as a removed
    dependency): ``dagster/input_data_version/<corpus>`` = the source version read and
    ``dagster/input_event_pointer/<corpus>`` = the storage id of that partition's latest observation (one
    event-log query), as Dagster writes them for an ``Output``: for a partitioned external dependency, Dagster's
    staleness check reads observations after that pointer (``_is_dep_updated`` →
    ``get_latest_data_version_record(is_source=True)``)."""
    if not depends_on_corpus(asset, asset_key):
        return {}
    corpus_key = corpus_asset_key(asset_key)
    return {get_input_data_version_tag(corpus_key): source_version,
            get_input_event_pointer_tag(corpus_key): input_event_pointer(instance, corpus_key, partition_key)}


def input_event_pointer(instance: dg.DagsterInstance, upstream: dg.AssetKey, partition_key: str) -> str:
    """The value of ``dagster/input_event_pointer/<upstream>`` for partition ``partition_key``: the storage id of
    that partition's latest observation of ``upstream`` (one event-log query), or Dagster's null pointer when it
    has none."""
    latest = instance.get_latest_storage_id_by_partition(upstream, dg.DagsterEventType.ASSET_OBSERVATION, {partition_key})
    pointer = latest.get(partition_key)
    return str(pointer) if pointer else _NULL_POINTER


def version_at_read(corpus: CorpusSource, file: CorpusFile) -> str:
    """``file``'s source version right before its read starts (:meth:`CorpusSource.current_version`), so a
    file rewritten during the read records the older version and is found changed afterwards; the listed
    version when the store cannot say (the read then fails with its own error). A file group's version is the
    one the unit resolved its bucket with (its own listing, or the stored plan with every member's version checked
    by one ``info`` call: :mod:`dagster_gpu.corpus.group_plan_store`), taken before the read, so it is never newer
    than the bytes read either."""
    try:
        return corpus.current_version(file)
    except (CorpusNotFound, CorpusUnreadable):
        return file.version


@dataclass(frozen=True)
class Recorded:
    """What a partition's latest materialization recorded: the source version it read (None: not
    recorded), the code version it ran under (``dagster/code_version``; None: not recorded), the embedding
    fingerprint (``embedding/fingerprint`` metadata; None: not recorded), its output URI, its run, when
    (epoch seconds; None: not known) and the corpus bytes it read (``corpus/bytes``; None: not recorded)."""

    source_version: str | None
    code_version: str | None
    fingerprint: str | None = None
    output_uri: str | None = None
    run_id: str | None = None
    #: the embedding options it ran under (``embedding/config``, :func:`dagster_gpu.embedding.fingerprint.config_fields`);
    #: None: not recorded
    config: Mapping[str, Any] | None = None
    timestamp: float | None = None
    size_bytes: int | None = None


def recorded_versions(instance: dg.DagsterInstance, asset_key: dg.AssetKey,
                      partitions: Iterable[str] | None = None) -> dict[str, Recorded]:
    """Partition key -> :class:`Recorded` of its latest materialization (partitions never materialized are
    absent). Costs one query for the latest storage ids and one per 500 partitions for their records."""
    wanted = set(partitions) if partitions is not None else None
    if wanted is not None and not wanted:
        return {}
    latest = instance.get_latest_storage_id_by_partition(asset_key, dg.DagsterEventType.ASSET_MATERIALIZATION, wanted)
    ids = sorted(latest.values())
    out: dict[str, Recorded] = {}
    for i in range(0, len(ids), _BATCH):
        chunk = ids[i : i + _BATCH]
        recs = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=asset_key, storage_ids=chunk), limit=len(chunk)).records
        for rec in recs:
            mat = rec.asset_materialization
            if mat is None or mat.partition is None:
                continue
            md, tags = mat.metadata, mat.tags or {}
            size = next((md[k].value for k in SIZE_KEYS if k in md and isinstance(md[k].value, (int, float))), None)
            out[mat.partition] = Recorded(
                source_version=_text(md.get(SOURCE_VERSION_KEY)),
                code_version=tags.get(CODE_VERSION_TAG),
                fingerprint=_text(md.get(FINGERPRINT_KEY)),
                output_uri=_text(md.get("embedding/output_uri")),
                run_id=rec.run_id or None,
                config=_json(md.get(CONFIG_KEY)),
                timestamp=float(rec.timestamp) if rec.timestamp is not None else None,
                size_bytes=int(size) if size is not None else None,
            )
    return out


def corpus_versions(instance: dg.DagsterInstance, corpus_key: dg.AssetKey) -> dict[str, str]:
    """Partition key -> the data version of the corpus asset's latest materialization of it (one query).
    Partitions only observed (what earlier versions recorded) are absent, so the next sensor tick records
    them once more, as both events (the observation's version unchanged: nothing turns stale)."""
    tags = instance.event_log_storage.get_latest_tags_by_partition(
        corpus_key, dg.DagsterEventType.ASSET_MATERIALIZATION, [DATA_VERSION_TAG])
    return {k: t[DATA_VERSION_TAG] for k, t in tags.items() if DATA_VERSION_TAG in t}


def corpus_updates(corpus_key: dg.AssetKey, files: Sequence[CorpusFile],
                   recorded: Mapping[str, str]) -> list[dg.AssetObservation | dg.AssetMaterialization]:
    """For each file whose version differs from ``recorded`` (:func:`corpus_versions`), an observation then a
    runless materialization of ``corpus_key`` (pure; why both: the module docstring). Each carries the source
    version as its data version and the file's URI, size (bytes) and modification time as metadata. Files
    without a version (the store gave none) are left out."""
    events: list[dg.AssetObservation | dg.AssetMaterialization] = []
    for f in files:
        if not f.version or recorded.get(f.key) == f.version:
            continue
        tags = {DATA_VERSION_TAG: f.version}
        md = {"corpus/file": f.uri, "corpus/size_bytes": int(f.size_bytes), SOURCE_VERSION_KEY: f.version,
              **({"corpus/files": f.file_count} if f.group is not None else {}),
              **({"corpus/modified_at": dg.MetadataValue.timestamp(f.mtime)} if f.mtime else {})}
        events += [dg.AssetObservation(corpus_key, partition=f.key, tags=tags, metadata=md),
                   dg.AssetMaterialization(corpus_key, partition=f.key, tags=tags, metadata=md)]
    return events


def record_corpus_versions(instance: dg.DagsterInstance, asset: dg.AssetsDefinition,
                           files: Sequence[CorpusFile]) -> int:
    """Record, as a ``corpus_sensor`` tick does, the corpus asset's events (:func:`corpus_updates`) for each of
    ``files`` that is new or whose source version changed, when ``asset`` depends on its corpus source asset
    (:func:`depends_on_corpus`; else nothing). Returns how many events were stored. Raises what the instance
    raises."""
    if not depends_on_corpus(asset):
        return 0
    key = corpus_asset_key(asset.key)
    events = corpus_updates(key, files, corpus_versions(instance, key))
    for ev in events:
        instance.report_runless_asset_event(ev)
    return len(events)


def _text(v) -> str | None:
    if v is None:
        return None
    v = metadata_value(v)
    v = getattr(v, "path", v) if not isinstance(v, str) else v
    return None if v is None else str(v)


def _json(v) -> Mapping[str, Any] | None:
    """A JSON metadata value's mapping (MetadataValue.json or a plain dict), else None."""
    v = metadata_value(v)
    v = getattr(v, "data", v)
    return dict(v) if isinstance(v, Mapping) else None
@dataclass(frozen=True)
class FailedRead:
    """A partition's latest failed attempt, as its unit recorded it on the failed evaluations of its checks
    (:func:`dagster_gpu.instance.checks.partition_failed_evaluations`): the source version of the file it read (None:
    it failed before reading one) and when (epoch seconds)."""

    source_version: str | None
    timestamp: float


def failed_reads(instance: dg.DagsterInstance, asset_key: dg.AssetKey, partitions: Iterable[str]) -> dict[str, FailedRead]:
    """Partition key -> :class:`FailedRead` of its latest failed ``output_readable`` evaluation, for
    ``partitions`` (keys with none are absent). One event-log query per partition: pass the failed ones only
    (:func:`dagster_gpu.partitions.status.partition_status`)."""
    check_key = AssetCheckKey(asset_key, OUTPUT_READABLE)
    out: dict[str, FailedRead] = {}
    for k in partitions:
        recs = instance.event_log_storage.get_asset_check_execution_history(
            check_key, limit=1, status={AssetCheckExecutionRecordStatus.FAILED}, partition_filter=PartitionKeyFilter(key=k))
        if not recs:
            continue
        entry = recs[0].event
        ev = entry.dagster_event if entry is not None else None
        data = ev.asset_check_evaluation_data if ev is not None else None
        # the event's own clock, not the row's create_timestamp: SQLite stores that as CURRENT_TIMESTAMP, whole
        # seconds, so a file written earlier in the same second looked modified after the failure
        when = entry.timestamp if entry is not None else float(recs[0].create_timestamp)
        out[k] = FailedRead(_text((data.metadata if data is not None else {}).get(FAILED_SOURCE_VERSION)), float(when))
    return out
