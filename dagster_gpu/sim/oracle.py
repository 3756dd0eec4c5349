"""The oracle: the best the simulator allows, knowing the whole future (pure).

Two modes, always labelled in the output:

- ``exact``: branch-and-bound over every assignment of each partition to a ``(backend, device)``
  option (the space every non-resident policy here draws from: a decision made once per run at its
  arrival, dispatched by the same simulator, a run's partitions on one pool formed into work units by
  the same rule as ours, :func:`dagster_gpu.sim.engine.form_units`). Objective: fewest deadline
  misses, then least cost. Every leaf is simulated in full (so queueing, throttles, preemptions and
  outages are exact). A partial assignment is pruned when the incumbent misses no deadline and the
  partial's cost lower bound — Σ chosen options' figure + Σ remaining partitions' cheapest figure — is
  not below the incumbent's cost, where a partition's figure is ``rate · (start-up + per_partition +
  work) / 3600`` when it is a run of its own and ``rate · (per_partition + work) / 3600`` in a ranged run
  (whose start-up it may share) — valid: preemption only adds. The search is seeded with the given
  incumbents (ours among them, so oracle ≤ ours). It is *not* optimal over schedules the simulator
  cannot express (holding a ready step back, reordering a queue, other ways to cut a run into units).
- ``lower-bound`` (instances too large to search, or when ``max_leaves`` is hit): cost ≥ Σ over runs
  of one partition of the cheapest option that could meet its deadline on an idle fleet (else the
  cheapest option), + Σ over ranged runs of (Σ partitions' cheapest such ``rate · (per_partition +
  work)`` + the cheapest start-up any unit of the run pays: each run has at least one unit); misses ≥
  partitions that no option can finish in time even on an idle fleet (alone, first in a unit). A
  proven bound, usually not attainable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dagster_gpu.policy.runtime import StepSize
from dagster_gpu.sim.engine import simulate
from dagster_gpu.sim.metrics import figures
from dagster_gpu.sim.model import Scenario, Task
from dagster_gpu.sim.policies import Fixed, options

Option = tuple[str, str, str]


@dataclass(frozen=True)
class OracleResult:
    kind: str  # "exact" or "lower-bound"
    cost_usd: float
    deadline_misses: int
    assignment: dict[int, Option] | None
    leaves: int


def _unit(sc: Scenario, opt: Option):
    c = sc.cluster(opt[0])
    return c, next(u for u in c.units if u.key == opt[1:])


def _rate(sc: Scenario, opt: Option) -> float:
    _c, u = _unit(sc, opt)
    return sc.rate_card.rate(opt[0], u.device, parent_product=u.product)


def marginal(sc: Scenario, task: Task, opt: Option) -> float:
    """USD ``task`` adds to a unit on ``opt`` beyond its start-up: ``rate · (per_partition + work) / 3600``."""
    _c, u = _unit(sc, opt)
    work = sc.model.per_partition_s + sc.model.runtime_s(StepSize(rows=task.rows), u.product, u.fraction)
    return _rate(sc, opt) * work / 3600.0


def one_run(sc: Scenario, task: Task, opt: Option) -> tuple[float, float]:
    """(cost USD, finish s after arrival on an idle fleet) of ``task`` alone in a unit on ``opt``."""
    c, u = _unit(sc, opt)
    held = c.billed_overhead_s + sc.model.per_partition_s + sc.model.runtime_s(StepSize(rows=task.rows), u.product,
                                                                               u.fraction)
    return _rate(sc, opt) * held / 3600.0, c.launch_latency_s + held


def _bound_cost(sc: Scenario, task: Task, opt: Option, ranged: bool) -> float:
    return marginal(sc, task, opt) if ranged else one_run(sc, task, opt)[0]


def lower_bound(sc: Scenario) -> OracleResult:
    cost, misses = 0.0, 0
    for run in sc.runs():
        ranged = len(run) > 1
        for t in run:
            opts = options(sc, t)
            figs = [(_bound_cost(sc, t, o, ranged), one_run(sc, t, o)[1]) for o in opts]
            ok = [c for c, f in figs if t.deadline_s is None or f <= t.deadline_s + 1e-6]
            if not ok:
                misses += 1
            cost += min(ok or [c for c, _ in figs])
        if ranged:
            cost += min(_rate(sc, o) * _unit(sc, o)[0].billed_overhead_s / 3600.0 for o in options(sc, run[0]))
    return OracleResult("lower-bound", cost, misses, None, 0)


def _evaluate(sc: Scenario, assignment: dict[int, Option]) -> tuple[int, float]:
    f = figures(simulate(sc, Fixed(dict(assignment))), sc.rate_card)
    return f.deadline_misses, f.cost_usd


def search(sc: Scenario, incumbents: list[dict[int, Option]] = (), max_leaves: int = 50_000) -> OracleResult:
    """Exact branch-and-bound (see module docstring); falls back to :func:`lower_bound` past ``max_leaves``."""
    tasks = sorted(sc.tasks, key=lambda t: (t.arrival_s, t.id))
    ranged = {t.id for run in sc.runs() if len(run) > 1 for t in run}
    opts = []
    for t in tasks:
        figs = [(x, _bound_cost(sc, t, x, t.id in ranged)) for x in options(sc, t)]
        opts.append(sorted(figs, key=lambda xc: xc[1]))
    rest = [0.0] * (len(tasks) + 1)
    for i in range(len(tasks) - 1, -1, -1):
        rest[i] = rest[i + 1] + opts[i][0][1]
    best: list = [(math.inf, math.inf), None]
    for a in incumbents:
        v = _evaluate(sc, a)
        if v < best[0]:
            best[:] = [v, dict(a)]
    leaves = 0
    cur: dict[int, Option] = {}

    def dfs(i: int, lb: float) -> bool:
        nonlocal leaves
        if best[0][0] == 0 and lb + rest[i] >= best[0][1] - 1e-9:
            return True
        if i == len(tasks):
            leaves += 1
            if leaves > max_leaves:
                return False
            v = _evaluate(sc, cur)
            if v < best[0]:
                best[:] = [v, dict(cur)]
            return True
        for opt, c in opts[i]:
            cur[tasks[i].id] = opt
            if not dfs(i + 1, lb + c):
                return False
        del cur[tasks[i].id]
        return True

    if not dfs(0, 0.0):
        return lower_bound(sc)
    return OracleResult("exact", best[0][1], best[0][0], best[1], leaves)
