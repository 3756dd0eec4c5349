"""Placement across the fleet: every feasible (cluster, pool) pair priced, the cheapest chosen (pure).

Rule: each cluster is evaluated exactly as a one-cluster config is (:func:`dagster_gpu.policy.policy.alternatives`:
feasibility, its own live queue and throttle, the throughput learned per device, its preemption rate), priced from
that cluster's own rate table; an unreachable cluster is recorded infeasible with its reason (an announced outage
delays it instead). The choice over all pairs is :func:`dagster_gpu.policy.policy.select` (least cost among
those meeting the deadline, ties to the earliest finish, then local, slurm, kubernetes, then the configured order
of clusters). The reason names the cluster, the pool's own reason (queue, rate, preemption) and the two
runners-up with their cost and start.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Collection

from dagster_gpu.billing.ratecard import RateCardError
from dagster_gpu.core.request import GpuRequest
from dagster_gpu.fleet.state import KINDS, FleetSnapshot
from dagster_gpu.policy.forced import forced_backend
from dagster_gpu.policy.placement import Alternative, Placement
from dagster_gpu.policy.policy import DEFAULT_CONFIG, NoFeasiblePlacement, PolicyConfig, alternatives, decide, select
from dagster_gpu.policy.runtime import RuntimeModel, StepSize

RUNNERS_UP = 2


def fleet_alternatives(request: GpuRequest, step_size: StepSize, fleet: FleetSnapshot, model: RuntimeModel | None = None,
                       config: PolicyConfig = DEFAULT_CONFIG) -> tuple[Alternative, ...]:
    """Every candidate over the fleet, each with its ``cluster``, in the fleet's cluster order."""
    out: list[Alternative] = []
    for c in fleet.clusters:
        try:
            snap = fleet.snapshot_of(c.name)
        except RateCardError as e:
            out.append(Alternative(backend=c.kind, cluster=c.name, feasible=False, note=f"no rate: {e}"))
            continue
        out += [replace(a, cluster=c.name) for a in alternatives(request, step_size, snap, model, config)]
    return tuple(out)


def label(a: Alternative) -> str:
    """``campus slurm NVIDIA A100-SXM4-80GB`` (the cluster's name, then its kind when it differs, then the device)."""
    head = a.cluster or a.backend
    if a.cluster and a.cluster != a.backend:
        head += f" ({a.backend})"
    return f"{head} {a.device}" if a.device else head


def decide_fleet(request: GpuRequest, step_size: StepSize, fleet: FleetSnapshot, *, model: RuntimeModel | None = None,
                 force: str | None = None, exclude: Collection[str] = (), config: PolicyConfig = DEFAULT_CONFIG
                 ) -> Placement:
    """The placement of one work unit over the fleet (module docstring).

    Args:
        force: a backend kind (``slurm``: any Slurm cluster) or a cluster's name; the request's
            ``dagster-gpu/backend`` tag (a kind) wins over it. Other alternatives are still recorded.
        exclude: clusters not to choose (a unit spilling over leaves the cluster it waited on).

    Raises:
        NoFeasiblePlacement: no feasible pair is left; the message names each cluster's reason.
    """
    alts = fleet_alternatives(request, step_size, fleet, model, config)
    kind = forced_backend(request, force if force in KINDS else None)
    cluster = force if force and force != "auto" and force not in KINDS and not request.backend else None
    pool = [a for a in alts if a.feasible and a.cluster not in exclude
            and (kind is None or a.backend == kind.backend) and (cluster is None or a.cluster == cluster)]
    if not pool:
        skipped = "; ".join(f"{label(a)}: {a.note}" for a in alts if not a.feasible) or "no cluster configured"
        where = f" on {cluster or kind.backend!r}" if (cluster or kind) else ""
        gone = f" (excluding {', '.join(sorted(exclude))})" if exclude else ""
        raise NoFeasiblePlacement(f"no feasible placement in the fleet{where}{gone}: {skipped}", alts)
    best, why, _met = select(pool, request.deadline_s, config)
    own = decide(request, step_size, fleet.snapshot_of(best.cluster), model=model, config=config)
    others = sorted((a for a in pool if a is not best), key=lambda a: (a.cost_usd, a.finish_s))[:RUNNERS_UP]
    n_clusters = len({a.cluster for a in pool})
    reason = f"cluster {best.cluster}: {why} over {n_clusters} cluster(s); {own.reason}"
    if others:
        reason += "; runners-up: " + ", ".join(
            f"{label(a)} {a.cost_usd:.4f} USD start {a.start_delay_s:.0f} s finish {a.finish_s:.0f} s" for a in others)
    down = [a for a in alts if not a.feasible and a.cluster != best.cluster]
    if down:
        reason += "; other clusters not chosen: " + "; ".join(f"{label(a)}: {a.note}" for a in down)
    return replace(own, reason=reason, alternatives=alts, cluster=best.cluster)
