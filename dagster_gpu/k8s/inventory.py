"""Free DRA devices for the cost policy (pure): ResourceSlices minus what ResourceClaims have allocated.

Inputs are plain API dicts (camelCase, as ``ApiClient().sanitize_for_serialization`` or ``kubectl -o json``
give them). Devices are grouped into pools by (type, productName, MIG profile, memory): a full GPU's rate
card device type is its product name, a MIG slice's is ``mig-<profile>``. Allocated devices are the
``status.allocation.devices.results[]`` (driver, pool, device) triples of every claim.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Mapping

from kubernetes.utils import parse_quantity

from dagster_gpu.policy.snapshot import DeviceGroup

DRIVER = "gpu.nvidia.com"


def _attr(device: Mapping[str, Any], name: str) -> str | None:
    v = (device.get("attributes") or {}).get(name) or (device.get("attributes") or {}).get(f"{DRIVER}/{name}")
    if not v:
        return None
    return v.get("string") or v.get("version") or (str(v["int"]) if "int" in v else None)


def allocated_device_ids(claims: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, str]]:
    """(driver, pool, device) of every device allocated to any claim."""
    out = set()
    for c in claims:
        results = (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        out |= {(r["driver"], r["pool"], r["device"]) for r in results}
    return out


def device_groups(
    slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]], pending: Mapping[str, int] | None = None,
    driver: str = DRIVER,
) -> tuple[DeviceGroup, ...]:
    """Pools of ``driver``'s devices with ``free`` = not allocated to any claim.

    ``pending`` maps a pool's rate-card device type to our Pending pods waiting for it. v1beta1 slices (devices
    under ``basic``) are accepted as well as v1/v1beta2.
    """
    taken = allocated_device_ids(claims)
    totals: Counter = Counter()
    free: Counter = Counter()
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != driver:
            continue
        pool_name = (spec.get("pool") or {}).get("name", "")
        for d in spec.get("devices") or []:
            body = d.get("basic") or d
            kind = _attr(body, "type") or "gpu"
            product = _attr(body, "productName") or "unknown"
            profile = _attr(body, "profile") if kind == "mig" else None
            mem = ((body.get("capacity") or {}).get("memory") or {}).get("value")
            gib = round(float(parse_quantity(mem)) / 2**30, 2) if mem is not None else 0.0
            key = (f"mig-{profile}" if profile else product, product, gib, profile)
            totals[key] += 1
            if (driver, pool_name, d["name"]) not in taken:
                free[key] += 1
    return tuple(
        DeviceGroup(device=k[0], product=k[1], memory_gib=k[2], free=free[k], total=n, pending=(pending or {}).get(k[0], 0), mig_profile=k[3])
        for k, n in sorted(totals.items())
    )
