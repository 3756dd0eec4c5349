"""gpu_executor over a fleet: the ``clusters:`` config field, each cluster's backend, and its placement.

``clusters:`` (:mod:`dagster_gpu.fleet.config`) maps a cluster's name to one backend section, ``slurm:`` or
``kubernetes:`` (the same schema as today's single sections), with its own ``rates`` / ``rate_card`` and
``waiting_budget_seconds``. With ``clusters:`` given, ``backend: auto`` asks every cluster (and local, when
enabled) for its state and places each unit by :func:`dagster_gpu.fleet.placement.decide_fleet`; a cluster that
cannot be asked is logged with the error and skipped. ``backend: slurm`` / ``kubernetes`` (or the step's
``dagster-gpu/backend`` tag) restricts the choice to clusters of that kind. Without ``clusters:`` nothing changes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import dagster as dg

from dagster_gpu.core.request import TAG_ASSET_KEY
from dagster_gpu.executor.auto import STATE_TYPES, checkpoint_records, step_size
from dagster_gpu.executor.registry import BACKENDS
from dagster_gpu.fleet.config import REMOTE
from dagster_gpu.fleet.placement import decide_fleet
from dagster_gpu.fleet.state import ClusterState, FleetSnapshot
from dagster_gpu.instance.history import runtime_model
from dagster_gpu.instance.preemption import with_learned_rates
from dagster_gpu.policy.placement import Placement
from dagster_gpu.policy.runtime import RuntimeModel
from dagster_gpu.policy.snapshot import Snapshot

log = logging.getLogger(__name__)


def clusters_field() -> dg.Field:
    """The ``clusters:`` field of gpu_executor's config: name -> one backend section, rates, waiting budget."""
    entry = {kind: dg.Field(BACKENDS[kind].config_field().config_type, is_required=False,
                            description=f"This cluster's {kind} settings (the same keys as gpu_executor's `{kind}:`).")
             for kind in REMOTE}
    entry["rates"] = dg.Field(dg.Map(str, float), is_required=False,
                              description="This cluster's USD per GPU-hour by device type (`default` for the rest); "
                                          "default: the rate card's table of its kind.")
    entry["rate_card"] = dg.Field(dg.StringSource, is_required=False,
                                  description="A rate card YAML whose table named after this cluster (else of its kind) prices it.")
    entry["waiting_budget_seconds"] = dg.Field(
        dg.Noneable(float), is_required=False,
        description="Seconds a unit may wait in this cluster's queue before it spills over to another that starts it "
                    "sooner (null: no budget).")
    return dg.Field(dg.Map(str, dg.Shape(entry)), is_required=False,
                    description="A fleet: named Slurm and Kubernetes clusters, each with exactly one of `slurm:` or "
                                "`kubernetes:`, placed over by the cost policy (see docs/how-to/fleet.md).")


def gather_fleet(handler, names) -> FleetSnapshot:
    """Ask each cluster in ``names`` (``local`` included when listed) for its state; a cluster that raises is
    recorded unreachable with the error (and logged), so the policy skips it."""
    out = []
    for name in names:
        kind = handler.cluster_kind(name)
        try:
            state = handler.backend(name).policy_state()
        except Exception as e:  # unreachable controller, bad credentials, ...
            reason = f"{type(e).__name__}: {e}"
            log.warning("dagster-gpu: cluster %s (%s) skipped: %s", name, kind, reason)
            state = STATE_TYPES[kind](reachable=False, reason=reason)
        out.append(ClusterState(name, kind, state, handler.waiting_budget_s(name)))
    return FleetSnapshot(rate_card=handler.rate_card, clusters=tuple(out), taken_at=time.time())


def with_learned_fleet_rates(instance, fleet: FleetSnapshot) -> FleetSnapshot:
    """Each cluster's preemption rate learned from the instance, as for one cluster per backend (as it is without
    an instance)."""
    if instance is None:
        return fleet
    out = []
    for c in fleet.clusters:
        snap = with_learned_rates(instance, Snapshot(rate_card=fleet.rate_card, **{c.kind: c.state}))
        out.append(replace(c, state=snap.backend(c.kind)))
    return replace(fleet, clusters=tuple(out))


def fleet_placement(handler, request, ctx, step_key: str, partition_keys=(), force: str | None = None) -> Placement:
    """The cost policy's placement of one step over the handler's fleet (``force``: a kind or a cluster)."""
    tags = dict(ctx.step_tags.get(step_key, {}))
    fleet = with_learned_fleet_rates(ctx.instance, gather_fleet(handler, handler.candidates))
    asset_key = tags.get(TAG_ASSET_KEY)
    model = runtime_model(ctx.instance, asset_key) if asset_key else RuntimeModel.from_history([])
    model = replace(model, checkpoint_records=checkpoint_records(tags))
    return decide_fleet(request, step_size(tags, partition_keys), fleet, model=model, force=force)
