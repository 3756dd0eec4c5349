"""The vector index asset factory: a partitioned asset below an embedding asset that loads each partition's
parquet output into a LanceDB table (:class:`dagster_gpu.index.lance.VectorIndex`)."""


import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterator, Mapping, Sequence

import dagster as dg
from dagster._utils.schedules import is_valid_cron_string  # dagster 1.13.27: dagster/_utils/schedules.py

from dagster_gpu.core.request import TAG_PARTITIONS_DEF, GpuRequest
from dagster_gpu.corpus.stream import fs_protocol
from dagster_gpu.definitions.assets import beta_parameters_of_ours
from dagster_gpu.embedding.outputs import locate_output
from dagster_gpu.embedding.writer import lineage_from_metadata
from dagster_gpu.index.lance import (
    DEFAULT_ANN_MIN_ROWS,
    DEFAULT_CLEANUP_OLDER_THAN,
    DEFAULT_COMPACT_MIN_FRAGMENTS,
    DEFAULT_MAX_UNINDEXED_FRACTION,
    DEFAULT_REBUILD_AFTER_VERSIONS,
    VectorIndex,
)
from dagster_gpu.index.rows import index_rows
from dagster_gpu.instance.checks import materialization_target
from dagster_gpu.instance.events import metadata_value

#: The index asset's check: rows of the partition in the index = rows of its output parquet.
ROWS_CHECK = "index_rows_match_output"
#: Metadata keys the query side reads from the index asset's definition.
META_URI, META_TABLE, META_EMBEDDINGS = "dagster_gpu/index_uri", "dagster_gpu/index_table", "dagster_gpu/embeddings_asset"
#: The index asset's load settings (JSON: ``output_url``, ``ann_*``, ``compact_min_fragments``,
#: ``cleanup_older_than_s``), for a rebuild outside a run (:func:`rebuild_index`).
META_SETTINGS = "dagster_gpu/index_settings"
#: The default cron schedule the eager index's requests wait for (:func:`batched_eager`): every minute, so a
#: file that landed is searchable at most about a minute (and one automation tick) beyond its embedding.
DEFAULT_BATCH_CRON_SCHEDULE = "* * * * *"
#: Observation metadata of an index partition whose load failed: ``"Type: message"`` (``dagster-gpu stale`` shows it).
LOAD_FAILED_KEY = "index/load_failed"


def table_size(index: VectorIndex) -> dict[str, Any]:
    """The table's footprint as materialization metadata: ``index/disk_bytes`` (every version's files:
    :meth:`VectorIndex.disk_bytes`; left out where the store cannot be listed), ``index/versions`` and
    ``index/fragments`` (the latest version's)."""
    size = index.disk_bytes()
    return {**({"index/disk_bytes": size} if size is not None else {}), "index/versions": index.versions(),
            "index/fragments": index.fragments()}


def _check_specs(key: dg.AssetKey, pdef) -> list[dg.AssetCheckSpec]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)  # partitions_def on AssetCheckSpec is preview in 1.13
        return [dg.AssetCheckSpec(ROWS_CHECK, asset=key, blocking=True, partitions_def=pdef,
                                  description="rows of the partition in the index = rows of its output parquet")]


def read_output(uri: str, storage_options: Mapping[str, Any] | None = None):
    """``(rows, lineage)`` of one output: the whole parquet file as one Arrow table (pyarrow's reader, column
    chunks decoded in its thread pool; a local path read by pyarrow's own filesystem, anything else through
    fsspec) and its lineage (:func:`dagster_gpu.embedding.writer.lineage_from_metadata` of the same footer).
    Raises FileNotFoundError or pyarrow's ArrowInvalid naming the file."""
    import fsspec
    import pyarrow.parquet as pq

    fs, path = fsspec.core.url_to_fs(uri, **dict(storage_options or {}))
    if fs_protocol(fs) in ("file", "local"):
        table = pq.read_table(path)
    else:
        table = pq.read_table(path, filesystem=fs)
    return table, lineage_from_metadata(table.schema.metadata)


def load_partition(index: VectorIndex, partition_key: str, output_uri: str,
                   output_storage_options: Mapping[str, Any] | None = None, *, output=None) -> dict[str, Any]:
    """Load ``partition_key``'s rows into ``index`` from ``output_uri`` in one commit
    (:meth:`VectorIndex.write_partition`: appended when the partition is new to the table, replaced by one
    ``merge_insert`` otherwise) and count them back at the committed version
    (:meth:`VectorIndex.partition_rows_at`). ``output``: the
    ``(rows, lineage)`` :func:`read_output` already gave for ``output_uri`` (None: read it here). Returns the facts
    for the materialization and the check: ``output_rows``, ``index_rows``, ``version``, ``mode`` (``append`` or
    ``replace``), ``inserted``, ``updated``, ``deleted``, ``retries``, ``fingerprint``. Raises IndexSchemaError
    naming the file or partition, fsspec/pyarrow errors naming the file."""

    table, lineage = output if output is not None else read_output(output_uri, output_storage_options)
    fp = str(lineage.get("fingerprint", ""))
    rows = index_rows(table, partition_key, fp, source=output_uri)
    per_model = {k: v for k, v in dict(lineage.get("lineage") or {}).items() if k != "files"}  # a bucket's own files
    index.record_lineage(fp, {**per_model, "model": lineage.get("model"),
                              "model_revision": lineage.get("model_revision"), "fingerprint": fp})
    r = index.write_partition(partition_key, rows)
    counted = index.partition_rows_at(partition_key, r)
    return {"output_rows": table.num_rows, "index_rows": counted, "version": r.version, "mode": r.mode,
            "inserted": r.inserted, "updated": r.updated, "deleted": r.deleted, "retries": r.retries, "fingerprint": fp}


@dataclass(frozen=True)
class Loaded:
    """One partition's turn in :func:`load_partitions`: its ``partition_key``, the output ``source`` it was read
    from (None when none was found), :func:`load_partition`'s ``facts`` or the ``error`` (``"Type: message"``) that
    kept it out of the index (one of them is None), and ``seconds``: wall seconds from its turn to its count back
    (waiting for the rest of its read, which began during the previous partition's commit, the commit, the count)."""

    partition_key: str
    source: str | None
    facts: dict[str, Any] | None
    error: str | None
    seconds: float


def load_partitions(index: VectorIndex, partition_keys: Sequence[str], locate: Callable[[str], str],
                    output_storage_options: Mapping[str, Any] | None = None) -> Iterator[Loaded]:
    """:func:`load_partition` of each of ``partition_keys`` in order, the next partition's output located
    (``locate(key)``: its URI; it raises, e.g. FileNotFoundError, for a partition without one) and read
    (:func:`read_output`) on one thread while this one is committed and counted: pyarrow's read and LanceDB's write
    both run outside the GIL, so a run of many partitions takes about the longer of the two per partition rather
    than their sum. At most two partitions' outputs are in memory at once. A partition whose output is missing,
    unreadable or does not fit the table is yielded with its ``error`` and touches nothing; the others go on."""
    keys = list(partition_keys)

    def fetch(pk: str) -> tuple[str | None, Any, Exception | None]:
        """(source, read_output's result, None), or what is known and the error that stopped it."""
        src = None
        try:
            src = locate(pk)
            return src, read_output(src, output_storage_options), None
        except Exception as e:  # noqa: BLE001 - the partition's own error, reported with it
            return src, None, e

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dagster-gpu-index-read") as pool:
        ahead: Future | None = pool.submit(fetch, keys[0]) if keys else None
        for i, pk in enumerate(keys):
            started = time.perf_counter()
            current, ahead = ahead, (pool.submit(fetch, keys[i + 1]) if i + 1 < len(keys) else None)
            src, output, error = current.result()
            if error is None:
                try:
                    facts = load_partition(index, pk, src, output_storage_options, output=output)
                except Exception as e:  # noqa: BLE001 - this partition fails alone; the table is unchanged for it
                    error = e
            del output, current  # the read rows: at most this partition's and the next one's are held
            seconds = time.perf_counter() - started
            if error is not None:
                yield Loaded(pk, src, None, f"{type(error).__name__}: {error}", seconds)
            else:
                yield Loaded(pk, src, facts, None, seconds)


def partition_materialization(key: dg.AssetKey, index: VectorIndex, done: Loaded,
                              extra: Mapping[str, Any] | None = None) -> dg.AssetMaterialization:
    """The index asset's materialization of a partition :func:`load_partitions` loaded (``done.facts`` set), with
    ``extra`` metadata."""
    facts = done.facts
    return dg.AssetMaterialization(asset_key=key, partition=done.partition_key, metadata={
        "index/rows": facts["index_rows"], "index/version": facts["version"], "index/mode": facts["mode"],
        "index/deleted": facts["deleted"], "index/seconds": round(done.seconds, 4),
        "index/retries": facts["retries"], "index/fingerprint": facts["fingerprint"],
        "index/output_uri": dg.MetadataValue.path(done.source), "index/uri": index.uri, "index/table": index.table_name,
        **dict(extra or {}),
    })


def rows_check(key: dg.AssetKey, done: Loaded, target=None) -> dg.AssetCheckEvaluation:
    """The blocking ``index_rows_match_output`` evaluation of a loaded partition (``target``: the materialization
    it evaluates, :func:`dagster_gpu.instance.checks.materialization_target`)."""
    facts = done.facts
    ok = facts["index_rows"] == facts["output_rows"]
    return dg.AssetCheckEvaluation(
        asset_key=key, check_name=ROWS_CHECK, passed=ok, partition=done.partition_key, blocking=True,
        severity=dg.AssetCheckSeverity.ERROR,
        description=None if ok else f"{facts['index_rows']} rows in the index, {facts['output_rows']} in {done.source}",
        metadata={"index_rows": facts["index_rows"], "output_rows": facts["output_rows"]},
        target_materialization_data=target,
    )


def load_failure(key: dg.AssetKey, done: Loaded) -> dg.AssetObservation:
    """The observation recording that ``done``'s load failed (``index/load_failed``: its error)."""
    return dg.AssetObservation(asset_key=key, partition=done.partition_key,
                               metadata={LOAD_FAILED_KEY: done.error, "index/output_uri": done.source or ""})


def batched_eager(cron_schedule: str | None) -> dg.AutomationCondition:
    """``AutomationCondition.eager()``, its requests held until the first evaluation after a tick of
    ``cron_schedule`` (UTC) when one is given (``cron_tick_passed`` is true for one evaluation per tick; eager's
    ``since_last_handled`` keeps a partition pending until it is requested, so none is lost while held; eager comes
    first so that its own conditions see every evaluation). Raises ValueError naming a malformed cron string."""
    eager = dg.AutomationCondition.eager()
    if cron_schedule is None:
        return eager
    if not is_valid_cron_string(cron_schedule):
        raise ValueError(f"vector_index_asset: batch_cron_schedule {cron_schedule!r} is not a cron string")
    return (eager & dg.AutomationCondition.cron_tick_passed(cron_schedule, "UTC")).with_label(
        f"eager, batched at {cron_schedule} (UTC)")


def vector_index_asset(
    embeddings: dg.AssetsDefinition,
    *,
    uri: str,
    table: str | None = None,
    name: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    output_url: str | None = None,
    output_storage_options: Mapping[str, Any] | None = None,
    ann_min_rows: int = DEFAULT_ANN_MIN_ROWS,
    ann_kind: str = "IVF_HNSW_SQ",
    ann_max_unindexed_fraction: float = DEFAULT_MAX_UNINDEXED_FRACTION,
    ann_max_unindexed_rows: int | None = None,
    compact_min_fragments: int | None = DEFAULT_COMPACT_MIN_FRAGMENTS,
    cleanup_older_than: timedelta = DEFAULT_CLEANUP_OLDER_THAN,
    rebuild_after_versions: int | None = DEFAULT_REBUILD_AFTER_VERSIONS,
    group_name: str | None = None,
    max_partitions_per_run: int | None = None,
    automation_condition: dg.AutomationCondition | None | str = "eager",
    batch_cron_schedule: str | None = DEFAULT_BATCH_CRON_SCHEDULE,
) -> dg.AssetsDefinition:
    """A partitioned asset (``embeddings``' partitions, depending on it partition by partition) keeping a LanceDB
    table in step with ``embeddings``' outputs.

    Args:
        embeddings: an :func:`dagster_gpu.embedding_asset`.
        uri: the LanceDB database: a local directory or ``s3://bucket/prefix``.
        table: table name (default: the embedding asset's name). name: asset name (default ``<embeddings>_index``).
        storage_options: LanceDB's object-store options (``aws_endpoint``, ``allow_http``, …).
        output_url, output_storage_options: where ``embeddings`` wrote (default: its ``dagster_gpu/output_url``
            metadata) and the fsspec options to read it.
        ann_min_rows, ann_kind: at the end of each run, with at least ``ann_min_rows`` rows in the table, the
            ANN index (``IVF_HNSW_SQ`` or ``IVF_PQ``, cosine) is built; below, queries scan exactly.
        ann_max_unindexed_fraction: rows loaded since the ANN index was built stay out of it (queries scan them
            exactly beside it) until they pass this fraction of the indexed rows (default 0.1); then the index is
            built again on every row (:meth:`VectorIndex.ensure_ann_index`: it is never merged in place).
        ann_max_unindexed_rows: a cap in rows on the same (default None: none); every query scans those rows, so
            this bounds what they add to its time.
        compact_min_fragments, cleanup_older_than: the table's upkeep at the end of each run
            (:meth:`VectorIndex.maintain`): without an ANN index, once the table has ``compact_min_fragments``
            fragments (default 32; each partition's commit adds one or more; None: never) it is compacted and its
            versions older than ``cleanup_older_than`` (default 10 minutes) deleted with the files only they used;
            with one, its rebuild compacts and deletes them the same way, and a table with at least
            ``rebuild_after_versions`` versions on storage (default 200; None: never) is rebuilt for that. Every
            commit otherwise keeps a version on storage for good. A search or load reading a version older than
            ``cleanup_older_than`` fails.
        max_partitions_per_run: a backfill's runs cover at most this many partitions (default: ``embeddings``').
        automation_condition: how the index follows ``embeddings`` by itself: ``"eager"`` (default:
            ``AutomationCondition.eager()``: a partition is requested once its embeddings partition was
            materialized again, none while that one is missing or in progress), another
            ``AutomationCondition``, or None (only backfills). Dagster evaluates it in an automation condition
            sensor: :func:`index_automation_sensor` (running by default), or the ``default_automation_condition_sensor``
            Dagster adds to a code location for assets no automation sensor targets (started in the UI).
        batch_cron_schedule: with ``"eager"``, the partitions it finds wait for the first evaluation after a
            tick of this cron schedule (UTC; default every minute) and are requested together:
            ``AutomationCondition.eager() & AutomationCondition.cron_tick_passed(...)`` (:func:`batched_eager`).
            Dagster's automation condition sensor emits a request of several partitions as one backfill, which
            runs them in ranges of ``max_partitions_per_run``: an embeddings backfill whose runs end one after
            another is indexed in a few runs, not one per run that ended between two sensor ticks. A partition
            waits at most one period longer. None: each evaluation requests what it found.

    Per partition: the output is read, its rows replace the partition's rows in one commit
    (:meth:`VectorIndex.write_partition`: an append for a partition new to the table, else one ``merge_insert``),
    one materialization (``index/rows``, ``index/version``, ``index/mode``, ``index/deleted``, ``index/seconds``
    (wall seconds: the wait for the output's read, which runs ahead during the previous partition's commit
    (:func:`load_partitions`), the commit and the count back), ``index/retries``, ``index/fingerprint``,
    ``index/output_uri``; the run's last partition also ``index/disk_bytes``, ``index/versions`` and
    ``index/fragments`` after the upkeep: :func:`table_size`) and the blocking check
    ``index_rows_match_output`` are recorded. A partition whose output is missing or does not fit the table
    fails alone (an observation with ``index/load_failed``: the error; dagster.Failure at the end names each);
    the table's other partitions are never touched. The table follows a change of the outputs' columns
    (:meth:`VectorIndex.write_partition`); a type change is refused, naming ``dagster-gpu index --rebuild``.
    """

    emb_key = embeddings.key
    emb_name = emb_key.path[-1]
    emb_meta = embeddings.metadata_by_key.get(emb_key, {})
    src_url = output_url or emb_meta.get("dagster_gpu/output_url")
    if not src_url:
        raise ValueError(f"vector_index_asset: {emb_key.to_user_string()} has no dagster_gpu/output_url metadata; pass output_url")
    src_url = str(metadata_value(src_url))
    pdef = embeddings.partitions_def
    name = name or f"{emb_name}_index"
    key = dg.AssetKey([*emb_key.path[:-1], name])
    table = table or emb_name
    per_run = max_partitions_per_run or (embeddings.backfill_policy.max_partitions_per_run
                                         if embeddings.backfill_policy else None) or 50
    index = VectorIndex(uri, table, storage_options)
    settings = {"output_url": src_url, "ann_min_rows": int(ann_min_rows), "ann_kind": ann_kind,
                "ann_max_unindexed_fraction": float(ann_max_unindexed_fraction),
                "ann_max_unindexed_rows": ann_max_unindexed_rows, "compact_min_fragments": compact_min_fragments,
                "cleanup_older_than_s": cleanup_older_than.total_seconds(), "rebuild_after_versions": rebuild_after_versions}
    if automation_condition == "eager":
        automation_condition = batched_eager(batch_cron_schedule)
    elif isinstance(automation_condition, str):
        raise ValueError(f"vector_index_asset: automation_condition must be 'eager', an AutomationCondition or None, got {automation_condition!r}")

    with beta_parameters_of_ours():
        decorate = dg.asset(
            name=name, key_prefix=list(emb_key.path[:-1]) or None, partitions_def=pdef, deps=[emb_key],
            group_name=group_name, kinds={"lancedb"}, output_required=False,
            # a CPU step: gpu_executor places it on a CPU (policy: count == 0); the partitions definition's name lets
            # gpu_executor resolve a ranged run's keys (dagster_gpu.partitions.run_ranges.run_partition_keys), as for embedding_asset
            op_tags={**GpuRequest(count=0).to_tags(), TAG_PARTITIONS_DEF: pdef.name or ""},
            backfill_policy=dg.BackfillPolicy.multi_run(per_run),
            description=f"LanceDB table {table!r} at {uri}: the rows of {emb_key.to_user_string()}, each partition replaced in one commit.",
            metadata={META_URI: uri, META_TABLE: table, META_EMBEDDINGS: emb_key.to_user_string(),
                      META_SETTINGS: dg.MetadataValue.json(settings)},
            check_specs=_check_specs(key, pdef),
            automation_condition=automation_condition,
        )

    def _index(context: dg.AssetExecutionContext):
        def locate(pk: str) -> str:
            src = locate_output(src_url, emb_name, pk, output_storage_options)
            if src is None:
                raise FileNotFoundError(f"no output of {emb_key.to_user_string()} for partition {pk!r} under {src_url}")
            return src

        def emit(done: Loaded, extra: Mapping[str, Any]) -> Iterator:
            """The partition's materialization (with ``extra`` metadata) and its check."""
            yield partition_materialization(key, index, done, extra)
            yield rows_check(key, done, materialization_target(context.instance, key, done.partition_key))

        failed: dict[str, str] = {}
        last: Loaded | None = None  # held back: its materialization carries the table's size after the upkeep
        for done in load_partitions(index, context.partition_keys, locate, output_storage_options):
            if done.facts is None:
                failed[done.partition_key] = done.error
                context.log.error(f"index partition {done.partition_key!r}: {done.error}")
                yield load_failure(key, done)
                continue
            if last is not None:
                yield from emit(last, {})
            last = done
        try:
            state = index.ensure_ann_index(ann_min_rows, ann_kind, max_unindexed_fraction=ann_max_unindexed_fraction,
                                           max_unindexed_rows=ann_max_unindexed_rows,
                                           cleanup_older_than=cleanup_older_than, max_versions=rebuild_after_versions)
            upkeep = index.maintain(compact_min_fragments, cleanup_older_than)
            context.log.info(f"index {table!r}: ANN index {state}, upkeep {upkeep} ({index.count_rows()} rows)")
        except Exception as e:
            failed["(ANN index)"] = f"{type(e).__name__}: {e}"
        if last is not None:  # its rows are committed: only its record waited for the ANN index and the upkeep
            try:
                size = table_size(index)
            except Exception as e:  # noqa: BLE001 - a figure for the metadata: the partition is loaded all the same
                context.log.warning(f"index {table!r}: size not read ({type(e).__name__}: {e})")
                size = {}
            yield from emit(last, size)
        for spec in _check_specs(key, None):
            yield dg.Output(None, output_name=spec.get_python_identifier())
        if failed:
            raise dg.Failure(description=f"{len(failed)} partition(s) not indexed: "
                             + "; ".join(f"{k}: {v}" for k, v in failed.items()), allow_retries=False)

    return decorate(_index)


def index_automation_sensor(
    *indexes: dg.AssetsDefinition,
    name: str = "index_automation_sensor",
    minimum_interval_seconds: int = 30,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.RUNNING,
) -> dg.AutomationConditionSensorDefinition:
    """The automation condition sensor evaluating the ``indexes``' automation conditions (each
    :func:`vector_index_asset`'s, ``AutomationCondition.eager()`` by default), running by default, so an index
    follows its embeddings with no hand-run backfill. Put it in the Definitions beside the index assets.
    The daemon's asset daemon ticks it every ``minimum_interval_seconds``; its runs cover ranges of partitions
    as the index asset's backfill policy allows."""
    if not indexes:
        raise ValueError("index_automation_sensor: name at least one index asset")
    return dg.AutomationConditionSensorDefinition(
        name, target=dg.AssetSelection.assets(*indexes), minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description="Index partitions requested once their embeddings partition was materialized again.",
    )
