"""What-if over a fleet: a backfill's partitions placed one unit each, as the executor places them, grouped by
cluster (pure).

Each partition is placed by :func:`dagster_gpu.fleet.placement.decide_fleet` on the fleet as the earlier ones left
it (:func:`dagster_gpu.policy.snapshot.after_submit` on the chosen cluster: one device fewer free, or one more of
ours pending), so a cheap cluster's queue fills and later partitions go elsewhere. A mode is ``auto`` (the
policy) or one cluster's name (every partition forced there, for comparison).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dagster_gpu.core.request import GpuRequest
from dagster_gpu.fleet.placement import decide_fleet
from dagster_gpu.fleet.state import FleetSnapshot
from dagster_gpu.policy.placement import Placement
from dagster_gpu.policy.policy import NoFeasiblePlacement
from dagster_gpu.policy.runtime import RuntimeModel, StepSize
from dagster_gpu.policy.snapshot import after_submit


@dataclass(frozen=True)
class FleetPlanRow:
    """One partition's unit: where it goes (``placement``, None when nowhere) or why not (``error``)."""

    partition: str
    size_bytes: int
    placement: Placement | None = None
    error: str = ""

    @property
    def cost_usd(self) -> float:
        a = self.placement.chosen if self.placement else None
        return a.cost_usd if a and a.cost_usd is not None else 0.0


@dataclass(frozen=True)
class ClusterTotal:
    """One cluster's share of a plan: partitions, USD, latest expected finish (s from now)."""

    cluster: str
    partitions: int
    cost_usd: float
    last_finish_s: float


def plan_fleet(partitions: Sequence[tuple[str, int]], request: GpuRequest, fleet: FleetSnapshot,
               model: RuntimeModel | None = None, mode: str = "auto") -> list[FleetPlanRow]:
    """``(partition key, bytes)`` each placed in turn (module docstring); ``mode`` ``auto`` or a cluster's name."""
    rows = []
    for key, size in partitions:
        try:
            p = decide_fleet(request, StepSize(bytes=size), fleet, model=model, force=None if mode == "auto" else mode)
        except NoFeasiblePlacement as e:
            rows.append(FleetPlanRow(key, size, error=str(e)))
            continue
        rows.append(FleetPlanRow(key, size, p))
        kind = fleet.cluster(p.cluster).kind
        after = after_submit(fleet.snapshot_of(p.cluster), kind, p.device, p.product)
        fleet = fleet.with_state(p.cluster, after.backend(kind))
    return rows


def totals_by_cluster(rows: Sequence[FleetPlanRow]) -> list[ClusterTotal]:
    """Per cluster in first-use order; a plan's partitions that could not be placed are not in any."""
    out: dict[str, list] = {}
    for r in rows:
        a = r.placement.chosen if r.placement else None
        if a is None:
            continue
        t = out.setdefault(r.placement.cluster, [0, 0.0, 0.0])
        t[0] += 1
        t[1] += a.cost_usd
        t[2] = max(t[2], a.finish_s)
    return [ClusterTotal(c, n, cost, fin) for c, (n, cost, fin) in out.items()]
