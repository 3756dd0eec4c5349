"""Figures of one simulated run (pure).

- ``billed_gpu_hours``: Σ device fraction × seconds each device was held (runs, including lost ones,
  and resident holds) / 3600.
- ``cost_usd``: Σ rate(backend, device) × held seconds / 3600 (a MIG slice's rate is already its fraction).
- ``busy_fraction``: useful GPU-seconds (fraction × embedding seconds of the partitions finished, without
  a unit's start-up or the per-partition overhead) ÷ billed GPU-seconds.
- ``makespan_s``: last step's end − first step's arrival.
- ``deadline_misses``: steps that ended more than their deadline after arrival.
"""

from __future__ import annotations

from dataclasses import dataclass

from dagster_gpu.billing.ratecard import RateCard, mig_fraction
from dagster_gpu.sim.engine import SimResult


@dataclass(frozen=True)
class Figures:
    policy: str
    busy_fraction: float
    billed_gpu_hours: float
    cost_usd: float
    makespan_s: float
    deadline_misses: int
    steps: int
    by_backend: tuple[tuple[str, int], ...]


def _rate(rc: RateCard, cluster: str, device: str, product: str) -> float:
    backend = "kubernetes" if cluster == "resident" else cluster
    return rc.rate(backend, device, parent_product=product)


def figures(result: SimResult, rate_card: RateCard) -> Figures:
    billed = useful = cost = 0.0
    held_clusters = {h[0] for h in result.held}
    for s in result.segments:
        held = s.end_s - s.start_s
        if s.cluster not in held_clusters:  # devices held for the window are billed below, once
            billed += s.fraction * held
            cost += _rate(rate_card, s.cluster, s.device, s.product) * held / 3600.0
        useful += s.fraction * s.useful_s
    for cluster, device, product, a, b, n in result.held:
        frac = 1.0 if device == product else mig_fraction(device)
        billed += n * frac * (b - a)
        cost += n * _rate(rate_card, cluster, device, product) * (b - a) / 3600.0
    outs = list(result.outcomes.values())
    start = min((o.task.arrival_s for o in outs), default=0.0)
    end = max((o.end_s for o in outs), default=0.0)
    counts: dict[str, int] = {}
    for o in outs:
        counts[o.cluster] = counts.get(o.cluster, 0) + 1
    return Figures(
        policy=result.policy,
        busy_fraction=useful / billed if billed > 0 else 0.0,
        billed_gpu_hours=billed / 3600.0,
        cost_usd=cost,
        makespan_s=end - start,
        deadline_misses=sum(1 for o in outs if o.missed),
        steps=len(outs),
        by_backend=tuple(sorted(counts.items())),
    )


def timeline(result: SimResult, step_s: float, end_s: float) -> tuple[list[float], list[float], list[float]]:
    """Bins of ``step_s`` seconds up to ``end_s``: (bin start times, busy GPU-equivalents, billed GPU-equivalents)."""
    n = max(1, int(end_s // step_s) + 1)
    busy, held = [0.0] * n, [0.0] * n

    def add(arr, a, b, w):
        i = int(a // step_s)
        while i < n and i * step_s < b:
            lo, hi = max(a, i * step_s), min(b, (i + 1) * step_s)
            if hi > lo:
                arr[i] += w * (hi - lo) / step_s
            i += 1

    held_clusters = {h[0] for h in result.held}
    for s in result.segments:
        if s.cluster not in held_clusters:
            add(held, s.start_s, s.end_s, s.fraction)
        for a, b in s.work_spans:
            add(busy, a, b, s.fraction)
    for _c, device, product, a, b, k in result.held:
        add(held, a, b, k * (1.0 if device == product else
                             mig_fraction(device)))
    return [i * step_s for i in range(n)], busy, held
