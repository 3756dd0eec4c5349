"""Discrete-event fleet simulator (pure, deterministic).

Mechanics, per cluster:

- One queue in priority order (submit time, then submission order), holding our steps and other users'
  background jobs. At every event the queue is scanned in order and each job that is *ready*
  (``submit + launch_latency_s``) starts on the lowest-numbered free device of its pool, unless it is
  ours and the array throttle is reached (then it is skipped, as Slurm holds throttled tasks while
  others run). No reservations (greedy first fit).
- Our jobs are *work units* (issue 8): one scheduler job that loads the model once and embeds one or
  more partitions back to back. A unit holds its device ``billed_overhead_s + Σ (per_partition_s +
  work)`` seconds, all billed: the start-up once, then each partition's overhead and work in turn
  (``per_partition_s`` and ``work`` from the scenario's :class:`~dagster_gpu.policy.runtime.RuntimeModel`
  for that device). A partition is done, and its deadline judged, when its own turn in the unit ends.
- A run (``Task.run``: a ranged run of a backfill, or one partition) arrives as a whole; the policy
  either plans its units (``place_run``) or places each partition (``place``) and the engine forms the
  units by :func:`form_units` (the LPT rule of :mod:`dagster_gpu.policy.ranges`).
- A preemption kills our most recently started unit on that cluster: the time it held is billed, the
  partitions it finished stay done, the rest are requeued as a unit with the original priority (ready
  again after the launch latency, paying the start-up again); the device goes to the preemptor for
  ``hold_s``.
- During an outage nothing is submitted or allocated; submissions wait for its end; runs continue.
- The resident baseline's devices live in a cluster named ``resident`` (no latency, no overhead: the
  model stays loaded) and are billed for the whole window, busy or not.

Each decision is made at the step's arrival and never revisited. Dispatch order among simultaneous
events follows event order (time, then insertion), so results are reproducible.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Protocol

from dagster_gpu.fleet.state import ClusterState, FleetSnapshot
from dagster_gpu.policy.ranges import assign_units
from dagster_gpu.policy.runtime import StepSize
from dagster_gpu.policy.snapshot import DeviceGroup, KubernetesState, LocalState, SlurmState, Snapshot
from dagster_gpu.sim.model import ClusterSpec, Scenario, Task, Units


@dataclass
class Segment:
    """One run of one of our work units on one device: ``[start_s, end_s)`` billed; ``useful_s`` seconds
    of embedding work of the partitions it finished (``work_spans``: when each of them encoded).

    ``task`` is the unit's first partition, ``tasks`` all the partitions it held; ``completed`` is False
    for a run cut short by a preemption."""

    task: int
    cluster: str
    device: str
    product: str
    fraction: float
    start_s: float
    end_s: float
    useful_s: float
    completed: bool
    tasks: tuple[int, ...] = ()
    work_spans: tuple[tuple[float, float], ...] = ()


@dataclass
class TaskOutcome:
    task: Task
    cluster: str
    device: str
    product: str
    end_s: float = math.nan

    @property
    def missed(self) -> bool:
        return self.task.deadline_s is not None and self.end_s - self.task.arrival_s > self.task.deadline_s + 1e-6


@dataclass
class SimResult:
    """Everything a run produced; metrics are derived in :mod:`dagster_gpu.sim.metrics`."""

    policy: str
    segments: list[Segment] = field(default_factory=list)
    outcomes: dict[int, TaskOutcome] = field(default_factory=dict)
    held: list[tuple[str, str, str, float, float, int]] = field(default_factory=list)
    """Devices held regardless of use: (cluster, device, product, start_s, end_s, count)."""
    spills: list[tuple[int, str, str, float]] = field(default_factory=list)
    """Units withdrawn from one queue and placed on another: (first partition, from cluster, to cluster, at_s)."""


Option = tuple[str, str, str]


class Policy(Protocol):
    """Decides at a run's arrival. ``place`` is required; a policy may also define
    ``place_run(tasks, sim) -> list[(option, [tasks in the unit's order])]`` to plan the units itself."""

    name: str

    def place(self, task: Task, sim: "Simulation") -> Option:
        """``(cluster, device, product)`` for ``task``, decided at its arrival."""


@dataclass
class _Job:
    seq: int
    prio: float
    ready: float
    key: tuple[str, str]
    ours: bool
    parts: list[tuple[Task, float]] = field(default_factory=list)  # (partition, work s) in the unit's order
    dur: float = 0.0
    fraction: float = 1.0
    start: float | None = None
    unit: int | None = None
    token: int = 0
    overhead: float = 0.0
    per_part: float = 0.0

    def ends(self) -> list[float]:
        """When each partition's turn ends, for a run started at ``start``."""
        t, out = self.start + self.overhead, []
        for _task, w in self.parts:
            t += self.per_part + w
            out.append(t)
        return out

    def set_parts(self, parts: list[tuple[Task, float]]) -> None:
        self.parts = parts
        self.dur = self.overhead + sum(self.per_part + w for _t, w in parts)


class _Cluster:
    def __init__(self, spec: ClusterSpec):
        self.spec = spec
        self.units: list[Units] = []
        for u in spec.units:
            self.units.extend([u] * u.count)
        self.busy: list[_Job | None] = [None] * len(self.units)
        self.queue: list[tuple[float, int, _Job]] = []
        self.running: list[_Job] = []

    def ours_running(self) -> int:
        return sum(1 for j in self.running if j.ours)


class Simulation:
    """One run of ``scenario`` under ``policy``; call :meth:`run`."""

    def __init__(self, scenario: Scenario, policy: Policy, resident: bool = False):
        self.sc = scenario
        self.policy = policy
        specs = list(scenario.clusters)
        if resident:
            r = scenario.resident
            base = next(u for c in scenario.clusters for u in c.units if u.key == r.key)
            specs.append(ClusterSpec("resident", (Units(base.device, base.product, base.memory_gib, r.count,
                                                        base.mig_profile),)))
        self.clusters = {s.name: _Cluster(s) for s in specs}
        self.now = 0.0
        self._events: list = []
        self._seq = 0
        self.result = SimResult(policy.name)
        if resident:
            r = scenario.resident
            self._resident = r
        else:
            self._resident = None

    # --- event plumbing -----------------------------------------------------------------------
    def _push(self, t: float, fn: Callable, *args) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, fn, args))

    def run(self) -> SimResult:
        for tasks in self.sc.runs():
            self._push(tasks[0].arrival_s, self._arrive_run, tasks)
        for c in self.clusters.values():
            for b in c.spec.background:
                self._push(b.submit_s, self._submit_bg, c, b)
            for p in c.spec.preemptions:
                self._push(p.at_s, self._preempt, c, p.hold_s)
            for _a, end in c.spec.outages:
                self._push(end, self._dispatch, c)
        while self._events:
            t, _s, fn, args = heapq.heappop(self._events)
            self.now = t
            fn(*args)
        if self._resident is not None:
            r = self._resident
            ends = [o.end_s for o in self.result.outcomes.values()]
            end = max([self.sc.window_s] + ends)
            self.result.held.append(("resident", r.key[0], r.key[1], 0.0, end, r.count))
        return self.result

    # --- work model -----------------------------------------------------------------------------
    def work_s(self, task: Task, unit: Units) -> float:
        return self.sc.model.runtime_s(StepSize(rows=task.rows), unit.product, unit.fraction)

    def unit_of(self, opt: Option) -> Units:
        c = self.clusters[opt[0]]
        return next(u for u in c.units if u.key == opt[1:])

    def capacity(self, opt: Option) -> int:
        """Units of one run a pool takes side by side: its devices, at most the Slurm array throttle
        (what the snapshot reports, so the policy's plan and :func:`form_units` agree)."""
        c = self.clusters[opt[0]]
        n = sum(1 for u in c.units if u.key == opt[1:])
        if c.spec.backend == "slurm" and c.spec.array_throttle is not None:
            n = min(n, c.spec.array_throttle)
        return max(1, n)

    # --- handlers ---------------------------------------------------------------------------------
    def _arrive(self, task: Task) -> None:
        self._arrive_run((task,))

    def _arrive_run(self, tasks: tuple[Task, ...]) -> None:
        if hasattr(self.policy, "place_run"):
            units = self.policy.place_run(tasks, self)
        else:
            units = form_units(self, tasks, {t.id: self.policy.place(t, self) for t in tasks})
        placed = sorted(t.id for _o, ts in units for t in ts)
        if placed != sorted(t.id for t in tasks):
            raise ValueError(f"policy {self.policy.name!r} placed partitions {placed} of run {[t.id for t in tasks]}")
        for (name, device, product), ts in units:
            c = self.clusters[name]
            unit = self.unit_of((name, device, product))
            for t in ts:
                self.result.outcomes[t.id] = TaskOutcome(t, name, device, product)
            self._seq += 1
            job = _Job(self._seq, self.now, 0.0, (device, product), True, fraction=unit.fraction,
                       overhead=c.spec.billed_overhead_s, per_part=self.sc.model.per_partition_s)
            job.set_parts([(t, self.work_s(t, unit)) for t in ts])
            self._submit(c, job)

    def _submit_bg(self, c: _Cluster, b) -> None:
        self._seq += 1
        self._submit(c, _Job(self._seq, self.now, 0.0, b.key, False, dur=b.duration_s))

    def _submit(self, c: _Cluster, job: _Job) -> None:
        end = c.spec.outage_end(self.now)
        if end is not None:
            self._push(end, self._submit, c, job)
            return
        job.ready = self.now + c.spec.launch_latency_s
        bisect.insort(c.queue, (job.prio, job.seq, job))
        self._push(job.ready, self._dispatch, c)
        if job.ours and c.spec.waiting_budget_s is not None and hasattr(self.policy, "spill"):
            self._push(self.now + c.spec.waiting_budget_s, self._over_budget, c, job, self.now)

    def _over_budget(self, c: _Cluster, job: _Job, since: float) -> None:
        """A unit of ours still queued on ``c`` past its waiting budget: the policy may move it (it is taken
        out of the queue before it is submitted elsewhere, so it never runs twice; one that started stays)."""
        if job.start is not None or not any(j is job for _p, _s, j in c.queue):
            return
        rest = self.forecast_wait(c.spec.name, job.key, job=job) if c.spec.outage_end(self.now) is None else None
        opt = self.policy.spill(job.parts[0][0], c.spec.name, self.now - since, rest, self)
        if opt is None:
            return
        name, device, product = opt
        c.queue = [q for q in c.queue if q[2] is not job]
        other = self.clusters[name]
        unit = self.unit_of(opt)
        self._seq += 1
        moved = _Job(self._seq, self.now, 0.0, (device, product), True, fraction=unit.fraction,
                     overhead=other.spec.billed_overhead_s, per_part=job.per_part)
        moved.set_parts([(t, self.work_s(t, unit)) for t, _w in job.parts])
        for t, _w in job.parts:
            self.result.outcomes[t.id] = TaskOutcome(t, name, device, product)
        self.result.spills.append((job.parts[0][0].id, c.spec.name, name, self.now))
        self._submit(other, moved)

    def _dispatch(self, c: _Cluster) -> None:
        if c.spec.outage_end(self.now) is not None:
            return
        thr = c.spec.array_throttle
        ours = c.ours_running()
        keep = []
        for item in c.queue:
            job = item[2]
            started = False
            if job.ready <= self.now + 1e-9 and not (job.ours and thr is not None and ours >= thr):
                for i, u in enumerate(c.units):
                    if c.busy[i] is None and u.key == job.key:
                        self._start(c, job, i)
                        ours += job.ours
                        started = True
                        break
            if not started:
                keep.append(item)
        c.queue = keep

    def _start(self, c: _Cluster, job: _Job, i: int) -> None:
        job.start, job.unit = self.now, i
        job.token += 1
        c.busy[i] = job
        c.running.append(job)
        self._push(self.now + job.dur, self._finish, c, job, job.token)

    def _release(self, c: _Cluster, job: _Job) -> None:
        c.busy[job.unit] = None
        c.running.remove(job)

    def _segment(self, c: _Cluster, job: _Job, upto: float, completed: bool) -> list[tuple[Task, float]]:
        """Record ``job``'s run until ``upto``; returns the partitions it had not finished by then."""
        u = c.units[job.unit]
        done, spans, rest = 0.0, [], []
        for (t, w), end in zip(job.parts, job.ends()):
            if end <= upto + 1e-9:
                done += w
                spans.append((end - w, end))
                self.result.outcomes[t.id].end_s = end
            else:
                rest.append((t, w))
        self.result.segments.append(Segment(
            job.parts[0][0].id, c.spec.name, u.device, u.product, u.fraction, job.start, upto, done,
            completed and not rest, tuple(t.id for t, _w in job.parts), tuple(spans)))
        return rest

    def _finish(self, c: _Cluster, job: _Job, token: int) -> None:
        if token != job.token or job.start is None:
            return
        self._release(c, job)
        if job.ours:
            self._segment(c, job, self.now, True)
        job.start = None
        self._dispatch(c)

    def _preempt(self, c: _Cluster, hold_s: float) -> None:
        victims = [j for j in c.running if j.ours]
        if not victims:
            return
        v = max(victims, key=lambda j: (j.start, j.seq))
        u = c.units[v.unit]
        rest = self._segment(c, v, self.now, False)
        i = v.unit
        self._release(c, v)
        v.start, v.unit = None, None
        v.token += 1
        self._seq += 1
        self._start(c, _Job(self._seq, self.now, self.now, u.key, False, dur=hold_s), i)
        if not rest:  # it had just finished its last partition
            self._dispatch(c)
            return
        v.set_parts(rest)
        v.ready = self.now + c.spec.launch_latency_s
        bisect.insort(c.queue, (v.prio, v.seq, v))
        self._push(v.ready, self._dispatch, c)

    # --- what the policy may see -------------------------------------------------------------------
    def forecast_wait(self, name: str, key: tuple[str, str], job: _Job | None = None) -> float:
        """Seconds (beyond the launch latency) until a step of ours submitted now to pool ``key`` of
        cluster ``name`` would be allocated, ignoring future arrivals, preemptions and outages — the
        simulator's stand-in for ``sbatch --test-only`` (strict FIFO per pool, the throttle shared).
        ``job``: one already queued there: seconds until it starts (from now)."""
        c = self.clusters[name]
        heaps: dict[tuple[str, str], list[float]] = {}
        for i, u in enumerate(c.units):
            j = c.busy[i]
            heaps.setdefault(u.key, []).append(self.now if j is None else j.start + j.dur)
        for h in heaps.values():
            heapq.heapify(h)
        thr = c.spec.array_throttle
        slots: list[float] | None = None
        if thr is not None:
            ends = sorted(j.start + j.dur for j in c.running if j.ours)
            slots = ends[:thr] + [self.now] * max(0, thr - len(ends))
            heapq.heapify(slots)
        ready = self.now + c.spec.launch_latency_s
        for _p, _s, q in c.queue:
            h = heaps.get(q.key)
            if not h:
                continue
            st = max(q.ready, h[0], slots[0] if (slots is not None and q.ours) else -math.inf)
            if q is job:
                return max(0.0, st - self.now)
            heapq.heapreplace(h, st + q.dur)
            if slots is not None and q.ours:
                heapq.heapreplace(slots, st + q.dur)
        h = heaps.get(key)
        if not h:
            return math.inf
        st = max(ready, h[0], slots[0] if slots is not None else -math.inf)
        return max(0.0, st - ready)

    def snapshot(self) -> Snapshot:
        """The live state as the backends would report it now (see ``dagster_gpu.policy.snapshot``)."""
        states = {name: self._state(self.clusters[name]) for name in ("slurm", "kubernetes", "local")
                  if name in self.clusters}
        return Snapshot(rate_card=self.sc.rate_card, taken_at=self.now, **states)

    def fleet_snapshot(self) -> FleetSnapshot:
        """Every cluster's state now as a fleet (the scenario's rate card has a table per cluster name)."""
        return FleetSnapshot(rate_card=self.sc.rate_card, taken_at=self.now, clusters=tuple(
            ClusterState(c.spec.name, c.spec.backend, self._state(c), c.spec.waiting_budget_s)
            for c in self.clusters.values() if c.spec.name != "resident"))

    def _state(self, c: _Cluster):
        """One cluster's state as its backend would report it now."""
        typ = {"slurm": SlurmState, "kubernetes": KubernetesState, "local": LocalState}[c.spec.backend]
        name = c.spec.name
        s = c.spec
        down_until = s.outage_end(self.now)
        if down_until is not None and not s.outages_announced:
            return typ(reachable=False, reason="simulated outage")
        pools = []
        seen = []
        ours_queued = sum(1 for _p, _s, j in c.queue if j.ours)
        for u in s.units:
            if u.key in seen:
                continue
            seen.append(u.key)
            idx = [i for i, x in enumerate(c.units) if x.key == u.key]
            free = sum(1 for i in idx if c.busy[i] is None)
            pending = sum(1 for _p, _s, j in c.queue if j.ours and j.key == u.key)
            thr_full = s.array_throttle is not None and c.ours_running() + ours_queued >= s.array_throttle
            est = self.forecast_wait(name, u.key) if (free - pending < 1 or thr_full) else 0.0
            pools.append(DeviceGroup(u.device, u.product, u.memory_gib, free, len(idx), pending,
                                    est if math.isfinite(est) else None, u.mig_profile))
        kw = dict(pools=tuple(pools), launch_latency_s=s.launch_latency_s, billed_overhead_s=s.billed_overhead_s)
        if down_until is not None:
            kw.update(reachable=False, reason="simulated outage (announced)", back_in_s=down_until - self.now)
        if typ is SlurmState:
            kw.update(array_throttle=s.array_throttle, running_tasks=c.ours_running(),
                      preemptions_per_gpu_hour=s.preemptions_per_gpu_hour)
        return typ(**kw)


def form_units(sim: Simulation, tasks: tuple[Task, ...], choice: dict[int, Option]
               ) -> list[tuple[Option, list[Task]]]:
    """Work units of one run whose partitions were each given an option: largest first, up to the
    pool's capacity side by side, then joining the least-loaded unit (``dagster_gpu.policy.ranges``'s
    rule, so a policy that plans the same assignment gets the same units)."""
    model = sim.sc.model
    order = sorted(range(len(tasks)), key=lambda i: (-model.rows(StepSize(rows=tasks[i].rows)), i))
    key_of = {i: choice[t.id] for i, t in enumerate(tasks)}
    load_of = {i: model.per_partition_s + sim.work_s(t, sim.unit_of(key_of[i])) for i, t in enumerate(tasks)}
    cap = {k: sim.capacity(k) for k in set(key_of.values())}
    return [(k, [tasks[i] for i in members]) for k, members in assign_units(order, key_of, load_of, cap)]


def simulate(scenario: Scenario, policy: Policy) -> SimResult:
    """Run ``scenario`` under ``policy`` (a policy named ``resident`` gets the resident devices)."""
    return Simulation(scenario, policy, resident=getattr(policy, "resident", False)).run()
