"""A fleet: any number of named clusters (Slurm or Kubernetes) plus local, under one cost policy (pure).

- :mod:`~dagster_gpu.fleet.config`: the ``clusters:`` section of gpu_executor's config read into
  :class:`ClusterConfig` records (today's single ``slurm``/``kubernetes`` sections become clusters of those names);
- :mod:`~dagster_gpu.fleet.state`: :class:`ClusterState` and :class:`FleetSnapshot`, the policy's input;
- :mod:`~dagster_gpu.fleet.placement`: :func:`decide_fleet`, the placement over every (cluster, pool) pair;
- :mod:`~dagster_gpu.fleet.budget`: waiting budgets: when a unit queued on one cluster spills over to another.
"""

from dagster_gpu.fleet.budget import SpillDecision, spill_decision
from dagster_gpu.fleet.config import ClusterConfig, FleetConfigError, fleet_from_config, fleet_rate_card
from dagster_gpu.fleet.placement import decide_fleet, fleet_alternatives
from dagster_gpu.fleet.state import ClusterState, FleetSnapshot

__all__ = [
    "ClusterConfig", "ClusterState", "FleetConfigError", "FleetSnapshot", "SpillDecision", "decide_fleet",
    "fleet_alternatives", "fleet_from_config", "fleet_rate_card", "spill_decision",
]
