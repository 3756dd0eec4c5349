"""The placement record: chosen backend, reason, and every alternative considered (pure).

It travels to the step worker inside the step context (JSON) and is recorded on the
materialization as ``dagster_gpu/placement``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


def _finite_or_none(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


@dataclass(frozen=True)
class Alternative:
    """One candidate placement.

    Attributes:
        backend: ``local``, ``slurm`` or ``kubernetes``.
        device: device type priced from the rate card (``NVIDIA A100-SXM4-80GB``, ``mig-1g.10gb``, ``cpu``).
        feasible: whether any device of this backend can satisfy the request.
        start_delay_s: estimated seconds from launch to start, None if unknown.
        runtime_s: estimated seconds of running, None if unknown.
        cost_usd: estimated cost in USD, None if unknown.
        note: why infeasible, unreachable, or how the estimate was made.
        product: parent product of the device (``NVIDIA A100-SXM4-80GB`` for a MIG slice), None if unknown.
        device_fraction: share of one GPU billed per device (1.0 for a full GPU, 1/7 for ``mig-1g.10gb``).
        finish_s: ``start_delay_s + runtime_s`` (seconds from launch to expected finish), None if unknown.
        meets_deadline: whether ``finish_s`` is within the request's deadline (True for ``batch``),
            None when the alternative is infeasible.
        preemptions_per_gpu_hour: the pool's preemption rate used (per GPU-hour), None when not evaluated.
        preemption_rate_learned: whether that rate was learned from observed preemptions (False: the
            configured prior), None when not evaluated.
        expected_preemptions: the rate × the unit's GPU-hours (:mod:`dagster_gpu.policy.preemption`).
        preemption_rework_s: expected seconds of rework those preemptions add (included in ``runtime_s``).
        expected_preemption_cost_usd: USD of that rework (included in ``cost_usd``).
        cluster: the fleet's cluster this alternative is on (``campus``, ``lab-k8s``), None outside a fleet.
    """

    backend: str
    device: str | None = None
    feasible: bool = True
    start_delay_s: float | None = None
    runtime_s: float | None = None
    cost_usd: float | None = None
    note: str = ""
    product: str | None = None
    device_fraction: float | None = None
    finish_s: float | None = None
    meets_deadline: bool | None = None
    preemptions_per_gpu_hour: float | None = None
    preemption_rate_learned: bool | None = None
    expected_preemptions: float | None = None
    preemption_rework_s: float | None = None
    expected_preemption_cost_usd: float | None = None
    cluster: str | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        for k in ("start_delay_s", "runtime_s", "cost_usd", "device_fraction", "finish_s", "preemptions_per_gpu_hour",
                  "expected_preemptions", "preemption_rework_s", "expected_preemption_cost_usd"):
            d[k] = _finite_or_none(d[k])
        return d


@dataclass(frozen=True)
class Placement:
    """The decision for one step: ``backend`` (+ ``device``) chosen for ``reason``.

    Attributes:
        backend, device, reason: what was chosen and why (one sentence a person can read).
        alternatives: every candidate considered, the chosen one included.
        product: parent product of the chosen device (for a MIG slice, the GPU it is cut from).
        deadline_s: the request's deadline in seconds from launch (None = ``batch``).
        deadline_met: False when no candidate was expected to finish within the deadline (the miss
            is recorded here and in ``reason``); True otherwise.
        shared: for a ``shared_ok`` step placed on Kubernetes, whether it may get a shared device
            (TimeSlicing/MPS): False on a pool where a shared claim failed to prepare
            (``KubernetesState.no_sharing``); None when the policy did not decide it (the request's
            ``shared_ok`` then applies).
        cluster: the fleet's cluster chosen (``dagster_gpu.fleet``), None outside a fleet: the backend's
            own section then.
    """

    backend: str
    reason: str
    device: str | None = None
    alternatives: tuple[Alternative, ...] = field(default_factory=tuple)
    product: str | None = None
    deadline_s: float | None = None
    deadline_met: bool = True
    shared: bool | None = None
    cluster: str | None = None

    @property
    def chosen(self) -> Alternative | None:
        """The alternative that was chosen (same backend, device and product), if recorded."""
        for a in self.alternatives:
            if (a.feasible and a.backend == self.backend and a.device == self.device and a.product == self.product
                    and a.cluster == self.cluster):
                return a
        return None

    @property
    def expected_preemption_cost_usd(self) -> float | None:
        """USD the chosen alternative expects to lose to preemptions (start-ups and lost work redone; part of
        its cost); None when it was not evaluated (a forced placement)."""
        a = self.chosen
        return a.expected_preemption_cost_usd if a else None

    @property
    def preemptions_per_gpu_hour(self) -> float | None:
        """The chosen pool's preemption rate (per GPU-hour) used for that cost; None when not evaluated."""
        a = self.chosen
        return a.preemptions_per_gpu_hour if a else None

    @property
    def preemption_rate_learned(self) -> bool | None:
        """Whether that rate was learned from observed preemptions (False: the prior); None when not evaluated."""
        a = self.chosen
        return a.preemption_rate_learned if a else None

    def to_json(self) -> dict:
        """The placement as JSON (the chosen alternative's preemption figures repeated at the top, read-only:
        :meth:`from_json` takes them from the alternatives)."""
        return {
            "backend": self.backend,
            "device": self.device,
            "product": self.product,
            "reason": self.reason,
            "deadline_s": _finite_or_none(self.deadline_s),
            "deadline_met": self.deadline_met,
            "shared": self.shared,
            "cluster": self.cluster,
            "expected_preemption_cost_usd": _finite_or_none(self.expected_preemption_cost_usd),
            "preemptions_per_gpu_hour": _finite_or_none(self.preemptions_per_gpu_hour),
            "preemption_rate_learned": self.preemption_rate_learned,
            "alternatives": [a.to_json() for a in self.alternatives],
        }

    @classmethod
    def from_json(cls, d: dict) -> "Placement":
        return cls(
            backend=d["backend"],
            reason=d.get("reason", ""),
            device=d.get("device"),
            alternatives=tuple(Alternative(**a) for a in d.get("alternatives", [])),
            product=d.get("product"),
            deadline_s=d.get("deadline_s"),
            deadline_met=d.get("deadline_met", True),
            shared=d.get("shared"),
            cluster=d.get("cluster"),
        )
