"""The partition keys a run covers: one (``dagster/partition``) or a range of a dynamic partitions
definition (``dagster/asset_partition_range_start`` / ``_end``, as ``BackfillPolicy.multi_run`` makes), and how
many one run may cover (:func:`max_partitions_per_run`)."""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence

import dagster as dg
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    PARTITION_NAME_TAG,
)


class DynamicPartitionsStore(Protocol):
    def get_dynamic_partitions(self, partitions_def_name: str) -> Sequence[str]: ...


class PartitionRangeError(ValueError):
    """A run's partition range names keys that are not (or no longer) partitions; the message names them."""


def range_tags(tags: Mapping[str, str]) -> tuple[str, str] | None:
    """(start, end) of a ranged run's tags, else None."""
    start, end = tags.get(ASSET_PARTITION_RANGE_START_TAG), tags.get(ASSET_PARTITION_RANGE_END_TAG)
    return (start, end) if start is not None and end is not None else None


def keys_in_range(all_keys: Sequence[str], start: str, end: str) -> tuple[str, ...]:
    """The keys from ``start`` to ``end`` inclusive, in the definition's order (pure).
    Raises PartitionRangeError when either end is missing or ``end`` comes before ``start``."""
    index = {k: i for i, k in enumerate(all_keys)}
    missing = [k for k in (start, end) if k not in index]
    if missing:
        raise PartitionRangeError(f"partition range {start}…{end}: {', '.join(missing)} not a partition (deleted?)")
    i, j = index[start], index[end]
    if j < i:
        raise PartitionRangeError(f"partition range {start}…{end}: the end comes before the start")
    return tuple(all_keys[i : j + 1])


def run_partition_keys(
    store: DynamicPartitionsStore, tags: Mapping[str, str], partitions_def_name: str | None
) -> tuple[str, ...]:
    """Every partition key of a run with ``tags``: ``(key,)`` for a single-partition run, the range's keys
    (resolved in ``partitions_def_name``) for a ranged run, ``()`` for an unpartitioned run."""
    if PARTITION_NAME_TAG in tags:
        return (tags[PARTITION_NAME_TAG],)
    r = range_tags(tags)
    if r is None:
        return ()
    if r[0] == r[1]:
        return (r[0],)
    if not partitions_def_name:
        raise PartitionRangeError(f"partition range {r[0]}…{r[1]}: the asset names no dynamic partitions definition")
    return keys_in_range(store.get_dynamic_partitions(partitions_def_name), *r)


def contiguous_ranges(all_keys: Sequence[str], selected: Sequence[str] | set[str], max_per_run: int) -> list[tuple[str, ...]]:
    """The ``selected`` keys as runs of consecutive keys of ``all_keys`` (the definition's order), each at
    most ``max_per_run`` long (pure). A key between two selected ones that is not selected ends a range,
    so a ranged run never covers a partition that was not asked for. Raises ValueError if ``max_per_run`` < 1."""
    if max_per_run < 1:
        raise ValueError(f"max_per_run must be >= 1, got {max_per_run}")
    chosen = set(selected)
    out: list[tuple[str, ...]] = []
    cur: list[str] = []
    for k in all_keys:
        if k in chosen:
            cur.append(k)
            if len(cur) == max_per_run:
                out.append(tuple(cur))
                cur = []
        elif cur:
            out.append(tuple(cur))
            cur = []
    if cur:
        out.append(tuple(cur))
    return out


def range_run_tags(keys: Sequence[str]) -> dict[str, str]:
    """Run tags for a run over ``keys`` (consecutive): ``dagster/partition`` for one key, the range tags
    ``BackfillPolicy.multi_run`` uses otherwise."""
    if len(keys) == 1:
        return {PARTITION_NAME_TAG: keys[0]}
    return {ASSET_PARTITION_RANGE_START_TAG: keys[0], ASSET_PARTITION_RANGE_END_TAG: keys[-1]}


#: What "unbounded" means for a ``BackfillPolicy.single_run`` asset: more keys than any run holds.
UNBOUNDED_PER_RUN = 2**31 - 1


def max_partitions_per_run(asset: dg.AssetsDefinition) -> int:
    """How many partitions one run of ``asset`` covers at most: its ``BackfillPolicy.multi_run`` limit, 1 without a
    policy (one run per partition, Dagster's default), :data:`UNBOUNDED_PER_RUN` for ``BackfillPolicy.single_run``
    (``max_partitions_per_run`` None)."""
    policy = asset.backfill_policy
    if policy is None:
        return 1
    return policy.max_partitions_per_run or UNBOUNDED_PER_RUN
