"""Which partitions a ``dagster-gpu backfill`` covers: register the asset's corpus files, then select.

- :func:`corpus_of`: the asset's :class:`CorpusSource` — the one defined in the code location's module
  whose URL is the asset's ``dagster-gpu/corpus-url`` op tag (so its pattern and reader apply), else a
  plain one on that URL.
- :func:`register_corpus_files`: adds a dynamic partition for each corpus file not yet one (what
  ``corpus_sensor`` does each tick), so a new corpus needs no sensor first.
- :func:`select_partitions`: all registered, or the ``missing`` (never materialized) and/or ``failed``
  (latest run failed; a canceled run leaves them missing) ones, as ``backfill_missing_schedule`` computes them
  (:func:`dagster_gpu.partitions.status.partition_status`, as the UI's partitions view shows them; partitions in
  progress are left out), and/or the ``stale`` ones (:func:`partition_staleness`, :mod:`dagster_gpu.partitions.stale`).
- :func:`prune_partitions`: deletes the partitions of files gone from the corpus, and with ``delete_outputs``
  their output parquet files and their rows in every vector index following the asset.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Iterable, Mapping, Sequence

import dagster as dg

from dagster_gpu.core.request import TAG_CORPUS_URL, TAG_GROUP_BUCKETS, TAG_SHARD_BYTES
from dagster_gpu.corpus.listing import CorpusFile, CorpusNotFound, CorpusSource, CorpusUnreadable
from dagster_gpu.definitions.assets import CONFIG_METADATA_KEY
from dagster_gpu.definitions.vector_index import LOAD_FAILED_KEY, META_EMBEDDINGS, META_TABLE, META_URI
from dagster_gpu.embedding import writer as w
from dagster_gpu.embedding.fingerprint import columns_of_schema
from dagster_gpu.embedding.outputs import locate_output
from dagster_gpu.index.lance import VectorIndex
from dagster_gpu.instance.events import metadata_get, metadata_value, metadata_values
from dagster_gpu.partitions.run_ranges import max_partitions_per_run
from dagster_gpu.partitions.source_versions import recorded_versions
from dagster_gpu.partitions.stale import Staleness, StalePartition, find_stale
from dagster_gpu.partitions.status import bridgeable, dynamic_partitions_def, missing_or_failed, partition_status
from dagster_gpu.partitions.unit_cost import unit_cost
from dagster_gpu.policy.batching import bridge_ranges

log = logging.getLogger(__name__)


class NoCorpus(ValueError):
    """The asset has no corpus URL (not made by ``embedding_asset``); the message names the asset."""


def corpus_url_of(asset: dg.AssetsDefinition) -> str:
    """The asset's corpus URL from its op tags. Raises NoCorpus."""
    tags = asset.op.tags or {}
    url = tags.get(TAG_CORPUS_URL)
    if not url:
        raise NoCorpus(f"asset {asset.key.to_user_string()} has no op tag {TAG_CORPUS_URL!r}: not made by embedding_asset")
    return url


def embeddings_followed(asset: dg.AssetsDefinition, assets: Iterable[dg.AssetsDefinition]) -> dg.AssetsDefinition | None:
    """The embedding asset that ``asset`` follows when ``asset`` is a vector index asset (its
    ``dagster_gpu/embeddings_asset`` metadata, :func:`dagster_gpu.definitions.vector_index.vector_index_asset`), found among
    ``assets``; None for any other asset. Raises NoCorpus when the embedding asset it names is not among them."""

    md = asset.metadata_by_key.get(asset.key, {})
    name = metadata_get(md, META_EMBEDDINGS)
    if name is None:
        return None
    name = str(name)
    for a in assets:
        if a.key.to_user_string() == name and TAG_CORPUS_URL in (a.op.tags or {}):
            return a
    raise NoCorpus(f"asset {asset.key.to_user_string()} follows {name}, which is not an embedding asset of these definitions")


def index_behind(key: str, embeddings: Mapping[str, int], index: Mapping[str, int]) -> bool:
    """Whether the index partition ``key`` is behind its embeddings: the embeddings partition was materialized
    (``embeddings``: partition key -> its latest materialization's storage id) after the index partition's latest
    materialization (``index``, the same for the index asset), or the index never materialized it. Pure."""
    return key in embeddings and embeddings[key] > index.get(key, -1)


def index_staleness(instance: dg.DagsterInstance, index: dg.AssetsDefinition, embeddings_key: dg.AssetKey) -> Staleness:
    """The registered partitions of the vector index asset ``index`` as they stand behind its embeddings, in the
    definition's order: ``stale`` when the embeddings partition was materialized after the index partition's
    latest materialization, or the index partition never was (why in words); ``missing`` when neither was
    materialized (nothing to load yet); ``in_progress`` left out of both; ``gone`` empty (a deleted file's
    partition is pruned from both assets). Two event-log queries and the status cache."""
    pdef = dynamic_partitions_def(index)
    emb = instance.get_latest_storage_id_by_partition(embeddings_key, dg.DagsterEventType.ASSET_MATERIALIZATION)
    ix = instance.get_latest_storage_id_by_partition(index.key, dg.DagsterEventType.ASSET_MATERIALIZATION)
    in_progress = partition_status(instance, index)[2]
    load_failed = index_load_failures(instance, index.key, ix)
    name = embeddings_key.to_user_string()
    stale, missing, busy = [], [], []
    for k in instance.get_dynamic_partitions(pdef.name):
        if k in in_progress:
            busy.append(k)
        elif index_behind(k, emb, ix):
            why = (f"load failed: {load_failed[k]}" if k in load_failed
                   else f"{name} materialized again after it was indexed" if k in ix else f"{name} materialized, never indexed")
            stale.append(StalePartition(k, (why,)))
        elif k not in emb and k not in ix:
            missing.append(k)
    return Staleness(tuple(stale), tuple(missing), (), tuple(busy))


def index_load_failures(instance: dg.DagsterInstance, index_key: dg.AssetKey,
                        materialized: Mapping[str, int]) -> dict[str, str]:
    """Partition key -> the error of its latest load (the index asset's ``index/load_failed`` observation), for the
    partitions whose latest load failed after their latest materialization (``materialized``: partition key ->
    its storage id). Two event-log queries (one per 500 failures)."""

    latest = instance.get_latest_storage_id_by_partition(index_key, dg.DagsterEventType.ASSET_OBSERVATION)
    ids = sorted(i for k, i in latest.items() if i > materialized.get(k, -1))
    out: dict[str, str] = {}
    for n in range(0, len(ids), 500):
        chunk = ids[n:n + 500]
        for rec in instance.fetch_observations(dg.AssetRecordsFilter(asset_key=index_key, storage_ids=chunk),
                                               limit=len(chunk)).records:
            obs = rec.event_log_entry.asset_observation
            why = metadata_get(obs.metadata, LOAD_FAILED_KEY) if obs is not None and obs.partition else None
            if why is not None:
                out[obs.partition] = str(metadata_value(why))
    return out


def stale_index_partitions(instance: dg.DagsterInstance, index: dg.AssetsDefinition, embeddings_key: dg.AssetKey) -> list[str]:
    """The keys of :func:`index_staleness`'s stale partitions: those ``dagster-gpu backfill --stale`` loads."""
    return index_staleness(instance, index, embeddings_key).stale_keys


def corpus_of(asset: dg.AssetsDefinition, module: ModuleType | None = None) -> CorpusSource:
    """The CorpusSource the asset was built from (looked up in ``module`` by URL), else a plain one on its URL
    (with the asset's ``shard_bytes``, op tag ``dagster-gpu/shard-bytes``, and ``group_buckets``, op tag
    ``dagster-gpu/group-buckets``); either with the asset's own ``id_column`` / ``carry_columns``
    (:func:`with_asset_columns`: ``EmbeddingSpec``'s, which ``embedding_asset`` puts in its copy of the corpus's
    TextFormat)."""
    url = corpus_url_of(asset)
    for value in vars(module).values() if module else ():
        if isinstance(value, CorpusSource) and value.url == url:
            return with_asset_columns(asset, value)
    shard_bytes = (asset.op.tags or {}).get(TAG_SHARD_BYTES)
    buckets = (asset.op.tags or {}).get(TAG_GROUP_BUCKETS)
    return with_asset_columns(asset, CorpusSource(url=url, shard_bytes=int(shard_bytes) if shard_bytes else None,
                                                  group_buckets=int(buckets) if buckets else None))


def with_asset_columns(asset: dg.AssetsDefinition, corpus: CorpusSource) -> CorpusSource:
    """``corpus`` with the ``id_column`` and ``carry_columns`` of the embedding asset's definition metadata
    (``dagster_gpu/config``'s ``columns``: :func:`dagster_gpu.embedding.fingerprint.output_columns`) in its
    TextFormat, when they differ; ``corpus`` itself when the asset records none."""
    import dataclasses


    config = metadata_values(asset.metadata_by_key.get(asset.key, {})).get(CONFIG_METADATA_KEY)
    columns = config.get("columns") if isinstance(config, Mapping) else None
    fmt = corpus.text_format
    if not columns or (columns.get("id_column"), tuple(columns.get("carry_columns") or ())) == (
            fmt.id_column, tuple(fmt.carry_columns or ())):
        return corpus
    return dataclasses.replace(corpus, text_format=dataclasses.replace(
        fmt, id_column=columns.get("id_column"), carry_columns=tuple(columns.get("carry_columns") or ())))


def register_corpus_files(instance: dg.DagsterInstance, asset: dg.AssetsDefinition, corpus: CorpusSource,
                          files: Iterable[CorpusFile] | None = None) -> list[str]:
    """Add a dynamic partition of ``asset`` for each corpus file not yet one; returns the keys added.
    ``files``: the corpus listing when the caller has just made it.

    Raises CorpusNotFound when the corpus URL does not exist, TypeError when the asset's partitions
    are not dynamic.
    """
    pdef = dynamic_partitions_def(asset)
    known = set(instance.get_dynamic_partitions(pdef.name))
    new = [f.key for f in (corpus.list_files(members=False) if files is None else files) if f.key not in known]
    if new:
        instance.add_dynamic_partitions(pdef.name, new)
    return new


def prune_deleted_files(instance: dg.DagsterInstance, asset: dg.AssetsDefinition, corpus: CorpusSource) -> list[str]:
    """Delete the dynamic partitions of ``asset`` whose corpus file is gone (deleted or renamed), except
    those with a run in progress; returns the keys deleted. Their materializations and outputs stay
    (:func:`prune_partitions` with ``delete_outputs`` removes the outputs too).

    Raises CorpusNotFound when the corpus URL does not exist, TypeError when the asset's partitions
    are not dynamic.
    """
    return [p.partition_key for p in prune_partitions(instance, asset, corpus) if p.error is None]


def gone_partitions(instance: dg.DagsterInstance, asset: dg.AssetsDefinition, files: Iterable[CorpusFile]) -> list[str]:
    """The registered partition keys of ``asset`` (in registration order) that the corpus listing ``files`` no
    longer has: their file was deleted or renamed; :func:`prune_partitions` deletes them.

    Raises TypeError when the asset's partitions are not dynamic."""
    present = {f.key for f in files}
    return [k for k in instance.get_dynamic_partitions(dynamic_partitions_def(asset).name) if k not in present]


@dataclass(frozen=True)
class Pruned:
    """One partition of a deleted file: the outputs deleted (URIs), the index rows deleted (index
    description -> rows), and the error that kept it registered (None: its dynamic partition was deleted)."""

    partition_key: str
    outputs: tuple[str, ...] = ()
    index_rows: tuple[tuple[str, int], ...] = ()
    error: str | None = None

    def describe(self) -> str:
        """``partition 'k': output s3://…/k.parquet deleted, 12 row(s) deleted from VectorIndex(…)`` (one line)."""
        if self.error:
            return f"partition {self.partition_key!r}: kept: {self.error}"
        done = [f"output {u} deleted" for u in self.outputs]
        done += [f"{n} row(s) deleted from {ix}" for ix, n in self.index_rows]
        return f"partition {self.partition_key!r}: " + (", ".join(done) if done else "no output") + "; partition removed"


def indexes_following(assets: Iterable[dg.AssetsDefinition], asset_key: dg.AssetKey) -> list[Any]:
    """The vector indexes (:class:`dagster_gpu.index.lance.VectorIndex`) of the index assets that follow
    ``asset_key`` (their ``dagster_gpu/embeddings_asset`` metadata), opened as ``dagster-gpu search`` opens
    them (object-store credentials from the environment)."""

    out, seen = [], set()
    for a in assets:
        for k, md in a.metadata_by_key.items():
            md = metadata_values(md)
            if md.get(META_EMBEDDINGS) == asset_key.to_user_string() and (md[META_URI], md[META_TABLE]) not in seen:
                seen.add((md[META_URI], md[META_TABLE]))
                out.append(VectorIndex(md[META_URI], md[META_TABLE]))
    return out


def prune_partitions(
    instance: dg.DagsterInstance,
    asset: dg.AssetsDefinition,
    corpus: CorpusSource,
    *,
    delete_outputs: bool = False,
    indexes: Iterable[Any] = (),
    output_storage_options: Mapping[str, Any] | None = None,
    files: Iterable[CorpusFile] | None = None,
) -> list[Pruned]:
    """Delete the dynamic partitions of ``asset`` whose corpus file is gone, except those with a run in
    progress; with ``delete_outputs``, first each one's rows in ``indexes`` (``VectorIndex.delete_partition``)
    and its output parquet file(s) (:func:`dagster_gpu.embedding.outputs.locate_output` under the asset's
    ``dagster_gpu/output_url``, either naming rule; fsspec with ``output_storage_options``). Nothing of any
    other partition is touched. A partition whose deletion fails stays registered (``Pruned.error``), so the
    next prune tries again; the others go on. ``files``: the corpus listing when the caller has just made it.

    Raises CorpusNotFound when the corpus URL does not exist, CorpusUnreadable when its store refuses,
    TypeError when the asset's partitions are not dynamic, ValueError when ``delete_outputs`` and the asset
    has no ``dagster_gpu/output_url`` metadata.
    """
    pdef = dynamic_partitions_def(asset)
    gone = gone_partitions(instance, asset, corpus.list_files(members=False) if files is None else files)
    if gone:
        in_progress = partition_status(instance, asset)[2]
        gone = [k for k in gone if k not in in_progress]
    output_url = _output_url(asset) if delete_outputs and gone else None
    indexes = list(indexes) if delete_outputs else []
    out: list[Pruned] = []
    for k in gone:
        outputs: list[str] = []
        rows: list[tuple[str, int]] = []
        try:
            for ix in indexes:
                rows.append((repr(ix), int(ix.delete_partition(k))))
            if output_url is not None:
                outputs = _delete_outputs(output_url, asset.key.path[-1], k, output_storage_options)
        except Exception as e:  # noqa: BLE001 - this partition stays registered; the others are pruned
            out.append(Pruned(k, tuple(outputs), tuple(rows), f"{type(e).__name__}: {e}"))
            log.warning("partition %r of %s not pruned: %s", k, asset.key.to_user_string(), e)
            continue
        instance.delete_dynamic_partition(pdef.name, k)
        out.append(Pruned(k, tuple(outputs), tuple(rows)))
    return out


def _output_url(asset: dg.AssetsDefinition) -> str:
    md = asset.metadata_by_key.get(asset.key, {})
    url = md.get("dagster_gpu/output_url")
    if url is None:
        raise ValueError(f"asset {asset.key.to_user_string()} has no dagster_gpu/output_url metadata: not made by embedding_asset")
    return str(metadata_value(url))


def _delete_outputs(output_url: str, asset_name: str, key: str, storage_options: Mapping[str, Any] | None) -> list[str]:
    """Delete the partition's output file(s) (the current name, then an earlier ``<key>.parquet``); their URIs."""
    import fsspec

    deleted: list[str] = []
    opts = dict(storage_options or {})
    while (uri := locate_output(output_url, asset_name, key, opts)) is not None and uri not in deleted:
        fs, path = fsspec.core.url_to_fs(uri, **opts)
        fs.rm_file(path)
        deleted.append(uri)
    return deleted


def partition_staleness(instance: dg.DagsterInstance, asset: dg.AssetsDefinition, corpus: CorpusSource,
                        files: Iterable[CorpusFile] | None = None) -> Staleness:
    """:func:`dagster_gpu.partitions.stale.find_stale` of ``asset``'s registered partitions: the corpus listing's source
    versions, each partition's latest materialization (:func:`dagster_gpu.partitions.source_versions.recorded_versions`),
    the asset's code version, the partitions in progress (``files``: the listing when the caller has just made
    it). Raises CorpusNotFound / CorpusUnreadable for the corpus, TypeError when the asset's partitions are not
    dynamic."""
    pdef = dynamic_partitions_def(asset)
    keys = list(instance.get_dynamic_partitions(pdef.name))
    current = {f.key: f.version for f in (corpus.list_files(members=False) if files is None else files)}
    recorded = recorded_versions(instance, asset.key)
    _, failed, in_progress = partition_status(instance, asset)

    config = metadata_get(asset.metadata_by_key.get(asset.key, {}), CONFIG_METADATA_KEY)
    config = dict(config) if isinstance(config, Mapping) else None
    older = {k: (r.output_uri, r.timestamp) for k, r in recorded.items()  # outputs that recorded no columns
             if config and "columns" in config and r.config is not None and "columns" not in r.config and r.output_uri}
    return find_stale(keys, current, recorded, asset.code_versions_by_key.get(asset.key), in_progress,
                      config=config, file_columns=output_file_columns(older),
                      failed=failed - set(recorded))


def output_file_columns(uris: Mapping[str, tuple[str, float | None]]) -> dict[str, dict]:
    """Partition key -> :func:`dagster_gpu.embedding.fingerprint.columns_of_schema` of its output file
    (``uris[key]``: its URI and its materialization's timestamp; the parquet footer only, through fsspec without
    options); a file that cannot be read is left out (its columns are then not compared). Each (URI, timestamp)
    is read once per process: a sensor asking every tick reads an output again only once it was rewritten."""
    out: dict[str, dict] = {}
    for key, (uri, stamp) in uris.items():
        try:
            out[key] = _columns_at(uri, stamp)
        except Exception as e:  # noqa: BLE001 - unknown columns are not compared (a failed read is not cached)
            log.info("stale: columns of %s not read (%s: %s)", uri, type(e).__name__, e)
    return out


@functools.lru_cache(maxsize=65536)
def _columns_at(uri: str, stamp: float | None) -> dict:
    import fsspec
    import pyarrow.parquet as pq

    fixed = {w.DOC_ID_COLUMN, w.ID_COLUMN, w.CHUNK_COLUMN, w.CHAR_START_COLUMN, w.CHAR_END_COLUMN, w.TOKENS_COLUMN,
             w.HASH_COLUMN, w.RECORD_HASH_COLUMN, w.TEXT_COLUMN, w.VECTOR_COLUMN}
    fs, path = fsspec.core.url_to_fs(uri)
    with fs.open(path, "rb") as f:
        return columns_of_schema(pq.ParquetFile(f).schema_arrow.names, fixed)


def select_partitions(
    instance: dg.DagsterInstance, asset: dg.AssetsDefinition, *, missing: bool = False, failed: bool = False,
    stale: bool = False, corpus: CorpusSource | None = None, follows: dg.AssetsDefinition | None = None,
) -> list[str]:
    """Registered partition keys of ``asset`` (in registration order): all of them when no flag is
    set; else those never materialized (``missing``) and/or failed as the UI's partitions view shows them
    (``failed``: their latest run failed without materializing them; a canceled run leaves them missing)
    and/or stale (``stale``: :func:`partition_staleness` against ``corpus``, default :func:`corpus_of`; for a
    vector index asset following the embedding asset ``follows``, :func:`stale_index_partitions`),
    none in progress."""
    keys = list(instance.get_dynamic_partitions(asset.partitions_def.name))
    if not (missing or failed or stale):
        return keys
    status = partition_status(instance, asset)
    if stale and follows is not None:
        stale_keys = set(stale_index_partitions(instance, asset, follows.key))
    else:
        stale_keys = set(partition_staleness(instance, asset, corpus or corpus_of(asset)).stale_keys) if stale else set()
    due = set(missing_or_failed(keys, status, missing=missing, failed=failed))
    return [k for k in keys if k in due or (k in stale_keys and k not in status[2])]



def bridged_selection(instance: dg.DagsterInstance, asset: dg.AssetsDefinition, keys: Sequence[str],
                      corpus: CorpusSource | None = None) -> list[str]:
    """``keys`` plus the materialized keys between them that one unit redoes more cheaply than a second unit
    starts (:func:`dagster_gpu.policy.batching.bridge_ranges` with :func:`dagster_gpu.partitions.unit_cost.unit_cost`),
    so the backfill's multi-run policy makes one ranged run where the scattered keys alone would make
    several; in the definition's order. The corpus (default :func:`corpus_of`) is listed once for the sizes;
    a corpus that cannot be listed bridges nothing. TypeError when the asset's partitions are not dynamic."""
    if len(keys) < 2:
        return list(keys)
    all_keys = list(instance.get_dynamic_partitions(dynamic_partitions_def(asset).name))
    try:
        files = (corpus or corpus_of(asset)).list_files(members=False)
    except (CorpusNotFound, CorpusUnreadable, NoCorpus):
        return list(keys)
    fine = bridgeable(files, partition_status(instance, asset))
    ranges = bridge_ranges(all_keys, keys, max_partitions_per_run(asset), bridgeable=fine, cost=unit_cost(instance, asset))
    return [k for r in ranges for k in r]
