"""Which partitions a ``dagster-gpu backfill`` covers: register the asset's corpus files, then select.

- :func:`corpus_of`: the asset's :class:`CorpusSource` — the one defined in the code location's module
  whose URL is the asset's ``dagster-gpu/corpus-url`` op tag (so its pattern and reader apply), else a
  plain one on that URL.
- :func:`register_corpus_files`: adds a dynamic partition for each corpus file not yet one (what
  ``corpus_sensor`` does each tick), so a new corpus needs no sensor first.
- :func:`select_partitions`: all registered, or the ``missing`` (never materialized) and/or ``failed``
  (latest run failed or was canceled) ones, as ``backfill_missing_schedule`` computes them
  (:func:`dagster_gpu.sensors.partitions_to_rerun`; partitions with a run in flight are left out).
"""

from __future__ import annotations

from types import ModuleType

import dagster as dg

from dagster_gpu.corpus.listing import CorpusSource
from dagster_gpu.request import TAG_CORPUS_URL
from dagster_gpu.sensors import partitions_to_rerun


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
    pdef = asset.partitions_def
    if not isinstance(pdef, dg.DynamicPartitionsDefinition):
        raise TypeError(f"asset {asset.key.to_user_string()} must use a DynamicPartitionsDefinition, got {type(pdef).__name__}")
    known = set(instance.get_dynamic_partitions(pdef.name))
    new = [f.key for f in corpus.list_files() if f.key not in known]
    if new:
        instance.add_dynamic_partitions(pdef.name, new)
    return new


def select_partitions(
    instance: dg.DagsterInstance, asset: dg.AssetsDefinition, *, missing: bool = False, failed: bool = False
) -> list[str]:
    """Registered partition keys of ``asset`` (in registration order): all of them when neither flag is
    set; else those never materialized (``missing``) and/or whose latest run failed or was canceled
    (``failed``), none with a run in flight."""
    keys = list(instance.get_dynamic_partitions(asset.partitions_def.name))
    if not (missing or failed):
        return keys
    todo = partitions_to_rerun(instance, asset)
    materialized = instance.get_materialized_partitions(asset.key)
    chosen = {
        k for k, run_id in todo.items()
        if (missing and k not in materialized) or (failed and run_id is not None and _failed(instance, run_id))
    }
    return [k for k in keys if k in chosen]


def _failed(instance: dg.DagsterInstance, run_id: str) -> bool:
    run = instance.get_run_by_id(run_id)
    return run is not None and run.status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
