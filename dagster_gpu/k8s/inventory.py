"""Free DRA devices for the cost policy (pure): ResourceSlices minus what ResourceClaims have allocated.

Inputs are plain API dicts (camelCase, as ``ApiClient().sanitize_for_serialization`` or ``kubectl -o json``
give them). Devices are grouped into pools by (type, productName, MIG profile, memory): a full GPU's rate
card device type is its product name, a MIG slice's is ``mig-<profile>``. Allocated devices are the
``status.allocation.devices.results[]`` (driver, pool, device) triples of every claim.

Two rules of the ``resource.k8s.io/v1`` API (kubernetes/api v0.34.0 ``resource/v1/types.go``) decide what
counts:

* **Pool generations.** A driver that changes a pool republishes all of its slices with a higher
  ``spec.pool.generation``; "a consumer must only use ResourceSlices with the highest generation number and
  ignore all others". Slices of an older generation of their (driver, pool) are skipped, so a device
  published in both the old and the new slice is counted once. A pool whose newest generation is still
  incomplete (fewer slices than ``resourceSliceCount``) is counted from the slices already there.
* **Shared counters** (partitionable devices, the NVIDIA driver's dynamic MIG mode:
  NVIDIA/k8s-dra-driver-gpu v25.12.0 ``cmd/gpu-kubelet-plugin/partitions.go``). The pool lists the full GPU
  and every possible MIG placement as abstract devices that ``consumesCounters`` from the GPU's counter set
  (``gpu-<minor>-counter-set``: SMs, engines, memory and one ``memory-slice-<i>`` counter per memory slice),
  declared in a slice's ``spec.sharedCounters`` (the same slice before Kubernetes 1.35, a separate slice of
  the pool from 1.35: ``driver.go``). An allocated device's consumption is taken from its set. For one kind
  of device, ``total`` is how many of them fit in the full counters at once and ``free`` how many of the
  unallocated ones fit in what is left: seven 1g.10gb placements of an A100-80GB are 7 devices, one of which,
  once allocated, leaves 6 free 1g.10gb, 1 free 3g.40gb (placement 4) and no whole GPU. Devices are taken
  greedily by the last memory slice they use (earliest end first: the most placements of one size fit).
  Each kind is counted as if the others took nothing (they compete for the same counters).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from typing import Any, Iterable, Mapping

from kubernetes.utils import parse_quantity

from dagster_gpu.k8s.dra import newest_slices
from dagster_gpu.policy.snapshot import DeviceGroup

DRIVER = "gpu.nvidia.com"
_MEMORY_SLICE = re.compile(r"^memory-slice-(\d+)$")


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


def _counters(m: Mapping[str, Any] | None) -> dict[str, float]:
    return {k: float(parse_quantity((v or {}).get("value", 0))) for k, v in (m or {}).items()}


def _consumption(pool: str, body: Mapping[str, Any]) -> dict[tuple[str, str], dict[str, float]]:
    return {(pool, c["counterSet"]): _counters(c.get("counters")) for c in body.get("consumesCounters") or []}


def _fits(need: Mapping[tuple[str, str], Mapping[str, float]], left: Mapping[tuple[str, str], dict[str, float]]) -> bool:
    return all(key in left and all(left[key].get(c, 0.0) + 1e-9 >= v for c, v in counters.items())
               for key, counters in need.items())


def _take(need: Mapping[tuple[str, str], Mapping[str, float]], left: dict[tuple[str, str], dict[str, float]]) -> None:
    for key, counters in need.items():
        if key in left:
            for c, v in counters.items():
                left[key][c] = left[key].get(c, 0.0) - v


def _slice_end(need: Mapping[tuple[str, str], Mapping[str, float]]) -> int:
    ends = [int(m.group(1)) for counters in need.values() for c in counters if (m := _MEMORY_SLICE.match(c))]
    return max(ends, default=0)


def _how_many(devices: list[tuple[str, dict]], left: Mapping[tuple[str, str], Mapping[str, float]]) -> int:
    """Devices of one kind that fit in ``left`` at once (greedy, earliest last memory slice first)."""
    pool = {k: dict(v) for k, v in left.items()}
    n = 0
    for _, need in sorted(devices, key=lambda d: (_slice_end(d[1]), d[0])):
        if _fits(need, pool):
            _take(need, pool)
            n += 1
    return n


def device_groups(
    slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]], pending: Mapping[str, int] | None = None,
    driver: str = DRIVER,
) -> tuple[DeviceGroup, ...]:
    """Pools of ``driver``'s devices with ``free`` = not allocated to any claim (module docstring: only each
    pool's newest generation; counter-consuming devices counted by what the shared counters allow).

    ``pending`` maps a pool's rate-card device type to our Pending pods waiting for it. v1beta1 slices (devices
    under ``basic``) are accepted as well as v1/v1beta2. ``memory_gib`` is the device's published ``memory``
    in GiB (2 decimals; an "80GB" H100 publishes 79.65): :func:`dagster_gpu.core.device_memory.memory_fits` judges
    it against a request.
    """
    taken = allocated_device_ids(claims)
    current = newest_slices(slices, driver)
    full: dict[tuple[str, str], dict[str, float]] = {}
    for s in current:
        pool_name = (s["spec"].get("pool") or {}).get("name", "")
        for cs in s["spec"].get("sharedCounters") or []:
            full[(pool_name, cs["name"])] = _counters(cs.get("counters"))
    left = {k: dict(v) for k, v in full.items()}
    totals: Counter = Counter()
    free: Counter = Counter()
    partitioned: dict[tuple, list[tuple[str, dict]]] = defaultdict(list)  # kind -> [(device id, consumption)]
    unallocated: dict[tuple, list[tuple[str, dict]]] = defaultdict(list)
    for s in current:
        spec = s["spec"]
        pool_name = (spec.get("pool") or {}).get("name", "")
        for d in spec.get("devices") or []:
            body = d.get("basic") or d
            kind = _attr(body, "type") or "gpu"
            product = _attr(body, "productName") or "unknown"
            profile = _attr(body, "profile") if kind == "mig" else None
            mem = ((body.get("capacity") or {}).get("memory") or {}).get("value")
            gib = round(float(parse_quantity(mem)) / 2**30, 2) if mem is not None else 0.0
            key = (f"mig-{profile}" if profile else product, product, gib, profile)
            is_taken = (driver, pool_name, d["name"]) in taken
            need = _consumption(pool_name, body)
            if not need:
                totals[key] += 1
                free[key] += 0 if is_taken else 1
                continue
            totals[key] += 0  # the key exists even when nothing of it fits
            partitioned[key].append((f"{pool_name}/{d['name']}", need))
            if is_taken:
                _take(need, left)
            else:
                unallocated[key].append((f"{pool_name}/{d['name']}", need))
    for key, devices in partitioned.items():
        totals[key] += _how_many(devices, full)
        free[key] += _how_many(unallocated[key], left)
    return tuple(
        DeviceGroup(device=k[0], product=k[1], memory_gib=k[2], free=free[k], total=n, pending=(pending or {}).get(k[0], 0), mig_profile=k[3])
        for k, n in sorted(totals.items())
    )
