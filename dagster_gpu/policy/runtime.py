"""Expected runtime of a partition step, learned from earlier materializations (pure).

Formula (seconds on one full GPU)::

    rows_est  = step.rows                     if the partition's row count is known
              = step.bytes * rows_per_byte    else if its size is (rows_per_byte = median over history of rows / bytes)
              = typical_rows                  else (median rows per materialization in history; a GPU
                                              asset that reads no corpus file has no size to scale by)
    runtime_s = rows_est / texts_per_second   (texts_per_second = median over history)

On a MIG slice of compute fraction ``f`` the step runs at ``min(1, f / u)`` of the full GPU's speed,
where ``u`` is the median ``gpu/utilization_mean_percent`` / 100 of the history (a step that keeps an
A100 25 % busy loses nothing on a 2g slice, 2/7 ≈ 29 %); with no utilization history ``u = 1`` (the
conservative, compute-bound assumption: runtime scales by ``1 / f``). On CPU the runtime is the GPU
runtime times ``cpu_slowdown`` unless CPU history exists.

Fallback when there is no history (stated, not measured here):

- ``FALLBACK_TEXTS_PER_SECOND = 2000``: a deliberately conservative figure for all-MiniLM-L6-v2 on one
  data-centre GPU (sbert.net's pretrained-model table lists about 14,200 sentences/s for that model on a
  V100; real corpora with longer texts and parquet I/O run far slower).
- ``FALLBACK_BYTES_PER_ROW = 200``: a short text plus its parquet/JSONL framing.
- ``FALLBACK_ROWS = 10000``: rows of a partition of unknown size (5 s at the fallback rate), so a step
  of unknown size is priced as a short one rather than refused.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable

FALLBACK_TEXTS_PER_SECOND = 2000.0
FALLBACK_BYTES_PER_ROW = 200.0
FALLBACK_ROWS = 10000.0


@dataclass(frozen=True)
class StepSize:
    """How big one partition is; both None when unknown (the runtime model then uses ``typical_rows``).

    Attributes:
        bytes: size of the partition's corpus file in bytes, or None.
        rows: number of texts in the partition, or None (usually unknown before the step reads it).
    """

    bytes: int | None = None
    rows: int | None = None


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
        cpu_slowdown: CPU runtime = GPU runtime × this when ``cpu_texts_per_second`` is None.
        n_history: how many materializations the figures come from (0 = fallback).
        per_product: median texts/s by GPU product, where history has it.
        typical_rows: median rows per materialization, for a partition of unknown size.
    """

    texts_per_second: float = FALLBACK_TEXTS_PER_SECOND
    rows_per_byte: float = 1.0 / FALLBACK_BYTES_PER_ROW
    gpu_busy: float = 1.0
    cpu_texts_per_second: float | None = None
    cpu_slowdown: float = 20.0
    n_history: int = 0
    per_product: tuple[tuple[str, float], ...] = ()
    typical_rows: float = FALLBACK_ROWS

    @property
    def source(self) -> str:
        if self.n_history == 0:
            return (
                f"fallback (no history): {self.texts_per_second:g} texts/s, "
                f"{1 / self.rows_per_byte:g} bytes/row"
            )
        return f"history of {self.n_history} materialization(s): median {self.texts_per_second:.0f} texts/s"

    @classmethod
    def from_history(cls, points: Iterable[HistoryPoint], cpu_slowdown: float = 20.0) -> "RuntimeModel":
        """Medians over ``points`` (ignoring non-positive figures); the fallback when none are usable."""
        pts = [p for p in points if p.rows > 0 and p.texts_per_second > 0]
        gpu = [p for p in pts if (p.product or "").lower() != "cpu"]
        cpu = [p for p in pts if (p.product or "").lower() == "cpu"]
        kw: dict = {"cpu_slowdown": cpu_slowdown, "n_history": len(pts)}
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
        ``typical_rows``."""
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

    def cpu_runtime_s(self, size: StepSize, slowdown: float | None = None) -> float:
        """Expected seconds on CPU: CPU history if any, else GPU runtime × slowdown."""
        if self.cpu_texts_per_second:
            return self.rows(size) / self.cpu_texts_per_second
        return self.gpu_seconds_full(size) * (slowdown if slowdown is not None else self.cpu_slowdown)
