"""Expected runtime of a partition step, learned from earlier materializations (pure).

Formula (seconds on one full GPU)::

    rows_est  = step.rows                     if the partition's row count is known
              = step.bytes * rows_per_byte    else if its size is (rows_per_byte = median over history of rows / bytes)
              = typical_rows                  else (median rows per materialization in history; a GPU
                                              asset that reads no corpus file has no size to scale by)
    runtime_s = rows_est / texts_per_second   (texts_per_second = median over history)

A ranged step (one work unit embedding several partitions back to back, issue 8) has the size
``StepSize.for_range(parts)``: its ``rows_est`` is the sum of each partition's ``rows_est`` (each
resolved on its own, so one unknown partition costs ``typical_rows``, not the whole range), and the
unit additionally pays ``per_partition_s`` for each partition (open, read, write, event: measured by
``bench/unit_startup.py``) on top of its one start-up (``BackendState.billed_overhead_s``).

On a MIG slice of compute fraction ``f`` the step runs at ``min(1, f / u)`` of the full GPU's speed,
where ``u`` is the median ``gpu/utilization_mean_percent`` / 100 of the history (a step that keeps an
A100 25 % busy loses nothing on a 2g slice, 2/7 ≈ 29 %); with no utilization history ``u = 1`` (the
conservative, compute-bound assumption: runtime scales by ``1 / f``). On CPU the runtime is the GPU
runtime times ``cpu_slowdown`` when there is GPU history but no CPU history; CPU history's own median when
there is some; ``FALLBACK_CPU_TEXTS_PER_SECOND`` when there is no history at all.

Fallback when there is no history (stated, not measured here):

- ``FALLBACK_TEXTS_PER_SECOND = 2000``: a deliberately conservative figure for all-MiniLM-L6-v2 on one
  data-centre GPU (sbert.net's pretrained-model table lists about 14,200 sentences/s for that model on a
  V100; real corpora with longer texts and parquet I/O run far slower).
- ``FALLBACK_CPU_TEXTS_PER_SECOND = 46.3``: measured, not stated: all-MiniLM-L6-v2 through the pipeline on
  this project's 2-core shared CPU host (docs/benchmarks.md, "Throughput against SentenceTransformer.encode on CPU"), the lowest of the
  recorded CPU medians. The GPU figure ÷ 20 (100 texts/s) was 2.3–2.85× too fast for a newcomer's CPU run.
- ``FALLBACK_BYTES_PER_ROW = 200``: a short text plus its parquet/JSONL framing.
- ``FALLBACK_ROWS = 10000``: rows of a partition of unknown size (5 s at the fallback rate), so a step
  of unknown size is priced as a short one rather than refused.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable

FALLBACK_TEXTS_PER_SECOND = 2000.0
#: texts/s on a CPU with no history: docs/benchmarks.md "Throughput against SentenceTransformer.encode on CPU" (bench/embed_throughput.py
#: --device cpu --texts 3000 --batch-size 64 --reps 3): all-MiniLM-L6-v2, 2 torch threads on 2 shared cores,
#: pipeline median 46.3 texts/s (reps 46.3, 53.2, 44.4; the same host quiet gave 127.4, loaded 51.7: the lowest
#: recorded median is taken, as the GPU figure is a conservative one)
FALLBACK_CPU_TEXTS_PER_SECOND = 46.3
FALLBACK_BYTES_PER_ROW = 200.0
FALLBACK_ROWS = 10000.0


@dataclass(frozen=True)
class StepSize:
    """How big one step is: one partition, or a range of partitions embedded by one work unit.

    A single partition: ``bytes`` and/or ``rows``; both None when unknown (the runtime model then uses
    ``typical_rows``). A range: ``partitions`` holds each partition's own size, in the range's order, and
    ``bytes`` / ``rows`` are their totals when every partition's figure is known, else None (build it with
    :meth:`for_range`).

    Attributes:
        bytes: corpus bytes (the partition's file, or the range's total), or None.
        rows: number of texts, or None (usually unknown before the step reads it).
        partitions: per-partition sizes of a ranged step (each without ``partitions``); ``()`` for a
            single-partition step.

    Raises:
        ValueError: a negative size, or a nested range.
    """

    bytes: int | None = None
    rows: int | None = None
    partitions: tuple["StepSize", ...] = ()

    def __post_init__(self) -> None:
        for what, v in (("bytes", self.bytes), ("rows", self.rows)):
            if v is not None and v < 0:
                raise ValueError(f"StepSize: {what} must be >= 0, got {v}")
        if any(p.partitions for p in self.partitions):
            raise ValueError("StepSize: a range's partitions must be single partitions (no nested ranges)")

    @classmethod
    def for_range(cls, sizes: Iterable["StepSize | int | None"]) -> "StepSize":
        """The size of a ranged step from its partitions' sizes, in the range's order.

        Each item is a :class:`StepSize` of one partition, its corpus bytes (int), or None (unknown).
        ``bytes`` (``rows``) is the total when every partition's is known, else None.

        Raises:
            ValueError: ``sizes`` is empty, an item is negative, a nested range, or of another type
                (the message names its index).
        """
        parts = []
        for i, s in enumerate(sizes):
            if s is None:
                s = cls()
            elif isinstance(s, bool) or not isinstance(s, (int, StepSize)):
                raise ValueError(f"StepSize.for_range: item {i} is {type(s).__name__}, not StepSize, int or None")
            elif isinstance(s, int):
                if s < 0:
                    raise ValueError(f"StepSize.for_range: item {i} has negative bytes {s}")
                s = cls(bytes=s)
            if s.partitions:
                raise ValueError(f"StepSize.for_range: item {i} is itself a range")
            parts.append(s)
        if not parts:
            raise ValueError("StepSize.for_range: a range needs at least one partition")
        total_bytes = sum(p.bytes for p in parts) if all(p.bytes is not None for p in parts) else None
        total_rows = sum(p.rows for p in parts) if all(p.rows is not None for p in parts) else None
        return cls(bytes=total_bytes, rows=total_rows, partitions=tuple(parts))

    @property
    def parts(self) -> tuple["StepSize", ...]:
        """The partitions this step embeds: ``partitions`` for a range, ``(self,)`` for one partition."""
        return self.partitions or (self,)

    @property
    def n_partitions(self) -> int:
        """How many partitions this step embeds (1 for a single-partition step)."""
        return len(self.parts)


@dataclass(frozen=True)
class HistoryPoint:
    """One earlier materialization of the same asset (from its metadata).

    Attributes:
        rows: ``embedding/rows``.
        texts_per_second: ``embedding/texts_per_second`` (rows / embedding seconds).
        bytes: the partition's corpus file size in bytes, None if unknown.
        product: ``gpu/product_name`` or ``cpu``; None if unknown.
        utilization_percent: ``gpu/utilization_mean_percent`` (0-100), None if not sampled.
    """

    rows: int
    texts_per_second: float
    bytes: int | None = None
    product: str | None = None
    utilization_percent: float | None = None


@dataclass(frozen=True)
class RuntimeModel:
    """Throughput learned from history, or the stated fallback.

    Attributes:
        texts_per_second: median texts/s on a full GPU.
        rows_per_byte: median rows per corpus byte.
        gpu_busy: median GPU busy fraction u (0 < u <= 1) of a step on a full GPU.
        cpu_texts_per_second: median texts/s on CPU, None without CPU history.
        cpu_slowdown: CPU runtime = GPU runtime × this when ``cpu_texts_per_second`` and
            ``fallback_cpu_texts_per_second`` are None.
        n_history: how many materializations the figures come from (0 = fallback).
        per_product: median texts/s by GPU product, where history has it.
        typical_rows: median rows per materialization, for a partition of unknown size.
        per_partition_s: billed seconds each partition adds inside a work unit beyond its embedding
            (open and read its file, write its parquet atomically, record its materialization); 0.0 by
            default (the single-partition policy of issue 5 folded it into the start-up). The simulator
            takes it from ``bench/results/unit_startup.json``.
        checkpoint_records: records a unit embeds between two committed checkpoint parts (the asset's
            ``checkpoint_every_batches × read_batch_rows``, :mod:`dagster_gpu.embedding.checkpoint`); None: no
            checkpoints (a preemption loses the partition in flight). Sets the lost work of a preemption
            (:mod:`dagster_gpu.policy.preemption`).
        fallback_cpu_texts_per_second: texts/s assumed on CPU when there is no history at all
            (``FALLBACK_CPU_TEXTS_PER_SECOND``, set by :meth:`from_history`); None: the GPU figure ÷ slowdown.
    """

    texts_per_second: float = FALLBACK_TEXTS_PER_SECOND
    rows_per_byte: float = 1.0 / FALLBACK_BYTES_PER_ROW
    gpu_busy: float = 1.0
    cpu_texts_per_second: float | None = None
    cpu_slowdown: float = 20.0
    n_history: int = 0
    per_product: tuple[tuple[str, float], ...] = ()
    typical_rows: float = FALLBACK_ROWS
    per_partition_s: float = 0.0
    checkpoint_records: float | None = None

    #: materializations on a GPU among ``n_history`` (the rest ran on the CPU; None: all of them); 0 = the GPU
    #: figures are the fallback
    n_gpu_history: int | None = None
    fallback_cpu_texts_per_second: float | None = None

    @property
    def source(self) -> str:
        """Where each figure comes from, in words (what ``whatif`` prints): :meth:`describe` for both devices."""
        return self.describe()

    def describe(self, gpu: bool = True, cpu: bool = True) -> str:
        """Where each figure comes from, in words. Without history, only the devices asked for are named
        (``gpu``: a GPU placement, ``cpu``: a CPU one; neither: both), each with its texts/s and where that
        figure comes from; with history, every figure learned, and an assumed one only for a device asked for
        (a CPU-only host's plan does not name the GPU fallback)."""
        both = not (gpu or cpu)
        if self.n_history == 0:
            named = []
            if gpu or both:
                named.append(f"GPU {self.texts_per_second:g} texts/s (stated: conservative for all-MiniLM-L6-v2 on "
                             f"one data-centre GPU)")
            if cpu or both:
                if self.fallback_cpu_texts_per_second:
                    named.append(f"CPU {self.fallback_cpu_texts_per_second:g} texts/s (measured: all-MiniLM-L6-v2 on "
                                 f"2 shared CPU cores, docs/benchmarks.md)")
                else:
                    named.append(f"CPU: the GPU figure ÷ {self.cpu_slowdown:g}")
            return f"fallback (no history): {', '.join(named)}, {1 / self.rows_per_byte:g} bytes/row"
        n_gpu = self.n_history if self.n_gpu_history is None else self.n_gpu_history
        n_cpu = self.n_history - n_gpu
        parts = []
        if n_gpu:
            parts.append(f"GPU median {self.texts_per_second:.0f} texts/s ({n_gpu} on a GPU)")
        elif gpu or both:
            parts.append(f"GPU {self.texts_per_second:g} texts/s (fallback: no GPU history)")
        if self.cpu_texts_per_second:
            parts.append(f"CPU median {self.cpu_texts_per_second:.1f} texts/s ({n_cpu} on the CPU)")
        return (f"history of {self.n_history} materialization(s): " + "; ".join(parts)
                + f"; {1 / self.rows_per_byte:.0f} bytes/row")

    @classmethod
    def from_history(cls, points: Iterable[HistoryPoint], cpu_slowdown: float = 20.0) -> "RuntimeModel":
        """Medians over ``points`` (ignoring non-positive figures); the fallback when none are usable."""
        pts = [p for p in points if p.rows > 0 and p.texts_per_second > 0]
        gpu = [p for p in pts if (p.product or "").lower() != "cpu"]
        cpu = [p for p in pts if (p.product or "").lower() == "cpu"]
        kw: dict = {"cpu_slowdown": cpu_slowdown, "n_history": len(pts), "n_gpu_history": len(gpu)}
        if not pts:
            kw["fallback_cpu_texts_per_second"] = FALLBACK_CPU_TEXTS_PER_SECOND
        if gpu:
            kw["texts_per_second"] = statistics.median(p.texts_per_second for p in gpu)
            by: dict[str, list[float]] = {}
            for p in gpu:
                if p.product:
                    by.setdefault(p.product, []).append(p.texts_per_second)
            kw["per_product"] = tuple(sorted((k, statistics.median(v)) for k, v in by.items()))
            utils = [p.utilization_percent / 100.0 for p in gpu if p.utilization_percent and p.utilization_percent > 0]
            if utils:
                kw["gpu_busy"] = min(1.0, statistics.median(utils))
        if cpu:
            kw["cpu_texts_per_second"] = statistics.median(p.texts_per_second for p in cpu)
        if pts:
            kw["typical_rows"] = float(statistics.median(p.rows for p in pts))
        sized = [p.rows / p.bytes for p in pts if p.bytes]
        if sized:
            kw["rows_per_byte"] = statistics.median(sized)
        return cls(**kw)

    def rows(self, size: StepSize) -> float:
        """Expected rows of a partition: its row count if known, else bytes × rows_per_byte, else
        ``typical_rows``; of a range: the sum over its partitions, each resolved so."""
        if size.partitions:
            return sum(self.rows(p) for p in size.partitions)
        if size.rows is not None:
            return float(size.rows)
        if size.bytes is not None:
            return size.bytes * self.rows_per_byte
        return self.typical_rows

    def gpu_seconds_full(self, size: StepSize, product: str | None = None) -> float:
        """Seconds of work on one full GPU of ``product`` (history of that product if any, else overall)."""
        tps = dict(self.per_product).get(product or "", self.texts_per_second) if product else self.texts_per_second
        return self.rows(size) / tps

    def speed(self, fraction: float) -> float:
        """Relative speed on a device of compute ``fraction`` (1.0 full GPU): ``min(1, fraction / gpu_busy)``."""
        return min(1.0, fraction / self.gpu_busy)

    def runtime_s(self, size: StepSize, product: str | None = None, fraction: float = 1.0) -> float:
        """Expected seconds of work on a device of ``product`` and compute ``fraction``."""
        return self.gpu_seconds_full(size, product) / self.speed(fraction)

    def checkpoint_s(self, product: str | None = None, fraction: float = 1.0) -> float | None:
        """Embedding seconds between two checkpoint parts on a device of ``product`` and ``fraction``
        (``checkpoint_records`` at that device's speed); None without checkpoints."""
        if not self.checkpoint_records or self.checkpoint_records <= 0:
            return None
        return self.runtime_s(StepSize(rows=int(math.ceil(self.checkpoint_records))), product, fraction)

    def partition_overhead_s(self, size: StepSize) -> float:
        """Billed seconds the step's partitions add beyond their embedding: ``n_partitions × per_partition_s``."""
        return size.n_partitions * self.per_partition_s

    def cpu_rate(self, slowdown: float | None = None) -> float:
        """Texts/s assumed on CPU: the CPU history's median, else the no-history CPU fallback, else the GPU
        figure ÷ ``slowdown`` (default ``cpu_slowdown``; a host's own, e.g. ``LocalState.cpu_slowdown``)."""
        if self.cpu_texts_per_second:
            return self.cpu_texts_per_second
        if self.fallback_cpu_texts_per_second:
            return self.fallback_cpu_texts_per_second
        return self.texts_per_second / (slowdown if slowdown is not None else self.cpu_slowdown)

    def cpu_runtime_s(self, size: StepSize, slowdown: float | None = None) -> float:
        """Expected seconds on CPU: rows ÷ :meth:`cpu_rate`."""
        return self.rows(size) / self.cpu_rate(slowdown)
