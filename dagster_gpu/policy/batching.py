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
  ``target_useful_fraction`` or the oldest has waited ``max_delay_s``, unit by unit (at most the run size).
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

    def useful_fraction(self, sizes: Sequence[int], reused_bytes: int = 0) -> float:
        """Useful fraction (0-1) of one unit over files of ``sizes`` bytes (module docstring); 0.0 for none.
        ``reused_bytes``: of those bytes, the ones whose vectors the unit takes from the previous output
        (:mod:`dagster_gpu.embedding.reuse`): they cost no embedding, only their partitions' own overhead."""
        if not sizes:
            return 0.0
        work = self.embedding_s(sum(sizes) - min(max(0, reused_bytes), sum(sizes))) + len(sizes) * self.per_partition_s
        billed = self.startup_s + work
        return work / billed if billed > 0 else 1.0


@dataclass(frozen=True)
class UnitSample:
    """One finished work unit as its materializations tell it: ``partitions``, Σ ``billed_s`` (the measured
    seconds, ``billing/wall_seconds``), Σ ``useful_s`` (``embedding/seconds``) and Σ corpus ``bytes``."""

    partitions: int
    billed_s: float
    useful_s: float
    bytes: int


def learned_overheads(units: Sequence[UnitSample], seconds_per_byte: float) -> tuple[float, float] | None:
    """(``startup_s``, ``per_partition_s``) learned from finished units, or None without any.

    ``startup_s``: the median over units of ``billed_s − useful_s``, what a unit paid beyond its partitions'
    own read, embed and write seconds (its start-up, and its partitions' event writes, which are small).
    ``per_partition_s``: the median over units of ``(useful_s − seconds_per_byte · bytes) / partitions``,
    clipped at 0: a partition's useful seconds that its bytes do not explain (open, read and write of a
    small file). Medians, so one cold start among warm ones (or the reverse) does not move them."""
    units = [u for u in units if u.partitions > 0]
    if not units:
        return None
    from statistics import median

    startup = median(max(0.0, u.billed_s - u.useful_s) for u in units)
    per_partition = median(max(0.0, (u.useful_s - seconds_per_byte * u.bytes) / u.partitions) for u in units)
    return float(startup), float(per_partition)


@dataclass(frozen=True)
class Held:
    """One file the sensor holds: its partition key, source version, size (bytes), when it was first found due
    (epoch seconds) and ``reused_bytes``: the bytes of it expected to be reused rather than embedded (a file that
    was materialized before: the bytes its last materialization read, at most its size; 0 for a new file)."""

    key: str
    version: str
    size_bytes: int
    since: float
    reused_bytes: int = 0


@dataclass(frozen=True)
class HoldDecision:
    """``released``: the held files to request now (oldest first; empty: hold them all); ``kept``: those held on;
    ``units``: the released work units, each the partition keys of one run (held files, and bridged keys that
    are redone, in the run's order), to be requested exactly so; ``unit_fractions``: each released unit's
    useful fraction (0-1), the figures ``why`` gives; ``why``: the tick's sentence; ``useful_fraction``: of the
    first released unit, else of the oldest unit held (0-1)."""

    released: tuple[Held, ...]
    kept: tuple[Held, ...]
    why: str
    useful_fraction: float
    units: tuple[tuple[str, ...], ...] = ()
    unit_fractions: tuple[float, ...] = ()

    @property
    def release(self) -> bool:
        """Whether anything is requested now."""
        return bool(self.released)


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 100_000 else f"{nbytes / 1e3:.1f} kB"


def _files(held: Sequence[Held]) -> str:
    return f"{len(held)} file{'s' if len(held) != 1 else ''}, {_mb(sum(h.size_bytes for h in held))}"


def hold_decision(held: Sequence[Held], now: float, cost: UnitCost, target_useful_fraction: float,
                  max_delay_s: float, max_per_unit: int | None = None, *,
                  units: Sequence[Sequence[str]] | None = None, bridged: Mapping[str, int] | None = None) -> HoldDecision:
    """Which of the ``held`` files to request now, unit by unit, each unit priced as it will run.

    ``units``: the work units the held files would be requested in, each the partition keys of one run (e.g.
    :func:`dagster_gpu.partitions.run_requests.planned_ranges` over them): a unit's keys are held files and
    bridged keys (``bridged``: key -> bytes; a file unchanged since its materialization, redone with every vector
    reused: its partition's overhead counts, its bytes are reuse). None: oldest first, units of at most
    ``max_per_unit`` files (None: one unit). Each unit is released when it would be at least
    ``target_useful_fraction`` useful (:meth:`UnitCost.useful_fraction`, each held file's ``reused_bytes`` and
    every bridged byte counted as reuse) or its oldest file has waited ``max_delay_s`` seconds; the others are
    held on (a short remainder is not run as a unit of its own before its time). The released units are the
    decision's ``units``, to be requested as they are: what is launched is what was priced.

    ``why`` gives the figure of each unit requested, e.g. ``held 3 files, 1.2 MB: a unit now would be 9 % useful
    (target 50 %); oldest waited 40 s of 300``, or ``requested 10 files, 52.1 kB in 1 unit: 56 % useful (target
    50 %); oldest waited 70 s of 120; held on 4 files, 20.3 kB: …``, with ``, 1.1 MB of it reused`` after the
    target where a unit reuses bytes. Raises ValueError for ``held`` empty, a target outside (0, 1], a negative
    delay, ``max_per_unit`` < 1, or ``units`` that leave out a held file or name a key neither held nor bridged."""
    if not held:
        raise ValueError("hold_decision: nothing held")
    if not 0 < target_useful_fraction <= 1:
        raise ValueError(f"target_useful_fraction must be in (0, 1], got {target_useful_fraction}")
    if max_delay_s < 0:
        raise ValueError(f"max_delay_seconds must be >= 0, got {max_delay_s}")
    if max_per_unit is not None and max_per_unit < 1:
        raise ValueError(f"max_per_unit must be >= 1, got {max_per_unit}")
    by_key = {h.key: h for h in held}
    bridged = dict(bridged or {})
    if units is None:
        order = sorted(held, key=lambda h: (h.since, h.key))
        size = max_per_unit or len(order)
        units = [[h.key for h in order[i:i + size]] for i in range(0, len(order), size)]
    units = [tuple(u) for u in units if u]
    unknown = sorted({k for u in units for k in u if k not in by_key and k not in bridged})
    left_out = sorted(set(by_key) - {k for u in units for k in u})
    if unknown or left_out:
        raise ValueError(f"hold_decision: units name keys neither held nor bridged {unknown[:5]} "
                         f"or leave held files out {left_out[:5]}")
    units.sort(key=lambda u: min((by_key[k].since, k) for k in u if k in by_key))

    def price(unit: Sequence[str]) -> tuple[float, float, int]:
        """(useful fraction, seconds its oldest held file waited, bytes reused)."""
        files = [by_key[k] for k in unit if k in by_key]
        sizes = [h.size_bytes for h in files] + [bridged[k] for k in unit if k not in by_key]
        reused = sum(min(h.reused_bytes, h.size_bytes) for h in files) + sum(bridged[k] for k in unit if k not in by_key)
        return cost.useful_fraction(sizes, reused), max(0.0, now - min(h.since for h in files)), reused

    def target(reused: int) -> str:
        return f"target {target_useful_fraction * 100:.0f} %" + (f", {_mb(reused)} of it reused" if reused else "")

    def held_line(files: Sequence[Held], unit: Sequence[str]) -> str:
        uf, waited, reused = price(unit)
        return (f"{_files(files)}: a unit now would be {uf * 100:.0f} % useful ({target(reused)}); "
                f"oldest waited {waited:.0f} s of {max_delay_s:.0f}")

    released, fractions, kept_units = [], [], []
    by_delay = False
    for unit in units:
        uf, waited, _ = price(unit)
        if uf < target_useful_fraction and waited < max_delay_s:
            kept_units.append(unit)
            continue
        by_delay = by_delay or uf < target_useful_fraction
        released.append(unit)
        fractions.append(uf)
    kept = sorted((by_key[k] for u in kept_units for k in u if k in by_key), key=lambda h: (h.since, h.key))
    if not released:
        return HoldDecision((), tuple(kept), f"held {held_line(kept, kept_units[0])}", price(kept_units[0])[0])
    files = sorted((by_key[k] for u in released for k in u if k in by_key), key=lambda h: (h.since, h.key))
    reused = sum(price(u)[2] for u in released)
    why = (f"requested {_files(files)} in {len(released)} unit{'s' if len(released) > 1 else ''}"
           + (" (max delay reached)" if by_delay else "") + ": "
           + ", ".join(f"{uf * 100:.0f} %" for uf in fractions) + f" useful ({target(reused)}); "
           + f"oldest waited {max(0.0, now - files[0].since):.0f} s of {max_delay_s:.0f}")
    if kept:
        why += f"; held on {held_line([by_key[k] for k in kept_units[0] if k in by_key], kept_units[0])}"
        if len(kept_units) > 1:
            why += f" (and {len(kept) - sum(1 for k in kept_units[0] if k in by_key)} file(s) more)"
    return HoldDecision(tuple(files), tuple(kept), why, fractions[0], tuple(released), tuple(fractions))


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
    :func:`dagster_gpu.partitions.run_ranges.contiguous_ranges`). With them, two neighbouring ranges become one when every key
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
            max_delay_s: float | None = None, target_useful_fraction: float = 0.5,
            max_per_unit: int | None = None) -> TricklePlan:
    """Price a steady trickle: one file of ``file_bytes`` every ``every_s`` seconds, a sensor ticking every
    ``tick_s``, the freshness knob ``max_delay_s`` (None: off) at ``target_useful_fraction``; one device billed at
    ``rate_usd_per_hour``; a unit takes at most ``max_per_unit`` files (None: no bound).

    Model (steady state, deterministic arrivals): a tick finds ``k = max(1, round(tick_s / every_s))`` files.
    Knob off: each unit takes those ``k``. Knob on: a unit takes ``n = max(k, min(n_target, n_delay))`` files,
    ``n_target`` the fewest whose unit reaches the target (:meth:`UnitCost.useful_fraction`), ``n_delay = floor(
    max_delay_s / every_s) + 1`` those arrived while the first waits out its delay. Units per day = 86,400 /
    (n · every_s); billed seconds per unit = startup + n · per_partition + embedding; freshness mean =
    (n − 1) · every_s / 2 + tick_s / 2 + the unit's billed seconds (queueing and daemon latency not modelled).
    Raises ValueError for a non-positive interval or size."""
    if max_per_unit is not None and max_per_unit < 1:
        raise ValueError(f"trickle: max_per_unit must be >= 1, got {max_per_unit}")
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
    if max_per_unit is not None:
        n = max(1, min(n, max_per_unit))
    unit_s = cost.startup_s + n * cost.per_partition_s + cost.embedding_s(n * file_bytes)
    units = 86_400.0 / (n * every_s)
    billed = units * unit_s
    return TricklePlan(n, units, cost.useful_fraction([file_bytes] * n), billed, billed * rate_usd_per_hour / 3600.0,
                       (n - 1) * every_s / 2 + tick_s / 2 + unit_s)
