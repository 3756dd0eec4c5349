"""Placement: where a step runs, why, and what the alternatives would have cost.

The executor's entry point is :func:`choose_placement`; the pure rule is :func:`decide`
(``dagster_gpu.policy.policy``); the backends fill :class:`Snapshot` (``dagster_gpu.policy.snapshot``).
A ranged step (several partitions, issue 8) is sized with ``StepSize.for_range``; :func:`plan_range`
(``dagster_gpu.policy.ranges``) spreads it over work units, largest partition first.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Sequence

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.core.request import GpuRequest
from dagster_gpu.policy.forced import ForcedBackend, forced_backend
from dagster_gpu.policy.placement import Alternative, Placement
from dagster_gpu.policy.policy import NoFeasiblePlacement, PolicyConfig, alternatives, decide
from dagster_gpu.policy.ranges import RangePlan, UnitPlan, plan_largest_first, plan_range
from dagster_gpu.policy.runtime import HistoryPoint, RuntimeModel, StepSize
from dagster_gpu.policy.snapshot import (
    BackendState,
    DeviceGroup,
    KubernetesState,
    LocalState,
    SlurmState,
    Snapshot,
    after_submit,
)


def choose_placement(
    request: GpuRequest,
    step_size: StepSize | int | Sequence[StepSize | int | None],
    snapshot: Snapshot,
    rate_card: RateCard | None = None,
    history: Iterable[HistoryPoint] | RuntimeModel | None = None,
    force: str | None = None,
) -> Placement:
    """Adapter for the executor: the placement of one step.

    Args:
        request: ``GpuRequest.from_tags(step tags)``.
        step_size: a :class:`StepSize`, the partition's corpus size in bytes (int), or a ranged step's
            partition sizes (a sequence of those or None; the range is placed as one work unit).
        snapshot: filled by the backends (``rate_card``, when given, replaces the snapshot's).
        history: earlier materializations (``dagster_gpu.instance.history.fetch_history``) or a ready
            :class:`RuntimeModel`; None = the stated fallback throughput.
        force: the executor config's backend when it is not ``auto`` (a ``dagster-gpu/backend`` tag wins:
            :func:`~dagster_gpu.policy.forced.forced_backend`).

    Raises:
        NoFeasiblePlacement: no backend can run the step (message lists each backend's reason).
    """
    if isinstance(step_size, int):
        step_size = StepSize(bytes=step_size)
    elif not isinstance(step_size, StepSize):
        step_size = StepSize.for_range(step_size)
    if rate_card is not None:
        snapshot = replace(snapshot, rate_card=rate_card)
    model = history if isinstance(history, RuntimeModel) else RuntimeModel.from_history(history or ())
    return decide(request, step_size, snapshot, model=model, force=force)


__all__ = [
    "Alternative", "BackendState", "DeviceGroup", "ForcedBackend", "GpuRequest", "HistoryPoint", "KubernetesState", "LocalState",
    "NoFeasiblePlacement", "Placement", "PolicyConfig", "RangePlan", "RuntimeModel", "SlurmState", "Snapshot",
    "StepSize", "UnitPlan", "after_submit", "alternatives", "choose_placement", "decide", "forced_backend", "plan_largest_first",
    "plan_range",
]
