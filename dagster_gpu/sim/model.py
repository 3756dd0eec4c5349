"""Inputs of the fleet simulator (pure data): devices, clusters, workload, scenario.

Units: seconds for every time (from the start of the simulated window), USD per GPU-hour for rates.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.core.request import GpuRequest
from dagster_gpu.policy.runtime import RuntimeModel
from dagster_gpu.policy.snapshot import DeviceKind

A100 = "NVIDIA A100-SXM4-80GB"


@dataclass(frozen=True)
class Units(DeviceKind):
    """``count`` identical devices: a full GPU (``device == product``) or a MIG slice (``device = mig-<profile>``)."""

    device: str
    product: str
    memory_gib: float
    count: int
    mig_profile: str | None = None


def full_gpus(count: int, product: str = A100, memory_gib: float = 80.0) -> Units:
    return Units(product, product, memory_gib, count)


def mig_slices(count: int, profile: str = "1g.10gb", product: str = A100) -> Units:
    return Units(f"mig-{profile}", product, float(profile.split(".")[1].rstrip("gb")), count, profile)


@dataclass(frozen=True)
class BackgroundJob:
    """Another user's Slurm job: submitted at ``submit_s``, holds one device of ``key`` for ``duration_s``."""

    submit_s: float
    duration_s: float
    key: tuple[str, str] = (A100, A100)


@dataclass(frozen=True)
class Preemption:
    """At ``at_s`` a higher-priority job preempts our most recently started running task on the cluster
    (it is requeued, its work lost, the time it ran still billed) and holds that device ``hold_s``."""

    at_s: float
    hold_s: float


@dataclass(frozen=True)
class ClusterSpec:
    """One backend's fleet.

    Attributes:
        name: ``slurm``, ``kubernetes`` or ``local``; in a fleet any cluster name (``kind`` then says which).
        units: its devices.
        launch_latency_s: unbilled seconds from submission to being allocatable.
        billed_overhead_s: billed seconds per work unit on top of its partitions (the step worker's
            start: python, imports, model load — once per unit, however many partitions it embeds).
        array_throttle: at most this many of our tasks run at once (Slurm ``%N``), None = no limit.
        background: other users' jobs in the same FIFO queue (Slurm).
        preemptions: preemption events (see :class:`Preemption`).
        preemptions_per_gpu_hour: what the snapshot tells the policy about preemption (its prior).
        outages: ``(start_s, end_s)`` control-plane outages: no submissions, no new allocations;
            running work continues; submissions wait for the end.
        outages_announced: whether the snapshot tells the policy when an outage ends (``back_in_s``).
        kind: ``slurm``, ``kubernetes`` or ``local`` for a fleet's cluster named otherwise ("" = its name).
        waiting_budget_s: seconds one of our units may wait in its queue before a policy that spills over
            (:class:`~dagster_gpu.sim.policies.OursFleet`) is asked to move it; None = no budget.
    """

    name: str
    units: tuple[Units, ...]
    launch_latency_s: float = 0.0
    billed_overhead_s: float = 0.0
    array_throttle: int | None = None
    background: tuple[BackgroundJob, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    preemptions_per_gpu_hour: float = 0.0
    outages: tuple[tuple[float, float], ...] = ()
    outages_announced: bool = False
    kind: str = ""
    waiting_budget_s: float | None = None

    @property
    def backend(self) -> str:
        """The backend that runs its units: ``kind``, else its name."""
        return self.kind or self.name

    def outage_end(self, t: float) -> float | None:
        """End of the outage covering ``t``, None if up at ``t``."""
        for a, b in self.outages:
            if a <= t < b:
                return b
        return None


@dataclass(frozen=True)
class Task:
    """One partition: ``rows`` texts arriving at ``arrival_s``; ``deadline_s`` after arrival (None = batch).

    ``run``: tasks with the same ``run`` form one ranged run (a backfill's run over a range of partition
    keys), placed together at their common arrival; None = a run of its own (one partition).
    """

    id: int
    rows: int
    arrival_s: float = 0.0
    deadline_s: float | None = None
    request: GpuRequest = GpuRequest()
    run: int | None = None

    def req(self) -> GpuRequest:
        """The request with this task's deadline as its service class."""
        return replace(self.request, deadline_s=self.deadline_s)


@dataclass(frozen=True)
class Resident:
    """The resident-deployment baseline: ``count`` devices of ``key`` held on ``backend`` for the whole window."""

    count: int
    key: tuple[str, str] = (A100, A100)
    backend: str = "kubernetes"


@dataclass(frozen=True)
class Scenario:
    """A fleet, a workload and the truth about throughput.

    Attributes:
        name, description: for tables.
        clusters: the backends' fleets.
        tasks: the workload.
        model: the throughput truth (the simulator runs steps at exactly this speed; the policy is given
            the same model, i.e. perfect history).
        rate_card: prices.
        window_s: the window the resident baseline holds its devices for (e.g. one day).
        resident: the resident baseline's devices.
    """

    name: str
    description: str
    clusters: tuple[ClusterSpec, ...]
    tasks: tuple[Task, ...]
    model: RuntimeModel
    rate_card: RateCard
    window_s: float
    resident: Resident = field(default_factory=lambda: Resident(1))

    def cluster(self, name: str) -> ClusterSpec | None:
        return next((c for c in self.clusters if c.name == name), None)

    def runs(self) -> list[tuple[Task, ...]]:
        """The workload as runs, in order of first appearance: tasks sharing ``run`` together, others alone.

        Raises:
            ValueError: a run's tasks do not share one arrival time or request (the message names the run).
        """
        groups: dict = {}
        for t in self.tasks:
            groups.setdefault(("run", t.run) if t.run is not None else ("task", t.id), []).append(t)
        for (kind, rid), ts in groups.items():
            if kind == "run" and len({(t.arrival_s, t.deadline_s, t.request) for t in ts}) > 1:
                raise ValueError(f"scenario {self.name!r}: run {rid} mixes arrival times, deadlines or requests")
        return [tuple(ts) for ts in groups.values()]
