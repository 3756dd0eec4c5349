"""Discrete-event fleet simulator (pure, deterministic).

Mechanics, per cluster:

- One queue in priority order (submit time, then submission order), holding our steps and other users'
  background jobs. At every event the queue is scanned in order and each job that is *ready*
  (``submit + launch_latency_s``) starts on the lowest-numbered free device of its pool, unless it is
  ours and the array throttle is reached (then it is skipped, as Slurm holds throttled tasks while
  others run). No reservations (greedy first fit).
- A run holds its device ``billed_overhead_s + work`` seconds, all billed; ``work`` comes from the
  scenario's :class:`~dagster_gpu.policy.runtime.RuntimeModel` for that device.
- A preemption kills our most recently started run on that cluster: the time it held is billed, its
  work is lost, the device goes to the preemptor for ``hold_s``, and the step is requeued with its
  original priority (ready again after the launch latency).
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

from dagster_gpu.policy.runtime import StepSize
from dagster_gpu.policy.snapshot import DeviceGroup, KubernetesState, LocalState, SlurmState, Snapshot
from dagster_gpu.sim.model import ClusterSpec, Scenario, Task, Units


@dataclass
class Segment:
    """One run of one of our steps on one device: ``[start_s, end_s)`` billed; ``useful_s`` of work done."""

    task: int
    cluster: str
    device: str
    product: str
    fraction: float
    start_s: float
    end_s: float
    useful_s: float
    completed: bool


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


class Policy(Protocol):
    name: str

    def place(self, task: Task, sim: "Simulation") -> tuple[str, str, str]:
        """``(cluster, device, product)`` for ``task``, decided at its arrival."""


@dataclass
class _Job:
    seq: int
    prio: float
    ready: float
    key: tuple[str, str]
    ours: bool
    task: Task | None = None
    dur: float = 0.0
    work: float = 0.0
    fraction: float = 1.0
    start: float | None = None
    unit: int | None = None
    token: int = 0


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
        for t in self.sc.tasks:
            self._push(t.arrival_s, self._arrive, t)
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

    # --- handlers ---------------------------------------------------------------------------------
    def _arrive(self, task: Task) -> None:
        name, device, product = self.policy.place(task, self)
        c = self.clusters[name]
        unit = next(u for u in c.units if u.key == (device, product))
        self.result.outcomes[task.id] = TaskOutcome(task, name, device, product)
        work = self.work_s(task, unit)
        self._seq += 1
        job = _Job(self._seq, self.now, 0.0, (device, product), True, task, c.spec.billed_overhead_s + work, work,
                   unit.fraction)
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

    def _finish(self, c: _Cluster, job: _Job, token: int) -> None:
        if token != job.token or job.start is None:
            return
        self._release(c, job)
        if job.ours:
            u = c.units[job.unit]
            self.result.segments.append(Segment(job.task.id, c.spec.name, u.device, u.product, u.fraction, job.start,
                                                self.now, job.work, True))
            self.result.outcomes[job.task.id].end_s = self.now
        job.start = None
        self._dispatch(c)

    def _preempt(self, c: _Cluster, hold_s: float) -> None:
        victims = [j for j in c.running if j.ours]
        if not victims:
            return
        v = max(victims, key=lambda j: (j.start, j.seq))
        u = c.units[v.unit]
        self.result.segments.append(Segment(v.task.id, c.spec.name, u.device, u.product, u.fraction, v.start,
                                            self.now, 0.0, False))
        i = v.unit
        self._release(c, v)
        v.start, v.unit = None, None
        v.token += 1
        self._seq += 1
        self._start(c, _Job(self._seq, self.now, self.now, u.key, False, dur=hold_s), i)
        v.ready = self.now + c.spec.launch_latency_s
        bisect.insort(c.queue, (v.prio, v.seq, v))
        self._push(v.ready, self._dispatch, c)

    # --- what the policy may see -------------------------------------------------------------------
    def forecast_wait(self, name: str, key: tuple[str, str]) -> float:
        """Seconds (beyond the launch latency) until a step of ours submitted now to pool ``key`` of
        cluster ``name`` would be allocated, ignoring future arrivals, preemptions and outages — the
        simulator's stand-in for ``sbatch --test-only`` (strict FIFO per pool, the throttle shared)."""
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
        for _p, _s, job in c.queue:
            h = heaps.get(job.key)
            if not h:
                continue
            st = max(job.ready, h[0], slots[0] if (slots is not None and job.ours) else -math.inf)
            heapq.heapreplace(h, st + job.dur)
            if slots is not None and job.ours:
                heapq.heapreplace(slots, st + job.dur)
        h = heaps.get(key)
        if not h:
            return math.inf
        st = max(ready, h[0], slots[0] if slots is not None else -math.inf)
        return max(0.0, st - ready)

    def snapshot(self) -> Snapshot:
        """The live state as the backends would report it now (see ``dagster_gpu.policy.snapshot``)."""
        states = {}
        for name, typ in (("slurm", SlurmState), ("kubernetes", KubernetesState), ("local", LocalState)):
            c = self.clusters.get(name)
            if c is None:
                continue
            s = c.spec
            down_until = s.outage_end(self.now)
            if down_until is not None and not s.outages_announced:
                states[name] = typ(reachable=False, reason="simulated outage")
                continue
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
            states[name] = typ(**kw)
        return Snapshot(rate_card=self.sc.rate_card, taken_at=self.now, **states)


def simulate(scenario: Scenario, policy: Policy) -> SimResult:
    """Run ``scenario`` under ``policy`` (a policy named ``resident`` gets the resident devices)."""
    return Simulation(scenario, policy, resident=getattr(policy, "resident", False)).run()
