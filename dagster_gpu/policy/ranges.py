"""Placing a ranged step: which work units embed which partitions, where (pure, deterministic, no I/O).

A ranged step (issue 8) embeds several partitions. A *work unit* is one scheduler job (a Slurm array
task, a pod, a local process) that loads the model once and embeds its partitions back to back, so it
pays the backend's start-up (``BackendState.billed_overhead_s``) once and ``RuntimeModel.per_partition_s``
per partition. :func:`plan_range` spreads a range over units; :func:`decide` on
``StepSize.for_range(...)`` instead places the whole range as a single unit.

Rule of :func:`plan_range`:

1. Order: largest expected work first (:func:`plan_largest_first`; ties keep the range's order) — the
   LPT rule (R. L. Graham, "Bounds on multiprocessing timing anomalies", SIAM J. Appl. Math. 17(2),
   1969: on m identical devices its makespan is at most 4/3 − 1/(3m) times the optimum). Deciding
   smallest first fills the cheap backend with small partitions and leaves the large ones, which need
   a device of their own to meet a deadline, to a dearer one.
2. Each partition, in that order, is placed by :func:`~dagster_gpu.policy.policy.select` (least cost
   meeting the deadline, else earliest finish) among every feasible pool of
   :func:`~dagster_gpu.policy.policy.alternatives` (on the snapshot updated by the units already
   planned, see :func:`~dagster_gpu.policy.snapshot.after_submit`), each pool offering one option:

   - while the plan has fewer units on that pool than its capacity (devices in the pool, at most the
     Slurm array throttle; 1 for CPU): a **new unit**, with the policy's own one-step figures — except
     its wait once the pool has no free device and its ``start_estimate_s`` no longer holds (the
     plan's earlier units took them): then the unit starts when the earliest of the plan's own units
     on that pool ends (a known device release; the policy's queue estimate, which takes every unit
     ahead to be as long as this one, is kept when no such unit exists);
   - else **joining** the plan's least-loaded unit there (load = Σ (per_partition_s + work) seconds,
     ties: the unit opened first): no new start-up; runtime grows by per_partition_s + work (+ Slurm's
     expected preemption rework of the longer unit, :mod:`dagster_gpu.policy.preemption`); cost = that growth ×
     count × rate / 3600 (USD);
     finish = the unit's start delay + its new runtime.

3. A unit embeds its partitions in the order they joined it (largest first). The same unit-forming
   rule, given each partition's pool, is :func:`assign_units` (the simulator forms units with it, so
   the oracle searches over the same units).

Times are seconds from the launch, money USD. A partition's deadline is the request's
``deadline_s`` (each partition must finish within it). Raises
:class:`~dagster_gpu.policy.policy.NoFeasiblePlacement` when a partition has no feasible pool.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from typing import Hashable, Iterable, Sequence

from dagster_gpu.core.request import GpuRequest
from dagster_gpu.policy.forced import forced_backend
from dagster_gpu.policy.placement import Alternative, Placement
from dagster_gpu.policy.policy import (
    DEFAULT_CONFIG,
    NoFeasiblePlacement,
    PolicyConfig,
    alternatives,
    placement_shared,
    select,
    unit_runtime_s,
)
from dagster_gpu.policy.preemption import NO_REWORK, Rework, preemption_fields, preemption_reason
from dagster_gpu.policy.runtime import RuntimeModel, StepSize
from dagster_gpu.policy.snapshot import BackendState, LocalState, SlurmState, Snapshot, after_submit

_DEFAULT_MODEL = RuntimeModel()


def _as_size(s: StepSize | int | None, i: int) -> StepSize:
    if s is None:
        return StepSize()
    if isinstance(s, StepSize):
        return s
    if isinstance(s, int) and not isinstance(s, bool):
        return StepSize(bytes=s)
    raise ValueError(f"partition {i}: size is {type(s).__name__}, not StepSize, int or None")


def plan_largest_first(sizes: Sequence[StepSize | int | None] | StepSize, model: RuntimeModel | None = None
                       ) -> tuple[int, ...]:
    """Indices of ``sizes`` (a range's partitions, or a ranged :class:`StepSize`), largest expected rows
    first (``model.rows``: known rows, else bytes × rows_per_byte, else typical_rows); ties keep the
    range's order. An int is a corpus size in bytes; None is unknown.

    Raises:
        ValueError: an item of another type (the message names its index).
    """
    model = model or _DEFAULT_MODEL
    parts = sizes.parts if isinstance(sizes, StepSize) else [_as_size(s, i) for i, s in enumerate(sizes)]
    rows = [model.rows(p) for p in parts]
    return tuple(sorted(range(len(parts)), key=lambda i: (-rows[i], i)))


class UnitBook:
    """Units being formed, per pool, by the rule of the module docstring (step 2's new-or-join choice)."""

    def __init__(self) -> None:
        self.keys: list[Hashable] = []
        self.members: list[list[int]] = []
        self.loads: list[float] = []

    def target(self, key: Hashable, capacity: int) -> int | None:
        """The unit a partition placed on pool ``key`` joins, or None when it opens a new unit."""
        mine = [u for u, k in enumerate(self.keys) if k == key]
        if len(mine) < max(1, capacity):
            return None
        return min(mine, key=lambda u: (self.loads[u], u))

    def add(self, key: Hashable, capacity: int, item: int, load_s: float) -> int:
        """Place ``item`` (weight ``load_s`` seconds) on pool ``key``; returns its unit's index."""
        u = self.target(key, capacity)
        if u is None:
            self.keys.append(key)
            self.members.append([])
            self.loads.append(0.0)
            u = len(self.keys) - 1
        self.members[u].append(item)
        self.loads[u] += load_s
        return u


def assign_units(order: Iterable[int], key_of: dict[int, Hashable], load_of: dict[int, float],
                 capacity: dict[Hashable, int]) -> list[tuple[Hashable, list[int]]]:
    """Units formed when each item (visited in ``order``) goes to pool ``key_of[item]``: ``(pool, items)``
    in the order the units were opened, items in the order they joined (rule step 2, without the choice)."""
    book = UnitBook()
    for i in order:
        book.add(key_of[i], capacity[key_of[i]], i, load_of[i])
    return list(zip(book.keys, book.members))


def capacity(state: BackendState, device: str | None, product: str | None) -> int:
    """How many units of one range a pool takes side by side: its devices, at most the Slurm array
    throttle; 1 for a CPU placement or an unknown pool."""
    if device == "cpu":
        return 1
    pool = next((p for p in state.pools if p.key == (device, product)), None)
    if pool is None:
        return 1
    n = pool.total
    if isinstance(state, SlurmState) and state.array_throttle is not None:
        n = min(n, state.array_throttle)
    return max(1, n)


@dataclass(frozen=True)
class UnitPlan:
    """One planned work unit.

    Attributes:
        backend, device, product, device_fraction: where it runs (as in :class:`Alternative`).
        partitions: indices into the range, in the order the unit embeds them (largest first).
        start_delay_s: expected seconds from launch to its start.
        runtime_s: expected billed seconds (one start-up + Σ (per_partition_s + work) + rework).
        cost_usd: expected cost (count × rate × runtime / 3600).
        expected_preemption_cost_usd: the part of ``cost_usd`` that is expected preemption rework (0.0 on a pool
            that is not preemptible).
        placement: the decision that opened the unit (its alternatives as seen then), with a reason
            naming the unit and its partitions; what the executor records as ``dagster_gpu/placement``.
    """

    backend: str
    device: str | None
    product: str | None
    device_fraction: float | None
    partitions: tuple[int, ...]
    start_delay_s: float
    runtime_s: float
    cost_usd: float
    placement: Placement
    expected_preemption_cost_usd: float = 0.0

    @property
    def finish_s(self) -> float:
        return self.start_delay_s + self.runtime_s


@dataclass(frozen=True)
class RangePlan:
    """Units for a ranged step (see the module docstring).

    Attributes:
        units: in the order they were opened (submit them in this order).
        order: the partitions' visiting order (largest first), indices into the range.
        finish_s: expected finish of each partition (seconds from launch), indexed like the range.
        deadline_s: the request's deadline (None = batch).
    """

    units: tuple[UnitPlan, ...]
    order: tuple[int, ...]
    finish_s: tuple[float, ...]
    deadline_s: float | None

    @property
    def cost_usd(self) -> float:
        return sum(u.cost_usd for u in self.units)

    @property
    def misses(self) -> tuple[int, ...]:
        """Partitions expected to finish after the deadline."""
        dl = self.deadline_s
        return () if dl is None else tuple(i for i, f in enumerate(self.finish_s) if f > dl + 1e-6)

    @property
    def deadline_met(self) -> bool:
        return not self.misses

    def unit_of(self, partition: int) -> int:
        """Index in ``units`` of the unit embedding range partition ``partition``."""
        for k, u in enumerate(self.units):
            if partition in u.partitions:
                return k
        raise KeyError(f"partition {partition} is not in this plan")


@dataclass
class _Open:
    alt: Alternative
    state: BackendState
    rate: float
    count: int
    placement: Placement
    parts: list[int]
    works: list[float] = field(default_factory=list)
    overhead_s: float = 0.0
    runtime_s: float = 0.0
    rework: Rework = NO_REWORK

    @property
    def work_s(self) -> float:
        return sum(self.works)

    def runtime(self, works: list[float], overhead_s: float, model: RuntimeModel):
        """``(runtime, rework)`` of this unit embedding ``works`` (seconds each) with ``overhead_s``."""
        a = self.alt
        return unit_runtime_s(self.state, sum(works), overhead_s, gpus=self.count * (a.device_fraction or 1.0),
                              partition_work_s=works,
                              checkpoint_s=None if a.device == "cpu" else model.checkpoint_s(a.product, a.device_fraction or 1.0))


def _work_s(alt: Alternative, state: BackendState, part: StepSize, model: RuntimeModel) -> float:
    if alt.device == "cpu":
        return model.cpu_runtime_s(part, state.cpu_slowdown if isinstance(state, LocalState) else None)
    return model.runtime_s(part, alt.product, alt.device_fraction or 1.0)


def _rate(snapshot: Snapshot, alt: Alternative) -> float:
    if alt.device == "cpu":
        return snapshot.rate_card.rate(alt.backend, "cpu")
    return snapshot.rate_card.rate(alt.backend, alt.device, parent_product=alt.product)


_RELEASE_NOTE = "starts when the plan's own unit there ends"


def _after_own_release(a: Alternative, state: BackendState, ends: list[float] | None, dl: float | None,
                       config: PolicyConfig) -> Alternative:
    """``a`` with its start at the earliest end of the plan's own units on its pool, when it has to wait
    and the pool's start estimate was used up (see the module docstring)."""
    if not ends or a.device == "cpu" or not state.reachable:
        return a
    pool = next((p for p in state.pools if p.key == (a.device, a.product)), None)
    if pool is None or pool.start_estimate_s is not None or a.start_delay_s <= state.launch_latency_s + 1e-9:
        return a
    start = max(state.launch_latency_s, ends[0])
    fin = start + a.runtime_s
    return replace(a, start_delay_s=start, finish_s=fin,
                   meets_deadline=dl is None or fin <= dl + config.deadline_slack_s,
                   note=f"{_RELEASE_NOTE} at {ends[0]:.0f} s; {a.note}")


def plan_range(
    request: GpuRequest,
    size: StepSize | Sequence[StepSize | int | None],
    snapshot: Snapshot,
    *,
    model: RuntimeModel | None = None,
    force: str | None = None,
    config: PolicyConfig = DEFAULT_CONFIG,
) -> RangePlan:
    """Work units for a ranged step (the rule is the module docstring's).

    Args:
        request: the step's GPU request (its ``backend`` forces a backend; its ``deadline_s`` applies to
            each partition).
        size: ``StepSize.for_range(...)``, or the partitions' sizes (StepSize, bytes or None each).
        snapshot: live state of the backends and the rate card.
        model: expected-runtime model (its ``per_partition_s`` is each partition's overhead in a unit).
        force: a backend forced by the executor config or a what-if mode; the request's tag wins over it
            (:func:`~dagster_gpu.policy.forced.forced_backend`).
        config: tie and deadline tolerances.

    Raises:
        NoFeasiblePlacement: a partition has no feasible pool (on the forced backend, when forced).
        ValueError: an empty range, or a size of another type.
    """
    model = model or _DEFAULT_MODEL
    rng = size if isinstance(size, StepSize) else StepSize.for_range(size)
    parts = rng.parts
    order = plan_largest_first(rng, model)
    how = forced_backend(request, force)
    forced = how.backend if how else None
    dl = request.deadline_s
    snap = snapshot
    book = UnitBook()
    units: list[_Open] = []
    finish = [0.0] * len(parts)
    releases: dict[tuple, list[float]] = {}  # pool -> ends of the plan's units there (a heap)
    for i in order:
        part = parts[i]
        alts = alternatives(request, part, snap, model, config)
        feasible = [a for a in alts if a.feasible and (forced is None or a.backend == forced)]
        if not feasible:
            skipped = "; ".join(f"{a.backend} {a.device or ''}: {a.note}" for a in alts if not a.feasible)
            where = f" on forced backend {forced!r}" if forced else ""
            raise NoFeasiblePlacement(
                f"partition {i} of the range: no feasible placement{where}: {skipped or 'no backend configured'}",
                alts)
        options: list[tuple[Alternative, Alternative, int | None]] = []  # (shown, opening alt, unit to join)
        for a in feasible:
            state = snap.backend(a.backend)
            key = (a.backend, a.device, a.product)
            u = book.target(key, capacity(state, a.device, a.product))
            if u is None:
                a = _after_own_release(a, state, releases.get(key), dl, config)
                options.append((a, a, None))
                continue
            o = units[u]
            runtime, rw = o.runtime([*o.works, _work_s(a, o.state, part, model)], o.overhead_s + model.per_partition_s,
                                    model)
            grow = runtime - o.runtime_s
            fin = o.alt.start_delay_s + runtime
            per_s = o.count * o.rate / 3600.0  # rate: USD per hour of one device (RateCard.rate)
            pre = preemption_fields(o.state, replace(rw, seconds=rw.seconds - o.rework.seconds,
                                                         expected_preemptions=rw.expected_preemptions - o.rework.expected_preemptions), per_s)
            shown = replace(
                a, start_delay_s=o.alt.start_delay_s, runtime_s=grow, cost_usd=per_s * grow,
                finish_s=fin, meets_deadline=dl is None or fin <= dl + config.deadline_slack_s,
                note=f"joins planned unit {u} ({len(o.parts)} partition(s)): no new start-up; {a.note}", **pre)
            options.append((shown, a, u))
        best, why, _met = select([s for s, _a, _u in options], dl, config)
        shown, a, u = next(x for x in options if x[0] is best)
        state = snap.backend(a.backend)
        key = (a.backend, a.device, a.product)
        w = _work_s(a, state, part, model)
        got = book.add(key, capacity(state, a.device, a.product), i, model.per_partition_s + w)
        if u is None:
            assert got == len(units)
            reason = (f"{a.backend} {a.device}: {why}; est. start {a.start_delay_s:.0f} s, runtime "
                      f"{a.runtime_s:.0f} s, cost {a.cost_usd:.4f} USD (unit {got} of a ranged step, opened "
                      f"for partition {i}, largest first)")
            if a.expected_preemption_cost_usd is not None:
                reason += f"; {preemption_reason(a)}"
            shared, why_unshared = placement_shared(request, snap, a.backend, a.device)
            pl = Placement(backend=a.backend, device=a.device, product=a.product,
                           reason=f"{reason}; {why_unshared}" if why_unshared else reason,
                           alternatives=tuple(x[0] for x in options) + tuple(x for x in alts if not x.feasible),
                           deadline_s=dl, deadline_met=bool(a.meets_deadline), shared=shared)
            o = _Open(a, state, _rate(snap, a), max(1, request.count), pl, [])
            units.append(o)
            if a.note.startswith(_RELEASE_NOTE):
                heapq.heappop(releases[key])
            snap = after_submit(snap, a.backend, a.device, a.product)
        o = units[got]
        o.parts.append(i)
        o.works.append(w)
        o.overhead_s += model.per_partition_s
        o.runtime_s, rw = o.runtime(o.works, o.overhead_s, model)
        o.rework = rw
        finish[i] = o.alt.start_delay_s + o.runtime_s
        if u is None:
            heapq.heappush(releases.setdefault(key, []), finish[i])
    out = []
    for k, o in enumerate(units):
        rt = o.runtime_s
        per_s = o.count * o.rate / 3600.0
        pl = replace(o.placement, reason=o.placement.reason + f"; embeds partitions {o.parts}")
        out.append(UnitPlan(o.alt.backend, o.alt.device, o.alt.product, o.alt.device_fraction, tuple(o.parts),
                            o.alt.start_delay_s, rt, per_s * rt, pl, per_s * o.rework.seconds))
    return RangePlan(tuple(out), order, tuple(finish), dl)
