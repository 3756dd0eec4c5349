"""Preemption in the cost policy: a pool's rate learned from observed preemptions, and the rework it costs (pure).

A *preemption pool* is where a scheduler may end our units to make room for others, named by
:func:`pool_key`: a Slurm slurm partition with a QOS (``slurm:<slurm partition>/<qos>``, ``-`` for none), a
Kubernetes priority class (``kubernetes:<priority class>``, ``-`` for the namespace's default), the local host
(``local``). The backend names its pool in ``BackendState.preemption_pool`` and on each launch event.

Rate (preemptions per GPU-hour, GPU-hours as the bills count them: devices × device fraction × seconds / 3600)::

    rate = (prior · H0 + n) / (H0 + H)

``n`` preemptions observed over ``H`` GPU-hours of the pool's units, ``prior`` the configured rate
(``preemptions_per_gpu_hour`` of the backend's settings) and ``H0`` its weight in pseudo GPU-hours
(:data:`PRIOR_GPU_HOURS`). It is the posterior mean of a Poisson rate under the conjugate Gamma(prior · H0, H0)
prior (A. Gelman et al., *Bayesian Data Analysis*, 3rd ed., 2013, §2.6, "Poisson model", and its
"Gamma prior distribution" with the interpretation of α as a prior count over β prior exposure): with no
observation it is the prior, with few it leans on it, with many (``H`` ≫ ``H0``) it is ``n / H``.

Rework of one work unit (seconds billed on top of its runtime)::

    expected preemptions = rate · G                  (G: the unit's GPU-hours without rework)
    rework_s             = expected preemptions · (start_up_s + lost_s)
    lost_s               = Σ_j s_j² / (2 · Σ_j s_j)

``s_j`` are the unit's stretches of embedding that a preemption loses whole: each partition's embedding seconds,
cut into ``checkpoint_s`` pieces when checkpoints are on (:mod:`dagster_gpu.embedding.checkpoint`: a stopped unit
continues after the last committed part, and a rerun skips the partitions the run materialized). A preemption at
a uniformly random instant of the work falls in stretch ``j`` with probability ``s_j / Σ s`` and loses on average
half of it: the length-biased ("inspection paradox") mean of renewal theory (S. Ross, *Introduction to
Probability Models*, §7.7). One partition without checkpoints: ``work / 2``; a long partition with checkpoints:
about ``checkpoint_s / 2``. First-order: rework is itself not exposed again (``rate · G`` ≪ 1 in practice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from dagster_gpu.policy.placement import Alternative

if TYPE_CHECKING:
    from dagster_gpu.policy.snapshot import BackendState, Snapshot

#: Weight of the configured prior rate, in pseudo GPU-hours of observation (``H0`` of the module docstring):
#: after 10 GPU-hours of a pool's own units the observations weigh as much as the prior. A choice, not a measurement.
PRIOR_GPU_HOURS = 10.0


def pool_key(backend: str, *, slurm_partition: str | None = None, qos: str | None = None,
             priority_class: str | None = None) -> str:
    """The preemption pool's name (module docstring): ``slurm:<slurm partition>/<qos>``, ``kubernetes:<priority
    class>``, ``local``; a missing part is ``-``. Raises ValueError for another backend."""
    if backend == "slurm":
        return f"slurm:{slurm_partition or '-'}/{qos or '-'}"
    if backend == "kubernetes":
        return f"kubernetes:{priority_class or '-'}"
    if backend == "local":
        return "local"
    raise ValueError(f"pool_key: unknown backend {backend!r}")


@dataclass(frozen=True)
class PreemptionObservation:
    """What one step (its units on one pool) showed: ``preemptions`` (>= 0) over ``gpu_hours`` (> 0) billed."""

    pool: str
    preemptions: int
    gpu_hours: float


@dataclass(frozen=True)
class PreemptionRate:
    """A pool's rate (module docstring).

    Attributes:
        per_gpu_hour: expected preemptions per GPU-hour (>= 0).
        preemptions, gpu_hours: what was observed (``n``, ``H``); 0 and 0.0 when nothing was.
        prior_per_gpu_hour, prior_gpu_hours: the prior and its weight (``prior``, ``H0``).
    """

    per_gpu_hour: float
    preemptions: int = 0
    gpu_hours: float = 0.0
    prior_per_gpu_hour: float = 0.0
    prior_gpu_hours: float = PRIOR_GPU_HOURS

    @property
    def learned(self) -> bool:
        """True when observations of the pool moved the rate off the prior (any GPU-hour observed)."""
        return self.gpu_hours > 0

    @property
    def source(self) -> str:
        """In words, what ``whatif`` and a placement's reason print."""
        if not self.learned:
            return f"prior {self.prior_per_gpu_hour:g}/GPU-h (no observations)"
        return (f"learned: {self.preemptions} preemption(s) in {self.gpu_hours:.2f} GPU-h, with prior "
                f"{self.prior_per_gpu_hour:g}/GPU-h weighing {self.prior_gpu_hours:g} GPU-h")


def estimate_rate(observations: Iterable[PreemptionObservation], prior_per_gpu_hour: float = 0.0,
                  prior_gpu_hours: float = PRIOR_GPU_HOURS) -> PreemptionRate:
    """``(prior · H0 + n) / (H0 + H)`` over ``observations`` (one pool's; module docstring). Observations with
    no GPU-hours are skipped (their exposure is unknown).

    Raises:
        ValueError: a negative or non-finite prior, a negative weight, or a negative count.
    """
    if not (math.isfinite(prior_per_gpu_hour) and prior_per_gpu_hour >= 0):
        raise ValueError(f"prior preemptions per GPU-hour must be finite and >= 0, got {prior_per_gpu_hour}")
    if not (math.isfinite(prior_gpu_hours) and prior_gpu_hours >= 0):
        raise ValueError(f"prior weight must be finite and >= 0 GPU-hours, got {prior_gpu_hours}")
    n, h = 0, 0.0
    for o in observations:
        if o.preemptions < 0:
            raise ValueError(f"pool {o.pool!r}: negative preemption count {o.preemptions}")
        if o.gpu_hours > 0 and math.isfinite(o.gpu_hours):
            n += o.preemptions
            h += o.gpu_hours
    denom = prior_gpu_hours + h
    rate = (prior_per_gpu_hour * prior_gpu_hours + n) / denom if denom > 0 else prior_per_gpu_hour
    return PreemptionRate(rate, n, h, prior_per_gpu_hour, prior_gpu_hours)


def estimate_rates(observations: Iterable[PreemptionObservation], priors: Mapping[str, float],
                   prior_gpu_hours: float = PRIOR_GPU_HOURS) -> dict[str, PreemptionRate]:
    """:func:`estimate_rate` per pool: every pool in ``priors`` (its prior; 0 for a pool only observed) and every
    observed pool. Raises as :func:`estimate_rate`."""
    by: dict[str, list[PreemptionObservation]] = {p: [] for p in priors}
    for o in observations:
        by.setdefault(o.pool, []).append(o)
    return {p: estimate_rate(obs, float(priors.get(p, 0.0)), prior_gpu_hours) for p, obs in sorted(by.items())}


def lost_work_s(partition_work_s: Sequence[float], checkpoint_s: float | None = None) -> float:
    """Expected embedding seconds one preemption loses: ``Σ s_j² / (2 Σ s_j)`` over the unit's stretches (module
    docstring); ``checkpoint_s`` None or <= 0: no checkpoints (a stretch is a whole partition). 0.0 for no work.

    Raises:
        ValueError: a negative partition work.
    """
    total = 0.0
    squares = 0.0
    for w in partition_work_s:
        if w < 0:
            raise ValueError(f"negative partition work {w}")
        total += w
        if checkpoint_s and checkpoint_s > 0 and w > checkpoint_s:
            full, rest = divmod(w, checkpoint_s)
            squares += full * checkpoint_s * checkpoint_s + rest * rest
        else:
            squares += w * w
    return squares / (2.0 * total) if total > 0 else 0.0


@dataclass(frozen=True)
class Rework:
    """Expected preemption rework of one unit: ``expected_preemptions`` (rate × GPU-hours), ``seconds`` billed on
    top of its runtime, ``lost_s`` (lost embedding seconds per preemption) and ``startup_s`` (per preemption)."""

    expected_preemptions: float
    seconds: float
    lost_s: float
    startup_s: float


NO_REWORK = Rework(0.0, 0.0, 0.0, 0.0)


def expected_rework(rate_per_gpu_hour: float, gpu_hours: float, startup_s: float,
                    partition_work_s: Sequence[float], checkpoint_s: float | None = None) -> Rework:
    """The unit's :class:`Rework` (module docstring): ``rate · gpu_hours`` preemptions, each costing a new
    ``startup_s`` and :func:`lost_work_s`. Rate or GPU-hours <= 0: :data:`NO_REWORK`."""
    if rate_per_gpu_hour <= 0 or gpu_hours <= 0:
        return NO_REWORK
    k = rate_per_gpu_hour * gpu_hours
    lost = lost_work_s(partition_work_s, checkpoint_s)
    return Rework(k, k * (startup_s + lost), lost, startup_s)


def with_rates(snapshot: "Snapshot", observations: Iterable[PreemptionObservation],
               prior_gpu_hours: float = PRIOR_GPU_HOURS) -> "Snapshot":
    """``snapshot`` with each named pool's ``preemptions_per_gpu_hour`` blended with ``observations`` of it
    (:func:`estimate_rate`, the state's own rate as the prior), and its ``preemption_source`` /
    ``preemption_learned`` set. States without a ``preemption_pool`` are left as they are. Pure; raises as
    :func:`estimate_rate`."""
    obs = list(observations)
    out = snapshot
    for name in ("local", "slurm", "kubernetes"):
        st = snapshot.backend(name)
        if st is None or not st.preemption_pool:
            continue
        r = estimate_rate([o for o in obs if o.pool == st.preemption_pool], st.preemptions_per_gpu_hour,
                          prior_gpu_hours)
        out = out.with_backend(name, replace(st, preemptions_per_gpu_hour=r.per_gpu_hour, preemption_source=r.source,
                                             preemption_learned=r.learned))
    return out


def preemption_fields(state: "BackendState", rework: Rework, cost_per_s: float) -> dict:
    """The :class:`Alternative` fields of a unit's expected preemption rework, at ``cost_per_s`` USD per
    billed second; {} when the pool is not preemptible (rate 0)."""
    if state.preemptions_per_gpu_hour <= 0:
        return {}
    return dict(preemptions_per_gpu_hour=state.preemptions_per_gpu_hour,
                preemption_rate_learned=state.preemption_learned, expected_preemptions=rework.expected_preemptions,
                preemption_rework_s=rework.seconds, expected_preemption_cost_usd=cost_per_s * rework.seconds)


def preemption_note(state: "BackendState", rework: Rework, cost_usd: float) -> str:
    """``+N s expected preemption rework (...)`` for an alternative's note; "" when the pool is not preemptible."""
    if state.preemptions_per_gpu_hour <= 0:
        return ""
    return (f"+{rework.seconds:.0f} s expected preemption rework = {cost_usd:.4f} USD "
            f"({rework.expected_preemptions:.3f} preemption(s) at {state.preemptions_per_gpu_hour:.3g}/GPU-h "
            f"{'learned' if state.preemption_learned else 'prior'}, each {rework.startup_s:.0f} s start-up + "
            f"{rework.lost_s:.0f} s lost work)")


def preemption_reason(a: Alternative) -> str:
    """The reason's words for a chosen alternative's expected preemption cost (it has one)."""
    return (f"expected preemption cost {a.expected_preemption_cost_usd:.4f} USD ({a.expected_preemptions:.3f} "
            f"preemption(s) at {a.preemptions_per_gpu_hour:.3g}/GPU-h, "
            f"{'learned' if a.preemption_rate_learned else 'prior'}; included in the cost)")
