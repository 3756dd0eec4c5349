"""The cost policy: where one partition step should run (pure, deterministic, no I/O).

Rule:

1. Candidates are every device pool of every configured backend (plus ``cpu`` for a ``count == 0``
   step). An unreachable backend is skipped with the reason recorded; a pool no device of which can
   satisfy the request (product, memory, MIG acceptability, count, Slurm time limit) is recorded as
   infeasible and never chosen. Exception: an outage whose end is announced (``back_in_s``) keeps the
   backend as a candidate whose start is delayed by ``back_in_s``.
2. For each feasible candidate (all times in seconds from launch, money in USD)::

       start_delay = launch_latency_s + wait_s
       work        = RuntimeModel.runtime_s(size, product, fraction)       (see runtime.py; a range: Σ partitions)
       base        = billed_overhead_s + n · per_partition_s + work         (one start-up per work unit, n =
                     partitions the unit embeds, per_partition_s from the model)
       rework      = λ · G · (billed_overhead_s + lost)                   (preemption: λ = the pool's
                     preemptions per GPU-hour, learned or its prior; G = count · fraction · base / 3600
                     GPU-hours; lost = the work one preemption loses: about half a checkpoint interval
                     with checkpoints, half the partition in flight without: policy/preemption.py)
       runtime     = base + rework                                         (device seconds billed)
       cost        = count · fraction · rate · runtime / 3600             (billing.metering.charge, as the meters
                                                                            bill: rate in USD per GPU-hour, a MIG
                                                                            slice at its parent product's rate)
       finish      = start_delay + runtime

   ``wait_s`` is 0 when the pool has more free devices than our pending requests (and the Slurm array
   throttle has room); else the pool's ``start_estimate_s`` (``sbatch --test-only``, release of our own
   pods); else a queue estimate ``ceil((pending + count - free) / capacity) · runtime`` (each step ahead
   assumed as long as this one; capacity = ``total``, or the throttle if smaller).
3. Choice: among candidates with ``finish <= deadline`` (all of them for ``batch``) the least cost; costs
   within ``PolicyConfig.cost_tie_usd`` tie, and ties go to the earliest finish, then to the fixed
   backend order local, slurm, kubernetes. When none meets the deadline, the earliest finish wins and
   ``Placement.deadline_met`` is False. A forced backend restricts the choice to that backend; the other
   alternatives are still recorded. Which backend is forced (a ``dagster-gpu/backend`` tag, then the
   ``force`` argument) is :func:`dagster_gpu.policy.forced.forced_backend`'s rule.

:class:`NoFeasiblePlacement` is raised when no candidate is feasible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from dagster_gpu.billing.metering import charge
from dagster_gpu.billing.ratecard import RateCardError
from dagster_gpu.core.device_memory import memory_fits
from dagster_gpu.core.request import BACKENDS, GpuRequest
from dagster_gpu.policy.forced import forced_backend
from dagster_gpu.policy.placement import Alternative, Placement
from dagster_gpu.policy.preemption import Rework, expected_rework, preemption_fields, preemption_note, preemption_reason
from dagster_gpu.policy.runtime import RuntimeModel, StepSize
from dagster_gpu.policy.snapshot import (
    BackendState,
    DeviceGroup,
    KubernetesState,
    LocalState,
    QueueState,
    SlurmState,
    Snapshot,
)

ORDER = BACKENDS  # ("local", "slurm", "kubernetes"): tie order, and the order of alternatives


class NoFeasiblePlacement(RuntimeError):
    """No backend can run the step; ``alternatives`` says why for each."""

    def __init__(self, message: str, alternatives: tuple[Alternative, ...]):
        super().__init__(message)
        self.alternatives = alternatives


@dataclass(frozen=True)
class PolicyConfig:
    """Knobs of the policy.

    Attributes:
        cost_tie_usd: costs within this many USD are a tie (then earliest finish wins). Default 1e-6.
        deadline_slack_s: a finish this many seconds past the deadline still counts as meeting it
            (float rounding). Default 1e-6.
    """

    cost_tie_usd: float = 1e-6
    deadline_slack_s: float = 1e-6


DEFAULT_CONFIG = PolicyConfig()
_DEFAULT_MODEL = RuntimeModel()


def _fit(request: GpuRequest, pool: DeviceGroup) -> str:
    """'' if ``pool`` can satisfy ``request``, else why not."""
    if pool.mig_profile:
        if not request.mig_ok:
            return f"MIG slice {pool.mig_profile} not acceptable (dagster-gpu/mig-ok is false)"
        if request.count != 1:
            return f"MIG slices serve single-device requests only (count={request.count})"
    if not memory_fits(pool.memory_gib, request.memory_gib):  # the marketed-size rule (device_memory.py)
        return f"{pool.memory_gib:g} GiB < {request.memory_gib:g} GiB requested"
    if request.product and not pool.product.casefold().startswith(request.product.casefold()):
        return f"product {pool.product!r} does not match {request.product!r}"
    if pool.total < request.count:
        return f"only {pool.total} device(s), {request.count} requested"
    return ""


def _wait(state: BackendState, pool: DeviceGroup, count: int, runtime_s: float) -> tuple[float, str]:
    """Seconds until allocation (excluding launch latency) and how it was estimated."""
    avail = pool.free - pool.pending  # negative: that many of ours queue ahead of a new request
    capacity = pool.total
    queue = state.queue if isinstance(state, KubernetesState) else None
    if queue is not None:
        return _queue_wait(queue, pool, count, runtime_s, avail, capacity)
    if isinstance(state, SlurmState) and state.array_throttle is not None:
        avail = min(avail, state.array_throttle - state.running_tasks - state.pending)
        capacity = min(capacity, state.array_throttle)
    if avail >= count:
        return 0.0, f"{pool.free} free"
    if pool.start_estimate_s is not None:
        return max(0.0, pool.start_estimate_s), f"start estimate {pool.start_estimate_s:.0f} s"
    waves = math.ceil((count - avail) / max(1, capacity))
    return waves * runtime_s, f"queue estimate: {pool.pending} pending, {pool.free} free, {waves} wave(s)"


def _queue_wait(queue: QueueState, pool: DeviceGroup, count: int, runtime_s: float, avail: int,
                capacity: int) -> tuple[float, str]:
    """The wait behind a Kueue LocalQueue: what its ClusterQueue may admit now (own unused quota plus what it may
    borrow) less the workloads pending ahead, bounded by the pool's free devices; else waves of ``runtime_s``
    over the quota it can ever hold (:func:`_never_admitted` rules out a pool it cannot hold at all)."""
    what = queue.describe(pool.device)
    total = queue.quota_total.get(pool.device, 0)
    avail = min(avail, int(queue.quota_free.get(pool.device, 0)) - queue.pending)
    if avail >= count:
        return 0.0, what
    waves = math.ceil((count - avail) / max(1, min(capacity, int(total))))
    return waves * runtime_s, f"{what}: queue estimate {waves} wave(s)"


def _never_admitted(state: BackendState, pool: DeviceGroup, count: int) -> str:
    """Why Kueue can never admit ``count`` devices of ``pool`` for a queued Kubernetes step ("" when it can): the
    ClusterQueue is inactive, or holds less quota for the pool than asked, even borrowing."""
    queue = state.queue if isinstance(state, KubernetesState) else None
    if queue is None:
        return ""
    if not queue.active:
        return f"{queue.describe(pool.device)}: never admitted (the ClusterQueue is inactive)"
    if queue.quota_total.get(pool.device, 0) < count:
        return f"{queue.describe(pool.device)}: never admitted (less quota than {count} device(s))"
    return ""


def unit_runtime_s(state: BackendState, work_s: float, partition_overhead_s: float = 0.0, *, gpus: float = 1.0,
                   partition_work_s: Sequence[float] | None = None, checkpoint_s: float | None = None
                   ) -> tuple[float, Rework]:
    """``(runtime, rework)`` of one work unit on ``state``'s backend: billed seconds, and the expected preemption
    :class:`~dagster_gpu.policy.preemption.Rework` they include (module docstring, rule 2).

    Args:
        work_s: embedding seconds of all its partitions on the chosen device.
        partition_overhead_s: ``n · per_partition_s``.
        gpus: whole-GPU equivalents it holds (count × device fraction): its GPU-hours are ``gpus × base / 3600``.
        partition_work_s: each partition's embedding seconds (default: one partition of ``work_s``).
        checkpoint_s: embedding seconds between checkpoint parts; None: no checkpoints.
    """
    base = state.billed_overhead_s + partition_overhead_s + work_s
    rw = expected_rework(state.preemptions_per_gpu_hour, gpus * base / 3600.0, state.billed_overhead_s,
                         [work_s] if partition_work_s is None else partition_work_s, checkpoint_s)
    return base + rw.seconds, rw


def _evaluate(
    name: str, state: BackendState, pool: DeviceGroup, request: GpuRequest, size: StepSize, model: RuntimeModel,
    snapshot: Snapshot,
) -> Alternative:
    why = _fit(request, pool) or _never_admitted(state, pool, max(1, request.count))
    base = dict(backend=name, device=pool.device, product=pool.product, device_fraction=pool.fraction)
    if why:
        return Alternative(feasible=False, note=why, **base)
    works = [model.runtime_s(p, pool.product, pool.fraction) for p in size.parts]
    work = sum(works)
    gpus = max(1, request.count) * pool.fraction
    runtime, rework = unit_runtime_s(state, work, model.partition_overhead_s(size), gpus=gpus, partition_work_s=works,
                                     checkpoint_s=model.checkpoint_s(pool.product, pool.fraction))
    if isinstance(state, SlurmState) and state.time_limit_s is not None and runtime > state.time_limit_s:
        return Alternative(
            feasible=False, runtime_s=runtime,
            note=f"runtime {runtime:.0f} s exceeds the time limit {state.time_limit_s:.0f} s", **base
        )
    try:  # priced as the meters bill it (dagster_gpu.billing.metering.charge)
        bill = charge(snapshot.rate_card.table(name), pool.device, max(1, request.count) * pool.fraction, runtime, pool.product)
    except RateCardError as e:
        return Alternative(feasible=False, note=f"no rate: {e}", **base)
    wait, how = _wait(state, pool, max(1, request.count), runtime)
    delay = state.launch_latency_s + wait
    cost, rate = bill.cost_usd, bill.rate_usd_per_gpu_hour
    cost_per_s = cost / runtime if runtime > 0 else 0.0
    pre = preemption_fields(state, rework, cost_per_s)
    note = f"{how}; {rate:g} USD/GPU-h"
    if pre:
        note += "; " + preemption_note(state, rework, pre["expected_preemption_cost_usd"])
    return Alternative(
        start_delay_s=delay, runtime_s=runtime, cost_usd=cost, finish_s=delay + runtime, note=note, **pre, **base
    )


def _cpu_alternative(name: str, state: BackendState, size: StepSize, model: RuntimeModel, snapshot: Snapshot) -> Alternative:
    if not state.cpu_available:
        return Alternative(backend=name, device="cpu", feasible=False, note="no CPU slots")
    slowdown = state.cpu_slowdown if isinstance(state, LocalState) else None
    runtime = state.billed_overhead_s + model.partition_overhead_s(size) + model.cpu_runtime_s(size, slowdown)
    try:
        rate = snapshot.rate_card.rate(name, "cpu")
    except RateCardError as e:
        return Alternative(backend=name, device="cpu", feasible=False, note=f"no rate: {e}")
    delay = state.launch_latency_s
    return Alternative(
        backend=name, device="cpu", product="cpu", device_fraction=1.0, start_delay_s=delay, runtime_s=runtime,
        cost_usd=rate * runtime / 3600.0, finish_s=delay + runtime, note=f"CPU; {rate:g} USD/h",
    )


def alternatives(
    request: GpuRequest, step_size: StepSize, snapshot: Snapshot, model: RuntimeModel | None = None,
    config: PolicyConfig = DEFAULT_CONFIG,
) -> tuple[Alternative, ...]:
    """Every candidate placement for the step, evaluated (see the module docstring), in backend order."""
    model = model or _DEFAULT_MODEL
    out: list[Alternative] = []
    for name in ORDER:
        state = snapshot.backend(name)
        if state is None:
            continue
        if not state.reachable and state.back_in_s is None:
            out.append(Alternative(backend=name, feasible=False, note=f"unreachable: {state.reason or 'no answer'}"))
            continue
        if request.count == 0:
            out.append(_cpu_alternative(name, state, step_size, model, snapshot))
            continue
        if not state.pools:
            out.append(Alternative(backend=name, feasible=False, note="no GPU devices"))
            continue
        evaluated = [_evaluate(name, state, p, request, step_size, model, snapshot) for p in state.pools]
        if not state.reachable:  # announced outage: usable once it ends
            evaluated = [_delayed(a, state.back_in_s, state.reason) for a in evaluated]
        out.extend(evaluated)
    dl = request.deadline_s
    return tuple(
        a if not a.feasible else _with_meets(a, dl is None or a.finish_s <= dl + config.deadline_slack_s)
        for a in out
    )


def _cpu_when_no_gpu(alts: tuple[Alternative, ...], request: GpuRequest, step_size: StepSize, snapshot: Snapshot,
                     model: RuntimeModel | None, config: PolicyConfig) -> tuple[Alternative, ...]:
    """A step forced onto a local host without GPUs runs there on CPU (the worker's device ``auto`` finds no
    CUDA device), as the executor places it: its local alternative becomes that CPU estimate. Never in
    ``auto`` mode: there a GPU request does not fall back to a CPU."""
    state = snapshot.backend("local")
    if state is None or state.pools or request.count == 0 or not state.reachable:
        return alts
    cpu = _cpu_alternative("local", state, step_size, model or _DEFAULT_MODEL, snapshot)
    if cpu.feasible:
        dl = request.deadline_s
        cpu = replace(cpu, note=f"no GPU devices on this host: the worker runs on CPU (device auto); {cpu.note}",
                      meets_deadline=dl is None or cpu.finish_s <= dl + config.deadline_slack_s)
    return tuple(cpu if a.backend == "local" and a.note == "no GPU devices" else a for a in alts)


def _delayed(a: Alternative, back_in_s: float, reason: str) -> Alternative:
    note = f"unreachable ({reason or 'no answer'}), back in {back_in_s:.0f} s (announced); {a.note}"
    if not a.feasible:
        return replace(a, note=note)
    return replace(a, start_delay_s=a.start_delay_s + back_in_s, finish_s=a.finish_s + back_in_s, note=note)


def _with_meets(a: Alternative, meets: bool) -> Alternative:
    return replace(a, meets_deadline=meets)


def _label(a: Alternative) -> str:
    return f"{a.backend} {a.device}" if a.device else a.backend


def select(pool: list[Alternative], deadline_s: float | None, config: PolicyConfig = DEFAULT_CONFIG
           ) -> tuple[Alternative, str, bool]:
    """Rule 3 of the module docstring over feasible, evaluated ``pool`` (non-empty):
    ``(chosen, why, deadline_met)``."""
    dl = deadline_s
    meeting = [a for a in pool if a.meets_deadline]
    if meeting:
        cheapest = min(a.cost_usd for a in meeting)
        tied = [a for a in meeting if a.cost_usd <= cheapest + config.cost_tie_usd]
        best = min(tied, key=lambda a: (a.finish_s, ORDER.index(a.backend)))
        why = "least expected cost" + (" (tie: earliest finish)" if len(tied) > 1 else "")
        why += " of " + (f"{len(meeting)} placement(s) finishing within the {dl:g} s deadline" if dl is not None
                         else f"{len(meeting)} feasible placement(s) (batch)")
        return best, why, True
    best = min(pool, key=lambda a: (a.finish_s, a.cost_usd, ORDER.index(a.backend)))
    return best, f"DEADLINE MISS: no placement finishes within {dl:g} s; earliest finish wins", False


def decide(
    request: GpuRequest,
    step_size: StepSize,
    snapshot: Snapshot,
    *,
    model: RuntimeModel | None = None,
    force: str | None = None,
    config: PolicyConfig = DEFAULT_CONFIG,
) -> Placement:
    """The placement for one step (see the module docstring for the rule and formulas).

    Args:
        request: the step's GPU request (its ``backend`` field forces a backend).
        step_size: the partition's size (bytes and/or rows), or a range's (``StepSize.for_range``): the
            whole range is then placed as one work unit (to spread a range over several units, see
            :func:`dagster_gpu.policy.ranges.plan_range`).
        snapshot: live state of the backends and the rate card.
        model: expected-runtime model learned from history (default: the stated fallback).
        force: a backend forced by the executor config or a what-if mode; the request's tag wins over it
            (:func:`~dagster_gpu.policy.forced.forced_backend`).
        config: tie and deadline tolerances.

    Raises:
        NoFeasiblePlacement: no feasible candidate (on the forced backend, when forced).
    """
    alts = alternatives(request, step_size, snapshot, model, config)
    how = forced_backend(request, force)
    forced = how.backend if how else None
    if forced == "local":
        alts = _cpu_when_no_gpu(alts, request, step_size, snapshot, model, config)
    pool = [a for a in alts if a.feasible and (forced is None or a.backend == forced)]
    skipped = "; ".join(f"{_label(a)}: {a.note}" for a in alts if not a.feasible)
    if not pool:
        where = f" on forced backend {forced!r}" if forced else ""
        raise NoFeasiblePlacement(f"no feasible placement{where}: {skipped or 'no backend configured'}", alts)
    dl = request.deadline_s
    best, why, met = select(pool, dl, config)
    reason = (
        f"{_label(best)}: {why}; est. start {best.start_delay_s:.0f} s, runtime {best.runtime_s:.0f} s, "
        f"cost {best.cost_usd:.4f} USD, finish {best.finish_s:.0f} s"
    )
    if best.expected_preemption_cost_usd is not None:
        reason += f"; {preemption_reason(best)}"
    if how:
        reason += f"; {how.reason}"
    queue = snapshot.kubernetes.queue if best.backend == "kubernetes" and snapshot.kubernetes is not None else None
    if queue is not None:
        reason += f"; {queue.describe(best.device)}"
    shared, why_unshared = placement_shared(request, snapshot, best.backend, best.device)
    if why_unshared:
        reason += f"; {why_unshared}"
    if skipped:
        reason += f"; not chosen: {skipped}"
    return Placement(
        backend=best.backend, device=best.device, product=best.product, reason=reason, alternatives=alts,
        deadline_s=dl, deadline_met=met, shared=shared,
    )


def placement_shared(request: GpuRequest, snapshot: Snapshot, backend: str, device: str | None) -> tuple[bool | None, str]:
    """``(Placement.shared, why unshared or "")`` for ``request`` placed on ``backend``'s pool ``device``: None
    unless a ``shared_ok`` step goes to Kubernetes; False when that pool (or ``*``) is in
    ``KubernetesState.no_sharing``."""
    st = snapshot.kubernetes
    if not request.shared_ok or backend != "kubernetes" or st is None:
        return None, ""
    blocked = set(st.no_sharing)
    if (device in blocked) or "*" in blocked:
        return False, f"unshared: a shared claim failed to prepare on {device if device in blocked else 'this cluster'}"
    return True, ""
