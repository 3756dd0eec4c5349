"""GPU-seconds and cost (pure).

GPU-seconds = allocated device count (or fraction, e.g. 1/7 for a MIG 1g.10gb slice) × wall seconds
the devices were held (DESIGN.md, "Our own" vocabulary). Cost = GPU-seconds × rate (USD per GPU-hour) / 3600.
"""

from __future__ import annotations

import math


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
