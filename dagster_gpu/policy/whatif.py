"""What-if (pure): the plan a backfill of given partitions would get in each mode, without launching anything.

Each mode (``auto`` = the policy, ``slurm``, ``kubernetes``) plans the partitions in key order on its own
copy of the snapshot, each placement consuming a free device or queueing behind the previous ones
(:func:`dagster_gpu.policy.snapshot.after_submit`), in runs of ``per_run`` partitions (the asset's
``max_partitions_per_run``), each run one work unit placed as the executor places a ranged step. A
partition's cost is its share (by bytes) of its unit's. The command that lists a corpus, reads live state
and prints these plans is :mod:`dagster_gpu.commands.whatif` (``dagster-gpu whatif``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

from dagster_gpu.core.request import BACKENDS, GpuRequest
from dagster_gpu.policy.forced import forced_backend
from dagster_gpu.policy.placement import Placement
from dagster_gpu.policy.policy import NoFeasiblePlacement, decide
from dagster_gpu.policy.runtime import RuntimeModel, StepSize
from dagster_gpu.policy.snapshot import Snapshot, after_submit

MODES = ("auto", "slurm", "kubernetes")


@dataclass(frozen=True)
class PlanRow:
    """One partition's plan in one mode; ``placement`` None when infeasible (``error`` says why).

    ``unit``: the index of the work unit (a ranged run's one step) that embeds it; the unit's placement is
    shared by its partitions, ``share`` is this partition's fraction of the unit's cost (by bytes)."""

    partition: str
    size_bytes: int
    placement: Placement | None
    error: str = ""
    unit: int = 0
    share: float = 1.0

    @property
    def cost_usd(self) -> float | None:
        """This partition's share of its unit's estimated cost in USD; None when infeasible."""
        a = self.placement.chosen if self.placement else None
        return a.cost_usd * self.share if a else None

    @property
    def preemption_cost_usd(self) -> float | None:
        """This partition's share of its unit's expected preemption cost in USD (part of :attr:`cost_usd`):
        0.0 on a pool that is not preemptible, None when infeasible."""
        a = self.placement.chosen if self.placement else None
        return (a.expected_preemption_cost_usd or 0.0) * self.share if a else None


@dataclass(frozen=True)
class PlanTotals:
    """One mode's plan summed over its partitions.

    ``cost_usd``: the sum of the feasible partitions' costs (USD; not a total when ``infeasible`` > 0);
    ``infeasible``: partitions with no placement; ``last_finish_s``: the latest estimated finish (seconds
    from now; 0 when none is feasible); ``deadline_misses``: placed partitions whose unit misses its
    deadline; ``backends``: partitions per chosen backend; ``first_error``: why the first infeasible
    partition could not be placed (at most 80 characters); ``preemption_cost_usd``: the part of ``cost_usd``
    that is expected preemption rework (USD)."""

    cost_usd: float
    infeasible: int
    last_finish_s: float
    deadline_misses: int
    backends: dict[str, int] = field(default_factory=dict)
    first_error: str = ""
    preemption_cost_usd: float = 0.0


def plan(
    partitions: Sequence[tuple[str, int]], request: GpuRequest, snapshot: Snapshot, model: RuntimeModel, mode: str,
    per_run: int = 1,
) -> list[PlanRow]:
    """Plan the partitions (``(key, size in bytes)``) in order under ``mode`` (``auto`` or a forced
    backend) as a backfill runs them: runs of up to ``per_run`` consecutive partitions (the asset's
    ``max_partitions_per_run``), each one work unit placed as the executor places a ranged step
    (``decide`` on ``StepSize.for_range``: one start-up, a per-partition overhead each). ``auto`` forces
    what the executor forces (:func:`~dagster_gpu.policy.forced.forced_backend`: the step's tag, or the
    only backend in the snapshot). Pure. Raises ValueError when ``per_run`` < 1."""
    if per_run < 1:
        raise ValueError(f"per_run must be at least 1, got {per_run}")
    rows = []
    snap = snapshot
    how = None
    if mode == "auto":
        how = forced_backend(request, "auto", [b for b in BACKENDS if snapshot.backend(b) is not None])
        force = how.backend if how else None
    else:
        force = mode
    for unit, start in enumerate(range(0, len(partitions), per_run)):
        chunk = partitions[start:start + per_run]
        size = StepSize(bytes=chunk[0][1]) if len(chunk) == 1 else StepSize.for_range([b for _, b in chunk])
        total = sum(b for _, b in chunk)
        shares = [(b / total) if total else 1.0 / len(chunk) for _, b in chunk]
        try:
            p = decide(request, size, snap, model=model, force=force)
            if mode == "auto" and how is not None:  # say why as the executor does ("the only configured backend")
                p = replace(p, reason=how.reason)
        except NoFeasiblePlacement as e:
            rows += [PlanRow(key, b, None, str(e), unit, sh) for (key, b), sh in zip(chunk, shares)]
            continue
        rows += [PlanRow(key, b, p, "", unit, sh) for (key, b), sh in zip(chunk, shares)]
        snap = after_submit(snap, p.backend, p.device, p.product)
    return rows


def totals(rows: Sequence[PlanRow]) -> PlanTotals:
    """The :class:`PlanTotals` of one mode's rows (as :func:`plan` returns them). Pure."""
    backends: dict[str, int] = {}
    for r in rows:
        if r.placement:
            backends[r.placement.backend] = backends.get(r.placement.backend, 0) + 1
    return PlanTotals(
        cost_usd=sum(r.cost_usd or 0.0 for r in rows),
        infeasible=sum(1 for r in rows if r.placement is None),
        last_finish_s=max((r.placement.chosen.finish_s for r in rows if r.placement and r.placement.chosen),
                          default=0.0),
        deadline_misses=sum(1 for r in rows if r.placement and not r.placement.deadline_met),
        backends=backends,
        first_error=next((r.error for r in rows if r.placement is None and r.error), "")[:80],
        preemption_cost_usd=sum(r.preemption_cost_usd or 0.0 for r in rows),
    )
