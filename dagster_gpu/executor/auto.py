"""``backend: auto`` across several configured backends: ask the cost policy."""

from __future__ import annotations

from dagster_gpu.executor.backends.base import BackendNotConfigured
from dagster_gpu.policy.placement import Placement
from dagster_gpu.request import GpuRequest


def auto_placement(handler, request: GpuRequest, ctx, step_key: str) -> Placement:
    raise BackendNotConfigured("auto placement across several backends needs the cost policy (dagster_gpu.policy)")
