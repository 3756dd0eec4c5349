"""The rate card: USD per GPU-hour by backend and device type.

The default card is package data, ``dagster_gpu/data/ratecard.yaml`` (``resources/ratecard.yaml`` in the
repository is a link to it), so :meth:`RateCard.load` works from an installed wheel.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import yaml

from dagster_gpu.billing.mig import slice_fraction

DEFAULT_RATE_CARD = Path(__file__).resolve().parents[1] / "data" / "ratecard.yaml"

_MIG_PROFILE = re.compile(r"^mig-(\d+)g\.(\d+)gb(?:\+me)?$")  # a MIG rate-card device type: mig-<profile>


class RateCardError(ValueError):
    """The rate card file is malformed or has no rate for a (backend, device); the message names both."""


def mig_fraction(profile: str, parent_product: str | None = None) -> float:
    """Compute fraction of a MIG profile of its parent GPU (:func:`dagster_gpu.billing.mig.slice_fraction`):
    ``1g.10gb`` -> 1/7, ``3g.40gb`` -> 3/7, ``7g.80gb`` -> 1; an A30's ``1g.6gb`` -> 1/4, ``2g.12gb`` -> 2/4
    (4 slices: by ``parent_product`` when given, else by the A30-only profile name).

    Accepts ``1g.10gb`` or ``mig-1g.10gb``. Raises RateCardError for anything else.
    """
    fraction = slice_fraction(profile[4:] if profile.startswith("mig-") else profile, parent_product)
    if fraction is None:
        raise RateCardError(f"not a MIG profile: {profile!r} (expected e.g. '1g.10gb')")
    return fraction


@dataclass(frozen=True)
class RateCard:
    """Rates in USD per GPU-hour: ``rates[backend][device_type]``."""

    rates: Mapping[str, Mapping[str, float]]
    source: str = "<inline>"

    @classmethod
    def load(cls, path: str | Path | None = None) -> "RateCard":
        """Read a YAML rate card (default: the packaged ``dagster_gpu/data/ratecard.yaml``).

        Raises RateCardError naming the file when it is unreadable, has no ``backends`` mapping, or a
        rate is not a finite number >= 0.
        """
        p = Path(path) if path else DEFAULT_RATE_CARD
        try:
            doc = yaml.safe_load(p.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise RateCardError(f"rate card {p}: cannot read: {e}") from e
        return cls.from_dict(doc, source=str(p))

    @classmethod
    def from_dict(cls, doc: object, source: str = "<inline>") -> "RateCard":
        if not isinstance(doc, dict) or not isinstance(doc.get("backends"), dict):
            raise RateCardError(f"rate card {source}: expected a mapping with a 'backends' mapping")
        rates: dict[str, dict[str, float]] = {}
        for backend, table in doc["backends"].items():
            if not isinstance(table, dict):
                raise RateCardError(f"rate card {source}: backend {backend!r} must map device types to USD/GPU-hour")
            rates[str(backend)] = {}
            for device, rate in table.items():
                try:
                    r = float(rate)
                except (TypeError, ValueError):
                    r = math.nan
                if not math.isfinite(r) or r < 0:
                    raise RateCardError(
                        f"rate card {source}: {backend}/{device}: rate must be a finite number >= 0, got {rate!r}"
                    )
                rates[str(backend)][str(device)] = r
        return cls(rates=rates, source=source)

    def table(self, backend: str) -> Mapping[str, float]:
        """The device->rate table of one backend. Raises RateCardError if the backend is absent."""
        try:
            return self.rates[backend]
        except KeyError:
            raise RateCardError(f"rate card {self.source}: no rates for backend {backend!r}") from None

    def gpu_hour_rate(self, backend: str, device_type: str, parent_product: str | None = None) -> float:
        """USD per GPU-hour that GPU-seconds of ``device_type`` on ``backend`` are charged at (see
        :func:`gpu_hour_rate`). Raises RateCardError when nothing matches and the backend has no ``default``."""
        return gpu_hour_rate(self.table(backend), device_type, parent_product, f"{self.source}: {backend}")

    def rate(self, backend: str, device_type: str, parent_product: str | None = None) -> float:
        """USD per hour of one device of ``device_type`` on ``backend``: :meth:`gpu_hour_rate` × the device's
        fraction of a GPU (a ``mig-1g.10gb`` slice: its parent's rate × 1/7; a whole GPU: its rate).
        Raises RateCardError when nothing matches and the backend has no ``default``."""
        return rate_from_table(self.table(backend), device_type, parent_product, f"{self.source}: {backend}")


def _lookup(table: Mapping[str, float], device_type: str, where: str) -> float:
    if device_type in table:
        return table[device_type]
    prefixes = [k for k in table if k != "default" and device_type.startswith(k)]
    if prefixes:
        return table[max(prefixes, key=len)]
    if "default" in table:
        return table["default"]
    raise RateCardError(f"{where}: no rate for device {device_type!r} and no 'default'")


def gpu_hour_rate(
    table: Mapping[str, float], device_type: str, parent_product: str | None = None, where: str = "rate table"
) -> float:
    """The one pricing rule: USD per GPU-hour for GPU-seconds of ``device_type`` in one backend's table.

    A MIG slice (``mig-1g.10gb``) is charged at its parent product's rate (``parent_product``, else the
    table's ``default``): its GPU-seconds are already fractional (a 1/7 slice for 7 s is 1 GPU-second).
    Any other device type: exact key, else the longest key that prefixes it, else ``default``.
    Raises RateCardError when nothing matches and there is no ``default``.
    """
    if _MIG_PROFILE.match(device_type):
        return _lookup(table, parent_product or "default", where)
    return _lookup(table, device_type, where)


def rate_from_table(
    table: Mapping[str, float], device_type: str, parent_product: str | None = None, where: str = "rate table"
) -> float:
    """USD per hour of one device of ``device_type``: :func:`gpu_hour_rate` × :func:`mig_fraction` for a MIG
    slice, the GPU-hour rate for anything else (see :meth:`RateCard.rate`)."""
    rate = gpu_hour_rate(table, device_type, parent_product, where)
    return rate * mig_fraction(device_type, parent_product) if _MIG_PROFILE.match(device_type) else rate
