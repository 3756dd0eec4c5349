"""Rebuild a vector index asset's LanceDB table from the current outputs of its embeddings, outside a run.

What ``dagster-gpu index --rebuild`` does: the table and its lineage sidecar are dropped, then every registered
partition with a materialization of the embeddings is loaded again from its output (the index asset's own loop,
:func:`dagster_gpu.definitions.vector_index.load_partitions`: the table takes the columns of the outputs as they are
now), its ANN index built as the asset's settings say, and each partition's materialization (runless, with
``index/rebuilt``) or load failure (``index/load_failed``) recorded on the instance. The rows check is not
evaluated (Dagster's event-log storage keeps one runless evaluation per check and partition, ever: a second
rebuild could not record its own); the materialization's ``index/rows`` is the count back.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import dagster as dg

from dagster_gpu.definitions.vector_index import (
    META_SETTINGS,
    META_TABLE,
    META_URI,
    Loaded,
    load_failure,
    load_partitions,
    partition_materialization,
    table_size,
)
from dagster_gpu.embedding.outputs import locate_output
from dagster_gpu.index.lance import DEFAULT_ANN_MIN_ROWS, DEFAULT_MAX_UNINDEXED_FRACTION, VectorIndex
from dagster_gpu.instance.events import metadata_values
from dagster_gpu.partitions.status import dynamic_partitions_def, partition_status


class RebuildRefused(RuntimeError):
    """The rebuild cannot start (a run of the index in progress, no output URL); the message says why."""


@dataclass(frozen=True)
class Rebuilt:
    """What :func:`rebuild_index` did: partitions ``loaded`` and ``failed`` (key -> error), the table's ``rows``,
    its ANN index ``state`` (:meth:`VectorIndex.ensure_ann_index`) and ``size`` (:func:`table_size`)."""

    loaded: tuple[str, ...]
    failed: dict[str, str]
    rows: int
    state: str
    size: dict[str, Any]


def rebuild_index(instance: dg.DagsterInstance, index_asset: dg.AssetsDefinition, embeddings: dg.AssetsDefinition,
                  on_partition: Callable[[Loaded], None] | None = None) -> Rebuilt:
    """Drop ``index_asset``'s table and load every partition of ``embeddings`` that has a materialization from its
    current output (``on_partition``: called after each, e.g. for progress). Searches made meanwhile see the
    partitions loaded so far. Raises RebuildRefused while a run of the index asset is in progress (it would write
    into the table being rebuilt) or when the asset carries no settings (not a ``vector_index_asset``)."""

    md = metadata_values(index_asset.metadata_by_key.get(index_asset.key, {}))
    settings = md.get(META_SETTINGS)
    if not isinstance(settings, dict) or META_URI not in md:
        raise RebuildRefused(f"{index_asset.key.to_user_string()} is not a vector_index_asset (no {META_SETTINGS} metadata)")
    busy = sorted(partition_status(instance, index_asset)[2])
    if busy:
        raise RebuildRefused(f"{len(busy)} partition(s) of {index_asset.key.to_user_string()} have a run in progress "
                             f"({', '.join(busy[:5])}{', …' if len(busy) > 5 else ''}): rebuild once they end")
    index = VectorIndex(md[META_URI], md[META_TABLE])
    emb_name = embeddings.key.path[-1]
    done_keys = instance.get_latest_storage_id_by_partition(embeddings.key, dg.DagsterEventType.ASSET_MATERIALIZATION)
    keys = [k for k in instance.get_dynamic_partitions(dynamic_partitions_def(embeddings).name) if k in done_keys]

    def locate(pk: str) -> str:
        src = locate_output(settings["output_url"], emb_name, pk, None)
        if src is None:
            raise FileNotFoundError(f"no output of {embeddings.key.to_user_string()} for partition {pk!r} under "
                                    f"{settings['output_url']}")
        return src

    for name in (index.table_name, f"{index.table_name}__fingerprints"):
        index.db().drop_table(name, ignore_missing=True)
    loaded: list[Loaded] = []
    failed: dict[str, str] = {}
    for done in load_partitions(index, keys, locate):
        if done.facts is None:
            failed[done.partition_key] = done.error
            instance.report_runless_asset_event(load_failure(index_asset.key, done))
        else:
            loaded.append(done)
        if on_partition is not None:
            on_partition(done)
    cleanup = timedelta(seconds=float(settings.get("cleanup_older_than_s", 600)))
    state = index.ensure_ann_index(int(settings.get("ann_min_rows", DEFAULT_ANN_MIN_ROWS)),
                                   settings.get("ann_kind", "IVF_HNSW_SQ"),
                                   max_unindexed_fraction=float(settings.get("ann_max_unindexed_fraction",
                                                                             DEFAULT_MAX_UNINDEXED_FRACTION)),
                                   max_unindexed_rows=settings.get("ann_max_unindexed_rows"), cleanup_older_than=cleanup)
    index.maintain(settings.get("compact_min_fragments"), cleanup)
    size = table_size(index)
    for i, done in enumerate(loaded):
        instance.report_runless_asset_event(partition_materialization(
            index_asset.key, index, done, {"index/rebuilt": True, **(size if i == len(loaded) - 1 else {})}))
    return Rebuilt(tuple(d.partition_key for d in loaded), failed, index.count_rows(), state, size)
