"""How much work to put in one work unit (pure): the sensor's hold-or-request decision and the bridging of
scattered partitions into one ranged run.

A work unit pays its start-up once (a fresh interpreter, the imports, the model; on a GPU node CUDA too), then
each partition's own overhead (open, read, write, one event) and its embedding. Its **useful fraction** is
embedding seconds ÷ billed seconds (the vocabulary of ``shared/DESIGN.md``), counted as the unit counts it in
``embedding/useful_fraction``: a partition's read + embed + write seconds over the unit's wall seconds, so a
partition's own overhead is on the useful side and the start-up is not::

    useful(files) = (E + n · per_partition_s) / (startup_s + n · per_partition_s + E),   E = seconds_per_byte · Σ bytes

``startup_s`` and ``per_partition_s`` come from the measured unit calibration (``dagster_gpu/data/unit_startup.json``,
written by ``bench/unit_startup.py``); ``seconds_per_byte`` from the runtime model learned from the asset's
earlier materializations (:class:`dagster_gpu.policy.runtime.RuntimeModel`: ``rows_per_byte / texts_per_second``
on the device the step will get).

- :func:`hold_decision`: the corpus sensor's freshness knob: hold the files due until a unit over them reaches
  ``target_useful_fraction`` or the oldest has waited ``max_delay_s``.
- :func:`bridge_ranges`: runs over contiguous ranges of the selected keys, two neighbouring ranges merged into
  one run over the keys between them too when those are fine to redo (materialized, their file present, no
  run in flight) and redoing them costs less than the start-up the merge saves. The cost of a bridged key
  is priced as a full embedding of its file (an upper bound: an unchanged file re-embedded under the same
  fingerprint reuses every vector, :mod:`dagster_gpu.embedding.reuse`, and costs its read and write only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence


@dataclass(frozen=True)
class UnitCost:
    """What one work unit costs, in billed seconds.

    Attributes:
        startup_s: once per unit (>= 0).
        per_partition_s: per partition, beyond its embedding (>= 0).
        seconds_per_byte: embedding seconds per corpus byte (> 0).
        source: where the figures come from (one line, for the tick's message).

    Raises:
        ValueError: a negative figure, or ``seconds_per_byte`` <= 0.
    """

    startup_s: float
    per_partition_s: float
    seconds_per_byte: float
    source: str = ""

    def __post_init__(self) -> None:
        if self.startup_s < 0 or self.per_partition_s < 0:
            raise ValueError(f"UnitCost: start-up and per-partition seconds must be >= 0, got {self.startup_s}, {self.per_partition_s}")
        if not self.seconds_per_byte > 0:
            raise ValueError(f"UnitCost: seconds_per_byte must be > 0, got {self.seconds_per_byte}")

    def embedding_s(self, nbytes: float) -> float:
        """Expected embedding seconds of ``nbytes`` corpus bytes."""
        return self.seconds_per_byte * max(0.0, float(nbytes))

    def useful_fraction(self, sizes: Sequence[int]) -> float:
        """Useful fraction (0-1) of one unit over files of ``sizes`` bytes (module docstring); 0.0 for none."""
        if not sizes:
            return 0.0
        work = self.embedding_s(sum(sizes)) + len(sizes) * self.per_partition_s
        billed = self.startup_s + work
        return work / billed if billed > 0 else 1.0


@dataclass(frozen=True)
class Held:
    """One file the sensor holds: its partition key, source version, size (bytes) and when it was first
    found due (epoch seconds)."""

    key: str
    version: str
    size_bytes: int
    since: float


@dataclass(frozen=True)
class HoldDecision:
    """``release``: request the held files now; ``why``: the tick's sentence; ``useful_fraction``: of a unit now."""

    release: bool
    why: str
    useful_fraction: float


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 100_000 else f"{nbytes / 1e3:.1f} kB"


def hold_decision(held: Sequence[Held], now: float, cost: UnitCost, target_useful_fraction: float,
                  max_delay_s: float) -> HoldDecision:
    """Release the ``held`` files when one unit over them would be at least ``target_useful_fraction`` useful
    (:meth:`UnitCost.useful_fraction`), or the oldest has waited ``max_delay_s`` seconds; else hold them.

    ``why`` reads e.g. ``held 3 files, 1.2 MB: a unit now would be 9 % useful (target 50 %); oldest waited
    40 s of 300``. Raises ValueError for ``held`` empty, a target outside (0, 1] or a negative delay."""
    if not held:
        raise ValueError("hold_decision: nothing held")
    if not 0 < target_useful_fraction <= 1:
        raise ValueError(f"target_useful_fraction must be in (0, 1], got {target_useful_fraction}")
    if max_delay_s < 0:
        raise ValueError(f"max_delay_seconds must be >= 0, got {max_delay_s}")
    sizes = [h.size_bytes for h in held]
    uf = cost.useful_fraction(sizes)
    waited = max(0.0, now - min(h.since for h in held))
    files = f"{len(held)} file{'s' if len(held) != 1 else ''}, {_mb(sum(sizes))}"
    state = f"a unit now would be {uf * 100:.0f} % useful (target {target_useful_fraction * 100:.0f} %); " \
            f"oldest waited {waited:.0f} s of {max_delay_s:.0f}"
    if uf >= target_useful_fraction:
        return HoldDecision(True, f"requested {files}: {state}", uf)
    if waited >= max_delay_s:
        return HoldDecision(True, f"requested {files} (max delay reached): {state}", uf)
    return HoldDecision(False, f"held {files}: {state}", uf)


def _contiguous(all_keys: Sequence[str], selected: set[str]) -> list[list[str]]:
    out: list[list[str]] = []
    cur: list[str] = []
    for k in all_keys:
        if k in selected:
            cur.append(k)
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def bridge_ranges(
    all_keys: Sequence[str],
    selected: Sequence[str] | set[str],
    max_per_run: int,
    *,
    bridgeable: Mapping[str, int] | None = None,
    cost: UnitCost | None = None,
) -> list[tuple[str, ...]]:
    """The ``selected`` keys as runs over ranges of consecutive keys of ``all_keys`` (the definition's order),
    each at most ``max_per_run`` long.

    Without ``cost`` (or ``bridgeable``) a key not selected ends a range (as
    :func:`dagster_gpu.instance.run_ranges.contiguous_ranges`). With them, two neighbouring ranges become one when every key
    between them is in ``bridgeable`` (key -> its file's bytes: safe to redo) and redoing those keys costs less
    than a unit's start-up: ``Σ (per_partition_s + seconds_per_byte · bytes) < startup_s`` (module docstring),
    and the merged run stays within ``max_per_run``. Merges are made left to right. Raises ValueError if
    ``max_per_run`` < 1.
    """
    if max_per_run < 1:
        raise ValueError(f"max_per_run must be >= 1, got {max_per_run}")
    chosen = set(selected)
    groups = _contiguous(all_keys, chosen)
    if cost is not None and bridgeable is not None and len(groups) > 1:
        index = {k: i for i, k in enumerate(all_keys)}
        merged: list[list[str]] = [groups[0]]
        for g in groups[1:]:
            prev = merged[-1]
            gap = list(all_keys[index[prev[-1]] + 1: index[g[0]]])
            extra = sum(cost.per_partition_s + cost.embedding_s(bridgeable.get(k, 0)) for k in gap)
            if (all(k in bridgeable for k in gap) and extra < cost.startup_s
                    and len(prev) + len(gap) + len(g) <= max_per_run):
                prev.extend(gap + g)
            else:
                merged.append(g)
        groups = merged
    out: list[tuple[str, ...]] = []
    for g in groups:
        for i in range(0, len(g), max_per_run):
            out.append(tuple(g[i: i + max_per_run]))
    return out


@dataclass(frozen=True)
class TricklePlan:
    """What a trickle of files costs under the corpus sensor: ``files_per_unit``, ``units_per_day``,
    ``useful_fraction`` (0-1), ``billed_s_per_day`` (device seconds), ``cost_usd_per_day``, and the mean
    freshness ``freshness_mean_s`` (a file written -> its unit ended)."""

    files_per_unit: int
    units_per_day: float
    useful_fraction: float
    billed_s_per_day: float
    cost_usd_per_day: float
    freshness_mean_s: float


def trickle(every_s: float, file_bytes: int, cost: UnitCost, *, rate_usd_per_hour: float, tick_s: float = 30.0,
            max_delay_s: float | None = None, target_useful_fraction: float = 0.5) -> TricklePlan:
    """Price a steady trickle: one file of ``file_bytes`` every ``every_s`` seconds, a sensor ticking every
    ``tick_s``, the freshness knob ``max_delay_s`` (None: off) at ``target_useful_fraction``; one device billed at
    ``rate_usd_per_hour``.

    Model (steady state, deterministic arrivals): a tick finds ``k = max(1, round(tick_s / every_s))`` files.
    Knob off: each unit takes those ``k``. Knob on: a unit takes ``n = max(k, min(n_target, n_delay))`` files,
    ``n_target`` the fewest whose unit reaches the target (:meth:`UnitCost.useful_fraction`), ``n_delay = floor(
    max_delay_s / every_s) + 1`` those arrived while the first waits out its delay. Units per day = 86,400 /
    (n · every_s); billed seconds per unit = startup + n · per_partition + embedding; freshness mean =
    (n − 1) · every_s / 2 + tick_s / 2 + the unit's billed seconds (queueing and daemon latency not modelled).
    Raises ValueError for a non-positive interval or size."""
    if every_s <= 0 or tick_s <= 0 or file_bytes <= 0:
        raise ValueError(f"trickle: every_s, tick_s and file_bytes must be > 0, got {every_s}, {tick_s}, {file_bytes}")
    k = max(1, round(tick_s / every_s))
    n = k
    if max_delay_s is not None:
        n_delay = int(max_delay_s // every_s) + 1
        n_target = n_delay
        for i in range(1, n_delay + 1):
            if cost.useful_fraction([file_bytes] * i) >= target_useful_fraction:
                n_target = i
                break
        n = max(k, min(n_target, n_delay))
    unit_s = cost.startup_s + n * cost.per_partition_s + cost.embedding_s(n * file_bytes)
    units = 86_400.0 / (n * every_s)
    billed = units * unit_s
    return TricklePlan(n, units, cost.useful_fraction([file_bytes] * n), billed, billed * rate_usd_per_hour / 3600.0,
                       (n - 1) * every_s / 2 + tick_s / 2 + unit_s)
