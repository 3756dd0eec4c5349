"""Which partitions a ``dagster-gpu backfill`` covers: register the asset's corpus files, then select.

- :func:`corpus_of`: the asset's :class:`CorpusSource` — the one defined in the code location's module
  whose URL is the asset's ``dagster-gpu/corpus-url`` op tag (so its pattern and reader apply), else a
  plain one on that URL.
- :func:`register_corpus_files`: adds a dynamic partition for each corpus file not yet one (what
  ``corpus_sensor`` does each tick), so a new corpus needs no sensor first.
- :func:`select_partitions`: all registered, or the ``missing`` (never materialized) and/or ``failed``
  (latest run failed; a canceled run leaves them missing) ones, as ``backfill_missing_schedule`` computes them
  (:func:`dagster_gpu.sensors.partition_status`, as the UI's partitions view shows them; partitions in
  progress are left out).
"""

from __future__ import annotations

from types import ModuleType

import dagster as dg

from dagster_gpu.corpus.listing import CorpusSource
from dagster_gpu.request import TAG_CORPUS_URL
from dagster_gpu.sensors import dynamic_partitions_def, partition_status


class NoCorpus(ValueError):
    """The asset has no corpus URL (not made by ``embedding_asset``); the message names the asset."""


def corpus_url_of(asset: dg.AssetsDefinition) -> str:
    """The asset's corpus URL from its op tags. Raises NoCorpus."""
    tags = asset.op.tags or {}
    url = tags.get(TAG_CORPUS_URL)
    if not url:
        raise NoCorpus(f"asset {asset.key.to_user_string()} has no op tag {TAG_CORPUS_URL!r}: not made by embedding_asset")
    return url


def corpus_of(asset: dg.AssetsDefinition, module: ModuleType | None = None) -> CorpusSource:
    """The CorpusSource the asset was built from (looked up in ``module`` by URL), else a plain one."""
    url = corpus_url_of(asset)
    for value in vars(module).values() if module else ():
        if isinstance(value, CorpusSource) and value.url == url:
            return value
    return CorpusSource(url=url)


def register_corpus_files(instance: dg.DagsterInstance, asset: dg.AssetsDefinition, corpus: CorpusSource) -> list[str]:
    """Add a dynamic partition of ``asset`` for each corpus file not yet one; returns the keys added.

    Raises CorpusNotFound when the corpus URL does not exist, TypeError when the asset's partitions
    are not dynamic.
    """
    pdef = dynamic_partitions_def(asset)
    known = set(instance.get_dynamic_partitions(pdef.name))
    new = [f.key for f in corpus.list_files() if f.key not in known]
    if new:
        instance.add_dynamic_partitions(pdef.name, new)
    return new


def prune_deleted_files(instance: dg.DagsterInstance, asset: dg.AssetsDefinition, corpus: CorpusSource) -> list[str]:
    """Delete the dynamic partitions of ``asset`` whose corpus file is gone (deleted or renamed), except
    those with a run in progress; returns the keys deleted. Their materializations and outputs stay.

    Raises CorpusNotFound when the corpus URL does not exist, TypeError when the asset's partitions
    are not dynamic.
    """
    pdef = dynamic_partitions_def(asset)
    present = {f.key for f in corpus.list_files()}
    gone = [k for k in instance.get_dynamic_partitions(pdef.name) if k not in present]
    if gone:
        in_progress = partition_status(instance, asset)[2]
        gone = [k for k in gone if k not in in_progress]
    for k in gone:
        instance.delete_dynamic_partition(pdef.name, k)
    return gone


def select_partitions(
    instance: dg.DagsterInstance, asset: dg.AssetsDefinition, *, missing: bool = False, failed: bool = False
) -> list[str]:
    """Registered partition keys of ``asset`` (in registration order): all of them when neither flag is
    set; else those never materialized (``missing``) and/or failed as the UI's partitions view shows them
    (``failed``: their latest run failed without materializing them; a canceled run leaves them missing),
    none in progress."""
    keys = list(instance.get_dynamic_partitions(asset.partitions_def.name))
    if not (missing or failed):
        return keys
    materialized, failed_keys, in_progress = partition_status(instance, asset)
    return [
        k for k in keys
        if k not in in_progress and ((missing and k not in materialized) or (failed and k in failed_keys))
    ]

