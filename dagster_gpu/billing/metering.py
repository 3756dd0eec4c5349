"""GPU-seconds and cost (pure).

GPU-seconds = allocated device count (or fraction, e.g. 1/7 for a MIG 1g.10gb slice) × wall seconds
the devices were held (docs/architecture.md, "Billing"). Cost = GPU-seconds × rate (USD per GPU-hour) / 3600.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from dagster_gpu.billing.ratecard import gpu_hour_rate


def gpu_seconds(devices: float, wall_seconds: float) -> float:
    """``devices`` (count or fraction, >= 0) × ``wall_seconds`` (>= 0). Raises ValueError on a negative or
    non-finite input, so no NaN/inf ever reaches metadata."""
    for name, v in (("devices", devices), ("wall_seconds", wall_seconds)):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be finite and >= 0, got {v!r}")
    return float(devices) * float(wall_seconds)


def cost_usd(gpu_secs: float, rate_usd_per_gpu_hour: float) -> float:
    """USD for ``gpu_secs`` GPU-seconds at ``rate_usd_per_gpu_hour``."""
    for name, v in (("gpu_secs", gpu_secs), ("rate_usd_per_gpu_hour", rate_usd_per_gpu_hour)):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be finite and >= 0, got {v!r}")
    return gpu_secs * rate_usd_per_gpu_hour / 3600.0


@dataclass(frozen=True)
class Charge:
    """One bill: ``gpu_seconds`` (devices × seconds), ``rate_usd_per_gpu_hour`` (:func:`gpu_hour_rate`) and
    ``cost_usd`` (GPU-seconds × rate / 3600)."""

    device_type: str
    devices: float
    seconds: float
    gpu_seconds: float
    rate_usd_per_gpu_hour: float
    cost_usd: float


def charge(rates: Mapping[str, float], device_type: str, devices: float, seconds: float,
           parent_product: str | None = None) -> Charge:
    """Price ``devices`` (whole-GPU equivalents: count × fraction, 1/7 per ``mig-1g.10gb`` slice) of
    ``device_type`` held ``seconds`` at one backend's rate table. The policy's estimate, the worker's
    measured bill and the Kubernetes pod-interval bill all come from here, so a MIG slice is priced one way:
    its parent's GPU-hour rate on fractional GPU-seconds. Raises RateCardError (no rate) or ValueError
    (negative or non-finite input)."""
    secs = gpu_seconds(devices, seconds)
    rate = gpu_hour_rate(rates, device_type, parent_product)
    return Charge(device_type, float(devices), float(seconds), secs, rate, cost_usd(secs, rate))


def useful_fraction(pairs) -> float | None:
    """The useful fraction of one partition or of many: Σ embedding seconds ÷ Σ measured seconds (a ratio of
    sums, never a mean of ratios, so a tiny partition weighs what it cost), clipped to [0, 1].

    ``pairs``: ``(embedding seconds, measured seconds)`` per partition: ``embedding/seconds`` (read, embed,
    write) and ``billing/wall_seconds``, the wall seconds the step worker measured for the partition (its own
    interval plus its share of the unit's start-up), the figure its measured bill is priced on; pairs with
    either figure None are left out. The scheduler's bill (sacct, pod interval) lands later and is not used:
    one definition for every materialization, backend and report. None when no measured second is left."""
    emb = meas = 0.0
    for e, m in pairs:
        if e is None or m is None:
            continue
        emb, meas = emb + float(e), meas + float(m)
    return max(0.0, min(1.0, emb / meas)) if meas > 0 else None
