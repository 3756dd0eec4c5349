"""Run requests over a selection of an embedding asset's partitions, as a backfill with the asset's
``BackfillPolicy`` would make them: ranges of consecutive keys, at most
:func:`~dagster_gpu.partitions.run_ranges.max_partitions_per_run` each, neighbouring ranges bridged when one unit
over the keys between costs less than a second unit's start-up (:func:`dagster_gpu.policy.batching.bridge_ranges`),
shards of one file apart. The corpus sensor and the missing-partitions schedule both request runs here.
"""

from __future__ import annotations

import hashlib
import json
from typing import Callable, Mapping, Sequence

import dagster as dg

from dagster_gpu.corpus.listing import CorpusFile
from dagster_gpu.partitions.run_ranges import max_partitions_per_run, range_run_tags
from dagster_gpu.policy.batching import UnitCost, bridge_ranges


def versioned_run_requests(asset: dg.AssetsDefinition, all_keys: list[str], files: Sequence[CorpusFile], *,
                           bridgeable: Mapping[str, int] | None = None, cost: UnitCost | None = None,
                           all_files: Sequence[CorpusFile] = (),
                           ranges: Sequence[Sequence[str]] | None = None) -> list[dg.RunRequest]:
    """:func:`ranged_run_requests` over ``files``' keys, each run key prefixed with a hash of its range's
    (key, source version) pairs: a file deleted (``backfill --prune``) and added again under the same name, or
    rewritten, gets a new run, not Dagster's skip of a run key it already ran; the same versions never get two.
    ``bridgeable``, ``cost``: see :func:`ranged_run_requests`; ``all_files``: the listing (the versions of
    bridged keys). Shards of one file (``CorpusFile.file_key``) are never in one run: each goes to a unit of its
    own, so that a large file's shards are embedded side by side. ``ranges``: the runs already planned
    (:func:`planned_ranges`, e.g. as the freshness knob priced them), requested as they are."""
    version = {f.key: (f.version or f"{f.size_bytes}:{f.mtime!r}") for f in [*all_files, *files]}
    apart = shard_groups([*all_files, *files])

    def prefix(keys: Sequence[str]) -> str:
        return hashlib.sha256(json.dumps([(k, version.get(k, "")) for k in keys]).encode()).hexdigest()[:12] + ":"

    return ranged_run_requests(asset, all_keys, [f.key for f in files], run_key_prefix=prefix,
                               bridgeable=bridgeable, cost=cost, apart=apart, ranges=ranges)


def shard_groups(files: Sequence[CorpusFile]) -> dict[str, str]:
    """Key -> its file's key, for the shards among ``files`` (the ``apart`` of :func:`planned_ranges`)."""
    return {f.key: f.file_key for f in files if f.shard is not None}


def planned_ranges(asset: dg.AssetsDefinition, all_keys: list[str], selected: list[str] | set[str], *,
                   bridgeable: Mapping[str, int] | None = None, cost: UnitCost | None = None,
                   apart: Mapping[str, str] | None = None) -> list[tuple[str, ...]]:
    """The runs :func:`ranged_run_requests` makes over ``selected``, each the keys of one run (pure but for the
    asset's ``max_partitions_per_run``): ranges of consecutive keys of ``all_keys``, bridged with ``bridgeable``
    and ``cost`` (:func:`dagster_gpu.policy.batching.bridge_ranges`), cut by ``apart``."""
    ranges = bridge_ranges(all_keys, selected, max_partitions_per_run(asset), bridgeable=bridgeable, cost=cost)
    return [tuple(r) for r in (split_apart(ranges, apart) if apart else ranges)]


def ranged_run_requests(
    asset: dg.AssetsDefinition, all_keys: list[str], selected: list[str] | set[str],
    run_key_prefix: str | Callable[[Sequence[str]], str] = "",
    *,
    bridgeable: Mapping[str, int] | None = None,
    cost: UnitCost | None = None,
    apart: Mapping[str, str] | None = None,
    ranges: Sequence[Sequence[str]] | None = None,
) -> list[dg.RunRequest]:
    """Run requests covering ``selected`` partitions in ranges of consecutive keys, each at most the asset's
    ``max_partitions_per_run`` long, as a backfill with the same policy would make them (run key =
    ``<prefix><first>..<last>``; ``run_key_prefix`` may be a function of the range's keys). With ``bridgeable``
    (key -> bytes of partitions fine to redo) and ``cost``, neighbouring ranges become one run over the keys
    between them when that is cheaper than a second unit (:func:`dagster_gpu.policy.batching.bridge_ranges`).
    ``apart`` (key -> group): a range is cut before a key whose group it already holds (shards of one file).
    ``ranges``: the runs' keys as :func:`planned_ranges` gave them (then ``selected``, ``bridgeable``, ``cost``
    and ``apart`` are not used again)."""
    out = []
    if ranges is None:
        ranges = planned_ranges(asset, all_keys, selected, bridgeable=bridgeable, cost=cost, apart=apart)
    for keys in ranges:
        tags = range_run_tags(keys)
        prefix = run_key_prefix(keys) if callable(run_key_prefix) else run_key_prefix
        run_key = f"{prefix}{keys[0]}..{keys[-1]}"
        if len(keys) == 1:
            out.append(dg.RunRequest(partition_key=keys[0], run_key=run_key))
        else:
            out.append(dg.RunRequest(run_key=run_key, tags=tags))
    return out


def split_apart(ranges: Sequence[Sequence[str]], apart: Mapping[str, str]) -> list[list[str]]:
    """``ranges`` (lists of consecutive keys) cut so that no range holds two keys of one ``apart`` group (pure):
    a range is cut before each key whose group is already in it; keys without a group never cut."""
    out: list[list[str]] = []
    for keys in ranges:
        cur: list[str] = []
        groups: set[str] = set()
        for k in keys:
            g = apart.get(k)
            if g is not None and g in groups:
                out.append(cur)
                cur, groups = [], set()
            cur.append(k)
            if g is not None:
                groups.add(g)
        if cur:
            out.append(cur)
    return out
