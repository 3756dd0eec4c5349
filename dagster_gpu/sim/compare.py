"""Run one scenario under every policy side by side, plus the oracle (pure).

Policies: ``slurm-arrays`` (always Slurm), ``k8s-resident`` (resident pods), ``k8s-dra`` (always a
Kubernetes DRA claim per step, whole GPU), ``ours`` (the real policy), and the oracle (see
:mod:`dagster_gpu.sim.oracle`; exact when the instance is small enough, else a lower bound).
"""

from __future__ import annotations

from dataclasses import dataclass

from dagster_gpu.sim.engine import SimResult, simulate
from dagster_gpu.sim.metrics import Figures, figures
from dagster_gpu.sim.model import Scenario
from dagster_gpu.sim.oracle import OracleResult, lower_bound, search
from dagster_gpu.sim.policies import AlwaysBackend, Ours, OursFleet, ResidentPods


@dataclass
class Comparison:
    scenario: Scenario
    figures: dict[str, Figures]
    results: dict[str, SimResult]
    oracle: OracleResult

    @property
    def ratio(self) -> float:
        """Our cost ÷ the oracle's."""
        o = self.oracle.cost_usd
        return self.figures["ours"].cost_usd / o if o > 0 else float("nan")

    @property
    def misses_oracle_avoids(self) -> int:
        return max(0, self.figures["ours"].deadline_misses - self.oracle.deadline_misses)


def baselines(sc: Scenario):
    pols = [AlwaysBackend("slurm", "slurm-arrays"), ResidentPods(), AlwaysBackend("kubernetes", "k8s-dra"), Ours()]
    return pols


def fleet_baselines(sc: Scenario):
    """A fleet's policies: each cluster alone (``always-<cluster>``), ours without spill-over, ours."""
    return [*(AlwaysBackend(c.name) for c in sc.clusters), OursFleet("ours-no-spill", spill_over=False), OursFleet()]


def compare(sc: Scenario, exact_max_tasks: int = 10, max_leaves: int = 50_000, fleet: bool = False) -> Comparison:
    """``fleet``: the scenario's clusters are a fleet of named clusters (:func:`fleet_baselines`)."""
    results, figs = {}, {}
    for p in (fleet_baselines(sc) if fleet else baselines(sc)):
        if isinstance(p, AlwaysBackend) and sc.cluster(p.backend) is None:
            continue
        r = simulate(sc, p)
        results[p.name], figs[p.name] = r, figures(r, sc.rate_card)
    if len(sc.tasks) <= exact_max_tasks:
        ours = {i: (o.cluster, o.device, o.product) for i, o in results["ours"].outcomes.items()}
        orc = search(sc, [ours], max_leaves=max_leaves)
    else:
        orc = lower_bound(sc)
    return Comparison(sc, figs, results, orc)
