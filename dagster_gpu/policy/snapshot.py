"""The live-state snapshot the cost policy decides on (pure data, no I/O).

The backends fill these records; the policy (:func:`dagster_gpu.policy.policy.decide`) only reads them.
All times are seconds, counted from the moment the snapshot was taken ("now"); all rates are USD per
GPU-hour (from the :class:`~dagster_gpu.billing.ratecard.RateCard` carried in :class:`Snapshot`).

Who fills what
--------------
Each backend's ``policy_state()``; ``dagster_gpu.executor.auto`` records a backend that raised as
``reachable=False`` with the error as ``reason``.

*Slurm* (:class:`SlurmState`, ``SlurmBackend.policy_state``): one :class:`DeviceGroup` of the configured
``gpu_product`` / ``gpu_memory_gib`` (untyped GRES do not name the product):

- ``DeviceGroup.total``: ``gpu`` GRES over the slurm partition's nodes (``sinfo --Node -o %N|%G``, cached 5 min);
- ``DeviceGroup.free``: total minus the GPUs that running jobs hold, ``DeviceGroup.pending``: jobs and array
  tasks pending in the slurm partition (one ``squeue -t RUNNING,PENDING -o %T|%b``);
- ``DeviceGroup.start_estimate_s``: when the free GPUs do not outnumber the pending tasks, ``StartTime - now``
  of ``sbatch --test-only`` with our options and ``--gres=gpu:1`` (None when it cannot say);
- ``array_throttle``: the configured ``throttle``; ``running_tasks``: GPUs held (at most the total);
- ``time_limit_s``: not filled by the backend (None: set it in a snapshot for the simulator or ``whatif``);
- ``preemption_pool``: ``slurm:<slurm partition>/<qos>`` and ``preemptions_per_gpu_hour``: the ``slurm`` section's
  prior (:mod:`dagster_gpu.policy.preemption`; the executor and ``whatif`` blend in what the instance observed).

*Kubernetes* (:class:`KubernetesState`, ``KubernetesBackend.policy_state``): one :class:`DeviceGroup` per
distinct (device type, product, memory, MIG profile) among the NVIDIA driver's ResourceSlice devices
(``dagster_gpu.k8s.inventory.device_groups``: each pool's newest slice generation; devices that consume
shared counters, as dynamic MIG's, counted by what the counters allow); ``free`` counts devices not in any
ResourceClaim's ``status.allocation``; ``pending`` counts our Pending pods by their placement-device annotation;
``start_estimate_s`` is not filled (None); ``preemption_pool`` is ``kubernetes:<priority class>`` and
``preemptions_per_gpu_hour`` the ``kubernetes`` section's prior, as for Slurm; ``no_sharing`` lists the pools where a shared claim failed to
prepare (the driver's sharing feature gates are off: ``dagster_gpu.k8s.sharing_failures``).

*Local* (:class:`LocalState`, ``LocalBackend.policy_state``): one group per GPU product NVML sees, ``free``
= total minus our running workers; a CPU-only host has none (it can only run ``count == 0`` steps, priced
as ``cpu``).

Launch latencies: ``launch_latency_s`` is the unbilled time from submission to a device being allocated
when one is free (Slurm's scheduling pass, kube-scheduler + claim allocation); ``billed_overhead_s`` is
billed device time on top of the work (worker start, model load, pod teardown).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from dagster_gpu.billing.ratecard import RateCard, mig_fraction


class DeviceKind:
    """Mixin for records of identical devices with ``device``, ``product`` and ``mig_profile`` fields."""

    device: str
    product: str
    mig_profile: str | None

    @property
    def fraction(self) -> float:
        """Share of one GPU this device is billed as: 1.0, or the MIG compute fraction of its parent product
        (1g of an A100 -> 1/7, of an A30 -> 1/4)."""
        return mig_fraction(self.mig_profile, self.product or None) if self.mig_profile else 1.0

    @property
    def key(self) -> tuple[str, str]:
        """Identity of the kind within a backend: ``(device, product)``."""
        return (self.device, self.product)


@dataclass(frozen=True)
class DeviceGroup(DeviceKind):
    """Identical devices of one kind on one backend.

    Attributes:
        device: rate-card device type: the product name for a full GPU (``NVIDIA A100-SXM4-80GB``) or
            ``mig-<profile>`` for a MIG slice (``mig-1g.10gb``).
        product: product name of the (parent) GPU, ``NVIDIA A100-SXM4-80GB``.
        memory_gib: memory of one device in GiB (of the slice, for MIG: 1g.10gb -> 10).
        free: devices idle now (not allocated to any job/claim), >= 0.
        total: devices in service (free + allocated), >= free.
        pending: our own tasks/pods already waiting for a device of this pool, >= 0.
        start_estimate_s: seconds until a device would be allocated to a request submitted now
            (excluding launch latency), None if unknown; 0 when ``free > pending``.
        mig_profile: MIG profile (``1g.10gb``) or None for a full GPU.
    """

    device: str
    product: str
    memory_gib: float
    free: int
    total: int
    pending: int = 0
    start_estimate_s: float | None = None
    mig_profile: str | None = None



@dataclass(frozen=True)
class BackendState:
    """Common fields of a backend's state (see subclasses).

    Attributes:
        reachable: whether the backend answered when the snapshot was taken.
        reason: why it is unreachable (scheduler's or client's words), "" when reachable.
        pools: device pools (see :class:`DeviceGroup`).
        launch_latency_s: unbilled seconds from submission to allocation when a device is free.
        billed_overhead_s: billed device seconds per step on top of the work (start + model load).
        cpu_available: whether a ``count == 0`` (CPU) step can run there.
        back_in_s: when unreachable, seconds until an *announced* outage ends (a Slurm reservation with
            the MAINT flag, a published Kubernetes maintenance window); None = unknown, and then the
            backend is skipped. When set, the pools describe the state expected when it returns.
        preemptions_per_gpu_hour: expected preemptions per GPU-hour of our units there (0 = not preemptible):
            the configured prior, or the rate learned from observed preemptions
            (:func:`dagster_gpu.policy.preemption.with_rates`).
        preemption_pool: the pool's name (:func:`dagster_gpu.policy.preemption.pool_key`), "" when unnamed.
        preemption_source: how ``preemptions_per_gpu_hour`` was set, in words ("" = as configured).
        preemption_learned: True when observations of the pool moved the rate off its prior.
    """

    reachable: bool = True
    reason: str = ""
    back_in_s: float | None = None
    pools: tuple[DeviceGroup, ...] = ()
    launch_latency_s: float = 0.0
    billed_overhead_s: float = 0.0
    cpu_available: bool = True
    preemptions_per_gpu_hour: float = 0.0
    preemption_pool: str = ""
    preemption_source: str = ""
    preemption_learned: bool = False

    @property
    def pending(self) -> int:
        """Our tasks/pods waiting, summed over pools."""
        return sum(p.pending for p in self.pools)


@dataclass(frozen=True)
class SlurmState(BackendState):
    """Slurm: idle GPUs by type in our slurm partition, our pending array tasks, the controller's estimate.

    Attributes (besides :class:`BackendState`):
        slurm_partition: the slurm partition we submit to.
        array_throttle: the ``%N`` throttle of our array (None = none): at most N of our tasks run.
        running_tasks: our array tasks running now.
        time_limit_s: the slurm partition's (or our QOS's) time limit; a longer step is infeasible.
    """

    slurm_partition: str = ""
    array_throttle: int | None = None
    running_tasks: int = 0
    time_limit_s: float | None = None
    launch_latency_s: float = 5.0
    billed_overhead_s: float = 20.0


@dataclass(frozen=True)
class QueueState:
    """A Kueue LocalQueue our step pods wait in, and its ClusterQueue's quota (filled by
    :func:`dagster_gpu.k8s.kueue.queue_state`).

    Attributes:
        local_queue, cluster_queue: their names (cluster_queue "" when the LocalQueue names none that exists).
        pending: workloads pending ahead of a new one, >= 0: the ClusterQueue's (Kueue's visibility API) where
            served, else the LocalQueue's status.pendingWorkloads.
        admitted: workloads the LocalQueue has admitted now.
        quota_free: per pool device (``DeviceGroup.device``): devices the ClusterQueue could admit now, its own
            unused nominal quota plus what it may borrow from its cohort's unused quota; a pool absent here has
            no quota in the ClusterQueue (0).
        quota_total: per pool device: the most the ClusterQueue can ever hold (nominal + borrowing limit,
            bounded by the cohort).
        active: the ClusterQueue's ``Active`` condition; False: nothing is admitted until it is.
    """

    local_queue: str
    cluster_queue: str = ""
    pending: int = 0
    admitted: int = 0
    quota_free: Mapping[str, float] = field(default_factory=dict)
    quota_total: Mapping[str, float] = field(default_factory=dict)
    active: bool = True

    def describe(self, device: str | None = None) -> str:
        """``Kueue LocalQueue batch -> ClusterQueue batch: 2 pending, 1 admitted, quota for mig-1g.10gb 0 free
        of 2`` (the quota of ``device``'s pool when given)."""
        head = f"Kueue LocalQueue {self.local_queue} -> ClusterQueue {self.cluster_queue or '(none)'}"
        out = f"{head}: {self.pending} pending, {self.admitted} admitted" + ("" if self.active else ", inactive")
        if device is not None:
            out += f", quota for {device} {self.quota_free.get(device, 0):g} free of {self.quota_total.get(device, 0):g}"
        return out


@dataclass(frozen=True)
class KubernetesState(BackendState):
    """Kubernetes with DRA: devices in ResourceSlices not allocated to any claim, our pending pods.

    Attributes (besides :class:`BackendState`):
        namespace: where our pods run.
        no_sharing: device types of pools where a shared (TimeSlicing/MPS) claim failed to prepare (``*``:
            every pool), from :class:`dagster_gpu.k8s.sharing_failures.SharingFailures`; a ``shared_ok``
            step placed there gets an unshared device (``Placement.shared`` False).
        queue: the Kueue LocalQueue step pods are queued in (``kubernetes.queue_name``), None when not queued:
            the wait is then the queue's (:func:`dagster_gpu.policy.policy` ``_wait``).
    """

    namespace: str = "default"
    no_sharing: tuple[str, ...] = ()
    queue: QueueState | None = None
    launch_latency_s: float = 10.0
    billed_overhead_s: float = 30.0


@dataclass(frozen=True)
class LocalState(BackendState):
    """The run worker's own host: a GPU host (pools) or a CPU-only host (no pools).

    Attributes (besides :class:`BackendState`):
        cpu_slowdown: how many times slower a GPU step runs on this host's CPU (used only when the
            request has ``count == 0`` and there is GPU history but no CPU history; with no history at all
            the measured CPU fallback, ``FALLBACK_CPU_TEXTS_PER_SECOND``, is used). Default 20 (assumption: a small
            sentence-transformers model runs roughly an order of magnitude or more slower on CPU).
    """

    cpu_slowdown: float = 20.0
    launch_latency_s: float = 1.0
    billed_overhead_s: float = 10.0


@dataclass(frozen=True)
class Snapshot:
    """Everything the policy may know about the world at one instant.

    Attributes:
        rate_card: USD per GPU-hour by backend and device type.
        slurm, kubernetes, local: each backend's state, or None when that backend is not configured.
        taken_at: wall-clock UNIX seconds of the snapshot (informational only; the policy never reads a clock).
    """

    rate_card: RateCard
    slurm: SlurmState | None = None
    kubernetes: KubernetesState | None = None
    local: LocalState | None = None
    taken_at: float = 0.0

    def backend(self, name: str) -> BackendState | None:
        """The state of ``name`` (``local``/``slurm``/``kubernetes``), None if not configured."""
        return {"slurm": self.slurm, "kubernetes": self.kubernetes, "local": self.local}[name]

    def with_backend(self, name: str, state: BackendState | None) -> "Snapshot":
        return replace(self, **{name: state})

    # --- JSON (the what-if CLI reads this; backends may dump it for debugging) ---------------------
    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"taken_at": self.taken_at, "rate_card": {"backends": _plain(self.rate_card.rates)}}
        for name in ("slurm", "kubernetes", "local"):
            st = self.backend(name)
            if st is not None:
                out[name] = asdict(st)
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], rate_card: RateCard | None = None) -> "Snapshot":
        """Inverse of :meth:`to_json`. ``rate_card`` overrides the document's (else the packaged default)."""
        if rate_card is None:
            rate_card = RateCard.from_dict(doc["rate_card"], source="snapshot") if "rate_card" in doc else RateCard.load()
        states: dict[str, BackendState | None] = {}
        for name, typ in (("slurm", SlurmState), ("kubernetes", KubernetesState), ("local", LocalState)):
            d = doc.get(name)
            if d is None:
                states[name] = None
                continue
            d = dict(d)
            d["pools"] = tuple(DeviceGroup(**p) for p in d.get("pools", ()))
            if "no_sharing" in d:  # JSON has lists; the state holds a tuple
                d["no_sharing"] = tuple(d["no_sharing"])
            if d.get("queue") is not None:
                d["queue"] = QueueState(**d["queue"])
            states[name] = typ(**d)
        return cls(rate_card=rate_card, taken_at=float(doc.get("taken_at", 0.0)), **states)

    @classmethod
    def loads(cls, text: str, rate_card: RateCard | None = None) -> "Snapshot":
        return cls.from_json(json.loads(text), rate_card)


def _plain(m: Mapping) -> dict:
    return {k: (_plain(v) if isinstance(v, Mapping) else v) for k, v in m.items()}


def after_submit(snapshot: Snapshot, backend: str, device: str | None, product: str | None) -> Snapshot:
    """The snapshot as it would look right after one more step was submitted to ``backend``'s pool
    ``(device, product)``: one fewer free device if any was free, else one more pending; the pool's
    ``start_estimate_s`` is dropped once it no longer holds (the policy then falls back to its queue
    estimate). Used by the what-if planner to plan a backfill without launching. Pure."""
    st = snapshot.backend(backend)
    if st is None or device is None:
        return snapshot
    pools = []
    started = False
    throttled = isinstance(st, SlurmState) and st.array_throttle is not None and st.running_tasks >= st.array_throttle
    for p in st.pools:
        if p.key == (device, product):
            if p.free > p.pending and not throttled:
                p = replace(p, free=p.free - 1)
                started = True
            else:
                p = replace(p, pending=p.pending + 1, start_estimate_s=None)
        pools.append(p)
    new = replace(st, pools=tuple(pools))
    if started and isinstance(new, SlurmState):
        new = replace(new, running_tasks=new.running_tasks + 1)
    return snapshot.with_backend(backend, new)
