"""Measured billing of one step, computed in the worker (pure given its inputs).

The billed device is what the step really ran on: the GPU product NVML (or torch) reports, a MIG
profile parsed from a MIG device's name (``NVIDIA A100-SXM4-80GB MIG 1g.10gb`` -> ``mig-1g.10gb`` at 1/7),
or ``cpu`` (one CPU slot) when the model ran on CPU. GPU-seconds = devices × wall seconds of the step
(worker process start to end of the asset body); cost = GPU-seconds × rate / 3600.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from dagster_gpu.billing.metering import charge
from dagster_gpu.billing.ratecard import mig_fraction

_MIG_NAME = re.compile(r"^(?P<parent>.+?)\s+MIG\s+(?P<profile>\d+g\.\d+gb)$")


@dataclass(frozen=True)
class Billing:
    """``device_type`` billed, ``devices`` (count or fraction), ``gpu_seconds``, ``rate_usd_per_gpu_hour``, ``cost_usd``."""

    device_type: str
    devices: float
    wall_seconds: float
    gpu_seconds: float
    rate_usd_per_gpu_hour: float
    cost_usd: float
    source: str = "measured"


def billed_device(model_device: str, product_name: str | None, device_count: int, device_fraction: float | None):
    """(device_type, parent_product, devices) for a step whose model ran on ``model_device``.

    ``product_name`` is NVML's (or torch's) name of the first device; ``device_count`` how many devices
    the step saw; ``device_fraction`` the executor's fraction for a shared GPU (None = whole devices).
    """
    if not model_device.startswith("cuda") or not product_name:
        return "cpu", None, 1.0
    m = _MIG_NAME.match(product_name)
    if m:
        return f"mig-{m.group('profile')}", m.group("parent"), max(1, device_count) * mig_fraction(m.group("profile"))
    devices = float(max(1, device_count))
    if device_fraction is not None:
        devices *= device_fraction
    return product_name, None, devices


def measure(
    rates: Mapping[str, float],
    wall_seconds: float,
    model_device: str,
    product_name: str | None,
    device_count: int,
    device_fraction: float | None = None,
) -> Billing:
    """Billing for one step; raises RateCardError when the rate table has no entry and no default."""
    device_type, parent, devices = billed_device(model_device, product_name, device_count, device_fraction)
    c = charge(rates, device_type, devices, wall_seconds, parent)  # a MIG slice: parent's rate, fractional seconds
    return Billing(device_type, devices, wall_seconds, c.gpu_seconds, c.rate_usd_per_gpu_hour, c.cost_usd)
