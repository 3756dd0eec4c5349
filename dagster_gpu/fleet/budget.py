"""Waiting budgets: when a unit queued on one cluster is withdrawn and placed on another (pure).

The idea and the name are Starburst's (Luo et al., "Starburst: A Cost-aware Scheduler for Hybrid Cloud",
USENIX ATC 2024, https://www.usenix.org/conference/atc24/presentation/luo): a job waits for the cheaper
cluster up to a *waiting budget*, and that budget grows with the job's size (Starburst's compute-weighted
waiting: a large job waits longer, since the cloud would cost it more), so the cheap cluster stays busy
and the dearer one is paid only for the wait it saves. Here a unit's budget is, in order:

1. an explicit number of seconds (the cluster's ``waiting_budget_seconds``, or a per-asset / per-run value);
2. derived from the unit's deadline: ``deadline - (launch + runtime)`` of its own placement, what it may still
   wait and finish in time (never below 0);
3. ``factor × runtime`` (Starburst's compute-weighted form, ``factor`` per GPU of the request: a unit of
   count ``n`` GPUs waits ``factor × n × runtime``);
4. none: the unit waits in its queue as long as it takes.

Spilling (:func:`spill_decision`): once the unit has waited past its budget, the fleet's placement is asked
again with the cluster it waits on excluded; the unit moves only when that placement is expected to *start*
sooner than the unit's remaining wait where it is (unknown remaining wait: any other start is sooner), and,
for a unit with a deadline, only when staying would miss it (a unit placed knowingly into a queue that still
delivers in time stays: moving it would only pay a dearer cluster). ``deadline_s`` of the request is what is
left of the deadline at the time of the decision. The
move itself (cancel the queued task, confirm it is gone, only then launch elsewhere; a task that started
meanwhile stays and the move is dropped) is the caller's: this module decides, it never acts.
"""

from __future__ import annotations

from dataclasses import dataclass

from dagster_gpu.core.request import GpuRequest
from dagster_gpu.fleet.placement import decide_fleet
from dagster_gpu.fleet.state import FleetSnapshot
from dagster_gpu.policy.placement import Placement
from dagster_gpu.policy.policy import NoFeasiblePlacement
from dagster_gpu.policy.runtime import RuntimeModel, StepSize


def waiting_budget_s(*, seconds: float | None = None, deadline_s: float | None = None, launch_s: float = 0.0,
                     runtime_s: float | None = None, factor: float | None = None, gpus: float = 1.0) -> float | None:
    """A unit's waiting budget in seconds by the module docstring's order; None: no budget.

    Args:
        seconds: an explicit budget (>= 0).
        deadline_s: the unit's deadline in seconds from its launch (None: batch).
        launch_s, runtime_s: its placement's launch latency and expected runtime (seconds).
        factor: seconds of waiting allowed per second of runtime per GPU (Starburst's compute-weighted budget).
        gpus: GPUs the unit holds (count × device fraction).
    """
    if seconds is not None:
        return max(0.0, float(seconds))
    if deadline_s is not None and runtime_s is not None:
        return max(0.0, deadline_s - launch_s - runtime_s)
    if factor is not None and runtime_s is not None:
        return max(0.0, factor * gpus * runtime_s)
    return None


@dataclass(frozen=True)
class SpillDecision:
    """Whether a queued unit moves.

    Attributes:
        spill: True: withdraw it from ``from_cluster`` and launch it on ``placement.cluster``.
        from_cluster: the cluster it waits on.
        placement: where it goes (None when it stays).
        reason: one sentence: the wait, the budget and the comparison that decided.
    """

    spill: bool
    from_cluster: str
    placement: Placement | None
    reason: str


def spill_decision(request: GpuRequest, step_size: StepSize, fleet: FleetSnapshot, *, cluster: str, waited_s: float,
                   budget_s: float | None, remaining_wait_s: float | None, model: RuntimeModel | None = None,
                   ) -> SpillDecision:
    """Whether a unit that has waited ``waited_s`` seconds in ``cluster``'s queue should spill over.

    Args:
        budget_s: its waiting budget (:func:`waiting_budget_s`); None: it never spills.
        remaining_wait_s: expected seconds until it starts where it is (the cluster's start estimate for it);
            None when unknown (the cluster is unreachable or cannot say).
    """
    if budget_s is None:
        return SpillDecision(False, cluster, None, f"no waiting budget on {cluster}: waits as long as it takes")
    if waited_s < budget_s:
        return SpillDecision(False, cluster, None, f"waited {waited_s:.0f} s of its {budget_s:.0f} s budget on {cluster}")
    try:
        p = decide_fleet(request, step_size, fleet, model=model, exclude={cluster})
    except NoFeasiblePlacement as e:
        return SpillDecision(False, cluster, None, f"over its {budget_s:.0f} s budget on {cluster} but no other "
                                                   f"cluster can run it ({e})")
    start = p.chosen.start_delay_s if p.chosen else None
    over = f"waited {waited_s:.0f} s, over its {budget_s:.0f} s budget on {cluster}"
    here = [a.runtime_s for a in p.alternatives if a.cluster == cluster and a.feasible and a.runtime_s is not None]
    dl = request.deadline_s
    if dl is not None and remaining_wait_s is not None and here and remaining_wait_s + min(here) <= dl:
        return SpillDecision(False, cluster, None, f"{over}, but it still finishes within its deadline there "
                                                   f"({remaining_wait_s:.0f} s + {min(here):.0f} s <= {dl:.0f} s)")
    if start is None or (remaining_wait_s is not None and start >= remaining_wait_s):
        left = "unknown" if remaining_wait_s is None else f"{remaining_wait_s:.0f} s"
        return SpillDecision(False, cluster, None, f"{over}, but {p.cluster} would not start it sooner "
                                                   f"({start if start is None else round(start)} s vs {left} left)")
    left = "an unknown wait" if remaining_wait_s is None else f"{remaining_wait_s:.0f} s more"
    return SpillDecision(True, cluster, p, f"{over}: spills over to {p.cluster} (start in {start:.0f} s instead of "
                                           f"{left}); {p.reason}")
