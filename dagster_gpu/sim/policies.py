"""Placement policies replayed by the simulator (each decides once, at a step's arrival).

- :class:`AlwaysBackend` ("always Slurm arrays", "always Kubernetes DRA claim per step"): the first
  pool of that backend that fits the request (full GPUs before MIG slices unless ``allow_mig``),
  whatever the backend's state — an outage just delays the submission.
- :class:`ResidentPods` ("always Kubernetes resident pods", the article's resident deployment): steps
  queue on devices held for the whole window.
- :class:`Ours`: the real policy on the snapshot the simulator builds: :func:`dagster_gpu.policy.plan_range`
  for each run (one partition or a ranged run), which plans its work units largest first.
- :class:`OursFleet`: the real fleet policy (:func:`dagster_gpu.fleet.placement.decide_fleet`) over every named
  cluster, and, for a unit still queued past its cluster's waiting budget, the real spill-over decision
  (:func:`dagster_gpu.fleet.budget.spill_decision`); ``spill_over=False`` keeps every unit where it was placed.
- :class:`Fixed`: a given assignment (used by the oracle).

Except ``Ours``, the policies place each partition and the engine forms a run's work units
(:func:`dagster_gpu.sim.engine.form_units`, the same rule as ``plan_range``'s).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from dagster_gpu.fleet.budget import spill_decision
from dagster_gpu.fleet.placement import decide_fleet
from dagster_gpu.policy.policy import _fit, decide
from dagster_gpu.policy.ranges import plan_range
from dagster_gpu.policy.runtime import StepSize
from dagster_gpu.policy.snapshot import DeviceGroup
from dagster_gpu.sim.engine import Option, Simulation
from dagster_gpu.sim.model import Scenario, Task, Units


def _pool(u: Units) -> DeviceGroup:
    return DeviceGroup(u.device, u.product, u.memory_gib, u.count, u.count, mig_profile=u.mig_profile)


def options(scenario: Scenario, task: Task) -> list[tuple[str, str, str]]:
    """Every ``(cluster, device, product)`` whose devices fit ``task``'s request (static: ignores state)."""
    out = []
    for c in scenario.clusters:
        for u in c.units:
            opt = (c.name, u.device, u.product)
            if opt not in out and not _fit(task.req(), _pool(u)):
                out.append(opt)
    return out


@dataclass
class AlwaysBackend:
    backend: str
    name: str = ""
    allow_mig: bool = False
    resident: bool = False

    def __post_init__(self):
        self.name = self.name or f"always-{self.backend}"

    def place(self, task: Task, sim: Simulation) -> tuple[str, str, str]:
        c = sim.sc.cluster(self.backend)
        fits = [u for u in c.units if not _fit(task.req(), _pool(u)) and (self.allow_mig or not u.mig_profile)]
        if not fits:
            raise ValueError(f"{self.name}: no device of {self.backend} fits task {task.id}")
        return (self.backend, fits[0].device, fits[0].product)


@dataclass
class ResidentPods:
    name: str = "k8s-resident"
    resident: bool = True

    def place(self, task: Task, sim: Simulation) -> tuple[str, str, str]:
        r = sim.sc.resident
        return ("resident", r.key[0], r.key[1])


@dataclass
class Ours:
    name: str = "ours"
    resident: bool = False
    decisions: list = field(default_factory=list)

    def place(self, task: Task, sim: Simulation) -> tuple[str, str, str]:
        p = decide(task.req(), StepSize(rows=task.rows), sim.snapshot(), model=sim.sc.model)
        self.decisions.append(p)
        return (p.backend, p.device, p.product)

    def place_run(self, tasks: tuple[Task, ...], sim: Simulation) -> list[tuple[Option, list[Task]]]:
        """The run's units as :func:`plan_range` plans them (largest partition first)."""
        plan = plan_range(tasks[0].req(), StepSize.for_range([StepSize(rows=t.rows) for t in tasks]), sim.snapshot(),
                          model=sim.sc.model)
        self.decisions.append(plan)
        return [((u.backend, u.device, u.product), [tasks[i] for i in u.partitions]) for u in plan.units]


@dataclass
class OursFleet:
    name: str = "ours"
    resident: bool = False
    spill_over: bool = True
    decisions: list = field(default_factory=list)

    def place(self, task: Task, sim: Simulation) -> tuple[str, str, str]:
        p = decide_fleet(task.req(), StepSize(rows=task.rows), sim.fleet_snapshot(), model=sim.sc.model)
        self.decisions.append(p)
        return (p.cluster, p.device, p.product)

    def spill(self, task: Task, cluster: str, waited_s: float, remaining_s: float | None,
              sim: Simulation) -> tuple[str, str, str] | None:
        """Where a unit (first partition ``task``) queued on ``cluster`` for ``waited_s`` goes, None: it stays.
        Its deadline counts from now: what is left of it."""
        if not self.spill_over:
            return None
        req = task.req()
        if req.deadline_s is not None:
            req = replace(req, deadline_s=max(0.0, req.deadline_s - (sim.now - task.arrival_s)))
        d = spill_decision(req, StepSize(rows=task.rows), sim.fleet_snapshot(), cluster=cluster, waited_s=waited_s,
                           budget_s=sim.sc.cluster(cluster).waiting_budget_s, remaining_wait_s=remaining_s,
                           model=sim.sc.model)
        self.decisions.append(d)
        return (d.placement.cluster, d.placement.device, d.placement.product) if d.spill else None


@dataclass
class Fixed:
    assignment: dict[int, tuple[str, str, str]]
    name: str = "fixed"
    resident: bool = False

    def place(self, task: Task, sim: Simulation) -> tuple[str, str, str]:
        return self.assignment[task.id]
