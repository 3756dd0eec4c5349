"""Summary statistics of utilization samples (pure; never NaN or inf)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class TelemetrySummary:
    """Per-step GPU figures.

    Attributes:
        samples: number of sampling instants (0 when GPU metrics are unavailable).
        utilization_mean_percent: mean of per-instant utilization (percent, averaged over the step's devices).
        utilization_p95_percent: nearest-rank 95th percentile of the same series.
        memory_peak_mib: highest memory used on any one of the step's devices (MiB).
        device_uuids: the sampled devices.
        product_name: the first device's product name.
        unavailable_reason: why there are no samples (None when there are).
    """

    samples: int = 0
    utilization_mean_percent: float | None = None
    utilization_p95_percent: float | None = None
    memory_peak_mib: float | None = None
    device_uuids: tuple[str, ...] = ()
    product_name: str | None = None
    unavailable_reason: str | None = None


def percentile_nearest_rank(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (NIST/Wikipedia "nearest-rank method"): the smallest value such that
    at least ``pct`` percent of values are <= it. Raises ValueError on an empty sequence."""
    if not values:
        raise ValueError("no values")
    if not 0 < pct <= 100:
        raise ValueError(f"pct must be in (0, 100], got {pct}")
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return float(ordered[rank - 1])


def summarize(
    utilization: Sequence[float],
    memory_mib: Sequence[float],
    device_uuids: Sequence[str] = (),
    product_name: str | None = None,
    unavailable_reason: str | None = None,
) -> TelemetrySummary:
    """Summarize one series per instant (``utilization`` percent, ``memory_mib`` per-instant peak MiB).

    Non-finite samples are dropped. With no utilization samples the result carries ``unavailable_reason``
    (defaulting to "no samples collected").
    """
    util = [float(u) for u in utilization if math.isfinite(u)]
    mem = [float(m) for m in memory_mib if math.isfinite(m)]
    if not util:
        return TelemetrySummary(
            samples=0,
            memory_peak_mib=max(mem) if mem else None,
            device_uuids=tuple(device_uuids),
            product_name=product_name,
            unavailable_reason=unavailable_reason or "no samples collected",
        )
    return TelemetrySummary(
        samples=len(util),
        utilization_mean_percent=sum(util) / len(util),
        utilization_p95_percent=percentile_nearest_rank(util, 95),
        memory_peak_mib=max(mem) if mem else None,
        device_uuids=tuple(device_uuids),
        product_name=product_name,
        unavailable_reason=None,
    )
