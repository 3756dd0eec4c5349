"""Whether the vector indexes following an embedding asset have caught up with a backfill, read from the instance.

An index asset (:func:`dagster_gpu.definitions.vector_index.vector_index_asset`) is current for a partition when its
latest materialization is newer (a higher event storage id) than the embeddings partition's latest one: the same
rule as ``dagster-gpu stale -a INDEX`` (:func:`dagster_gpu.definitions.partitions.index_staleness`). Whatever
requests the index's runs (an automation condition sensor, one run per partition or a batch, a hand-run backfill),
this state is what ``dagster-gpu backfill`` waits on before it stops its daemon: no guess about sensor ticks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import dagster as dg

from dagster_gpu.definitions.partitions import index_behind, index_load_failures
from dagster_gpu.definitions.vector_index import META_EMBEDDINGS
from dagster_gpu.instance.events import metadata_get


@dataclass(frozen=True)
class IndexLag:
    """One index asset behind its embeddings, for the partitions a backfill materialized.

    Attributes:
        index: the index asset's key, '/'-separated.
        behind: partitions whose embeddings were materialized after the index's latest materialization of them
            (or that it never materialized), their latest load not failed.
        failed: partition -> the error of its latest load, for those whose load failed since their embeddings'
            materialization (the index asset's ``index/load_failed`` observation).
        automated: the index asset has an automation condition (something may request its runs by itself).
    """

    index: str
    behind: tuple[str, ...] = ()
    failed: dict[str, str] = field(default_factory=dict)
    automated: bool = True

    @property
    def current(self) -> bool:
        """No partition behind (failed loads are not waited for: they are reported)."""
        return not self.behind


def index_assets_following(defs: dg.Definitions, embeddings_key: dg.AssetKey) -> list[dg.AssetsDefinition]:
    """The vector index assets of ``defs`` whose ``dagster_gpu/embeddings_asset`` metadata names ``embeddings_key``,
    in the asset graph's order."""
    name = embeddings_key.to_user_string()
    return [a for a in defs.resolve_asset_graph().assets_defs
            if str(metadata_get(a.metadata_by_key.get(a.key, {}), META_EMBEDDINGS)) == name]


def index_lag(instance: dg.DagsterInstance, index: dg.AssetsDefinition, embeddings_key: dg.AssetKey,
              partition_keys: Sequence[str]) -> IndexLag:
    """``index``'s state behind ``embeddings_key`` for ``partition_keys`` (those not materialized by the embeddings
    are left out). Three event-log queries."""
    emb = instance.get_latest_storage_id_by_partition(embeddings_key, dg.DagsterEventType.ASSET_MATERIALIZATION)
    ix = instance.get_latest_storage_id_by_partition(index.key, dg.DagsterEventType.ASSET_MATERIALIZATION)
    behind = [k for k in partition_keys if index_behind(k, emb, ix)]
    failures = index_load_failures(instance, index.key, ix) if behind else {}
    failed = {k: failures[k] for k in behind if k in failures}
    return IndexLag(index.key.to_user_string(), tuple(k for k in behind if k not in failed), failed,
                    automated=index.automation_conditions_by_key.get(index.key) is not None)


def wait_for_indexes(lags: Callable[[], list[IndexLag]], *, timeout_s: float, poll_s: float = 2.0,
                     alive: Callable[[], bool] | None = None) -> list[IndexLag]:
    """``lags()`` polled every ``poll_s`` seconds until every automated index is current, ``timeout_s`` seconds
    passed or ``alive()`` (the daemon whose sensors would request the index's runs) is False; returns the last
    ``lags()``. An index without an automation condition is not waited for (nothing requests its runs)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = lags()
        if all(g.current or not g.automated for g in got):
            return got
        if time.monotonic() >= deadline or (alive is not None and not alive()):
            return got
        time.sleep(poll_s)


def lag_lines(lags: Sequence[IndexLag], waited_s: float, daemon_gone: bool, code_location: str) -> list[str]:
    """What the console says of each index not current after the wait (none for a current one): how many
    partitions are behind (a few named), why (no automation condition; the daemon gone; not loaded within
    ``waited_s`` seconds of ``--runs-wait``), each failed load with its error, and the command that loads them
    (``code_location``: the command's ``-m`` arguments). Pure."""
    out = []
    for g in lags:
        fix = f"load them: dagster-gpu backfill {code_location} -a {g.index} --stale"
        if g.behind:
            few = ", ".join(g.behind[:5]) + (" …" if len(g.behind) > 5 else "")
            why = ("it has no automation condition (automation_condition=None: only backfills load it)" if not g.automated
                   else "the dagster-daemon stopped before it loaded them" if daemon_gone
                   else f"no run loaded them within {waited_s:.0f} s (--runs-wait; is its automation condition sensor, "
                        f"e.g. index_automation_sensor, running?)")
            out.append(f"Index {g.index} is behind its embeddings for {len(g.behind)} partition(s) ({few}): {why}; "
                       f"search answers from their previous rows until then; {fix}")
        if g.failed:
            out.append(f"Index {g.index}: {len(g.failed)} partition(s) failed to load: "
                       + "; ".join(f"{k}: {v}" for k, v in list(g.failed.items())[:5])
                       + (" …" if len(g.failed) > 5 else "") + f"; once fixed, {fix}")
    return out
