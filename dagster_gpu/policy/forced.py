"""Which backend a step is forced onto, if any: the one place that rule is written (pure).

Precedence: the step's ``dagster-gpu/backend`` tag (``GpuRequest.backend``), then a configured backend that
is not ``auto`` (gpu_executor's ``backend`` setting, or a what-if mode), then the only candidate when just
one backend is configured. Callers:

- the executor (``GpuStepHandler.place``): a forced step is placed there as is (:meth:`ForcedBackend.placement`),
  without asking the backends for their state or the policy for estimates;
- the policy (:func:`dagster_gpu.policy.policy.decide`, :func:`dagster_gpu.policy.ranges.plan_range`), for
  what-if and the simulator: the choice is restricted to the forced backend, the other alternatives are
  still estimated and recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dagster_gpu.core.request import TAG_BACKEND, GpuRequest
from dagster_gpu.policy.placement import Alternative, Placement


@dataclass(frozen=True)
class ForcedBackend:
    """A backend the step must run on, and what forced it.

    Attributes:
        backend: ``local``, ``slurm`` or ``kubernetes``.
        by: ``tag`` (the step's ``dagster-gpu/backend``), ``config`` (a configured backend other than
            ``auto``) or ``only`` (the only configured backend).
    """

    backend: str
    by: str

    @property
    def reason(self) -> str:
        """The placement reason, e.g. ``forced by tag dagster-gpu/backend=slurm``."""
        if self.by == "tag":
            return f"forced by tag {TAG_BACKEND}={self.backend}"
        if self.by == "config":
            return f"forced by gpu_executor config backend: {self.backend}"
        return f"auto: {self.backend} is the only configured backend"

    def placement(self) -> Placement:
        """The placement without estimates (the executor's forced step): its one alternative has no note, since
        :attr:`reason` already says why (a note would repeat it on the materialization's placement line)."""
        return Placement(backend=self.backend, reason=self.reason, alternatives=(Alternative(backend=self.backend),))


def forced_backend(request: GpuRequest, configured: str | None = "auto", candidates: Sequence[str] = ()) -> ForcedBackend | None:
    """The backend ``request`` is forced onto (see the module doc for the precedence), or None: the cost
    policy chooses.

    Args:
        request: the step's GPU request (its ``backend`` is the ``dagster-gpu/backend`` tag).
        configured: gpu_executor's ``backend`` setting, or a what-if mode; ``auto`` or None: not forced.
        candidates: the configured backends (one only: forced onto it); empty: not considered.
    """
    if request.backend:
        return ForcedBackend(request.backend, "tag")
    if configured and configured != "auto":
        return ForcedBackend(configured, "config")
    if len(candidates) == 1:
        return ForcedBackend(candidates[0], "only")
    return None
