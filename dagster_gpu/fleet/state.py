"""The fleet's live state, as the cost policy reads it (pure data, no I/O).

Each cluster's backend fills its :class:`~dagster_gpu.policy.snapshot.BackendState` exactly as it does for a
one-cluster config (``policy_state()``); the fleet adds the cluster's name, its kind and its waiting budget.
Rates are the fleet's :class:`~dagster_gpu.billing.ratecard.RateCard`, whose tables are keyed by *cluster
name* (:func:`dagster_gpu.fleet.config.fleet_rate_card`): ``local``, and a cluster named ``slurm`` or
``kubernetes`` (today's single sections), price from the card's tables of those names.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.policy.snapshot import BackendState, Snapshot

KINDS = ("slurm", "kubernetes", "local")


@dataclass(frozen=True)
class ClusterState:
    """One cluster of the fleet now.

    Attributes:
        name: the cluster's name in gpu_executor's ``clusters:`` (``local`` for the run worker's host).
        kind: ``slurm``, ``kubernetes`` or ``local``: the backend that runs its units.
        state: what its backend reported (an unreachable one: ``reachable=False`` and the error as ``reason``).
        waiting_budget_s: seconds a unit may wait in this cluster's queue before it spills over (None: no budget).
    """

    name: str
    kind: str
    state: BackendState
    waiting_budget_s: float | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"cluster {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")


@dataclass(frozen=True)
class FleetSnapshot:
    """Every cluster's state at one instant and the rates by cluster name.

    Attributes:
        rate_card: USD per GPU-hour, one table per cluster name.
        clusters: in the configured order (``local`` first when configured); ties go to the earlier one.
        taken_at: wall-clock UNIX seconds (informational; the policy never reads a clock).
    """

    rate_card: RateCard
    clusters: tuple[ClusterState, ...]
    taken_at: float = 0.0

    def cluster(self, name: str) -> ClusterState | None:
        return next((c for c in self.clusters if c.name == name), None)

    def snapshot_of(self, name: str) -> Snapshot:
        """A one-backend :class:`Snapshot` of cluster ``name``: its state under its kind, its own rate table
        under the kind's name (so :func:`dagster_gpu.policy.policy.alternatives` prices it unchanged).
        Raises KeyError for an unknown cluster."""
        c = self.cluster(name)
        if c is None:
            raise KeyError(f"no cluster {name!r} in the fleet ({', '.join(x.name for x in self.clusters)})")
        card = RateCard({c.kind: self.rate_card.table(c.name)}, source=f"{self.rate_card.source}: {c.name}")
        return Snapshot(rate_card=card, taken_at=self.taken_at, **{c.kind: c.state})

    def with_state(self, name: str, state: BackendState) -> "FleetSnapshot":
        return replace(self, clusters=tuple(replace(c, state=state) if c.name == name else c for c in self.clusters))

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> "FleetSnapshot":
        """The fleet of a one-cluster-per-backend :class:`Snapshot` (clusters named after their backends)."""
        return cls(rate_card=snapshot.rate_card, taken_at=snapshot.taken_at, clusters=tuple(
            ClusterState(k, k, snapshot.backend(k)) for k in ("local", "slurm", "kubernetes")
            if snapshot.backend(k) is not None))
