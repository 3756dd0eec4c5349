"""Choosing a backend for one step: forced by config or tag, or by the cost policy for ``auto``."""

from __future__ import annotations

from typing import Sequence

from dagster_gpu.policy.placement import Alternative, Placement
from dagster_gpu.request import TAG_BACKEND, GpuRequest



def forced_placement(request: GpuRequest, configured_backend: str, candidates: Sequence[str]) -> Placement | None:
    """A placement forced by the step's ``dagster-gpu/backend`` tag, or by the executor's ``backend`` setting."""
    if request.backend:
        return Placement(
            backend=request.backend,
            reason=f"forced by tag {TAG_BACKEND}={request.backend}",
            alternatives=(Alternative(backend=request.backend, note="forced"),),
        )
    if configured_backend != "auto":
        return Placement(
            backend=configured_backend,
            reason=f"forced by gpu_executor config backend: {configured_backend}",
            alternatives=(Alternative(backend=configured_backend, note="forced"),),
        )
    if len(candidates) == 1:
        only = candidates[0]
        return Placement(
            backend=only,
            reason=f"auto: {only} is the only configured backend",
            alternatives=(Alternative(backend=only, note="only configured backend"),),
        )
    return None
