"""Apportioning one work unit's billed time to the partitions it embedded (pure).

A work unit (one local process, Slurm array task or pod) loads the model once and embeds the partitions
of a ranged step back to back. The scheduler bills the unit as a whole; each partition's materialization
carries its share so that the shares of a unit add up to what the unit billed:

- **measured, in the worker** (:func:`partition_wall_seconds`): partition *i* is billed its own interval on
  the device (from the end of the previous partition, or the end of start-up, to its own end) plus a share of
  the unit's start-up (process start to model loaded) in proportion to its corpus file's bytes among the
  partitions the unit set out to embed. Shares are fixed before the first partition starts, so each
  materialization can be written as soon as its partition ends, and when every partition finishes the shares
  add up to the unit's wall seconds exactly (start-up + the sum of the intervals).
- **scheduler accounting, after the unit** (:func:`split_by_shares`): ``sacct`` or the pod interval gives the
  unit's GPU-seconds; they are split in proportion to the partitions' measured GPU-seconds, and the sum of the
  split equals the scheduler's figure exactly (the last share takes the rounding remainder).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence


def startup_shares(sizes: Mapping[str, int]) -> dict[str, float]:
    """Each partition's fraction (0–1, summing to 1) of a unit's start-up, in proportion to its file's bytes.

    ``sizes``: partition key -> corpus file bytes (unknown or empty files count as 1 byte, so every
    partition pays something). Raises ValueError when ``sizes`` is empty.
    """
    if not sizes:
        raise ValueError("a work unit embeds at least one partition")
    weights = {k: float(max(1, int(v))) for k, v in sizes.items()}
    total = sum(weights.values())
    return {k: w / total for k, w in weights.items()}


def partition_wall_seconds(startup_s: float, share: float, interval_s: float) -> float:
    """Billed wall seconds of one partition: ``share × startup_s + interval_s`` (all in seconds, >= 0).

    Raises ValueError on a negative or non-finite input (no NaN ever reaches metadata)."""
    for name, v in (("startup_s", startup_s), ("share", share), ("interval_s", interval_s)):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be finite and >= 0, got {v!r}")
    return share * startup_s + interval_s


def split_by_shares(total: float, weights: Sequence[tuple[str, float]]) -> list[tuple[str, float]]:
    """Split ``total`` (e.g. a unit's sacct GPU-seconds) over ``weights`` ((partition key, measured
    GPU-seconds), in order) proportionally; equal parts when every weight is 0. The parts add up to
    ``total`` exactly. Raises ValueError on an empty list or a negative/non-finite input."""
    if not weights:
        raise ValueError("nothing to split the bill over")
    if not math.isfinite(total) or total < 0:
        raise ValueError(f"total must be finite and >= 0, got {total!r}")
    for key, w in weights:
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"weight of {key!r} must be finite and >= 0, got {w!r}")
    wsum = sum(w for _, w in weights)
    fracs = [(w / wsum) if wsum > 0 else 1.0 / len(weights) for _, w in weights]
    parts = [total * f for f in fracs[:-1]]
    parts.append(max(0.0, total - sum(parts)))
    return [(k, p) for (k, _), p in zip(weights, parts)]


def apportion_unit_bill(
    total: float, measured: Sequence[tuple[str, float]], failed: Sequence[str]
) -> list[tuple[str, float]]:
    """Split a unit's scheduler-billed GPU-seconds ``total`` over its partitions; the parts add up to ``total``.

    ``measured``: (partition key, measured GPU-seconds) of each partition the unit materialized;
    ``failed``: partitions of the unit that it did not materialize (bad input, killed mid-range).

    - Some failed and the scheduler billed more than was measured: each materialized partition keeps its
      measured figure and the rest (the failed partitions' time, teardown) is split equally over the failed.
    - Otherwise the materialized partitions share ``total`` in proportion to their measured figures (the
      failed get 0); with nothing materialized the failed share it equally.
    Raises ValueError when both lists are empty or a figure is negative/non-finite.
    """
    if not measured and not failed:
        raise ValueError("a unit's bill needs at least one partition")
    if not measured:
        return split_by_shares(total, [(k, 1.0) for k in failed])
    rest = total - sum(v for _, v in measured)
    if failed and rest > 0:
        split_by_shares(total, measured)  # validates the figures
        return [*measured, *split_by_shares(rest, [(k, 1.0) for k in failed])]
    return [*split_by_shares(total, measured), *[(k, 0.0) for k in failed]]
