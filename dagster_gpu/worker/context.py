"""The step context: what the executor tells the step worker, through one environment variable.

``DAGSTER_GPU_STEP_CONTEXT`` holds JSON::

    {"backend": "local", "placement": {...Placement.to_json()...},
     "rates": {"cpu": 0.05, "default": 1.0},      # this backend's rate table, USD per GPU-hour
     "gpu_count": 1, "device_fraction": null}       # fraction for MIG / shared GPUs (None = whole)

It carries no secret. A step run without gpu_executor (``materialize()`` in a test) gets
:meth:`StepContext.in_process`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.contracts import STEP_CONTEXT_ENV, encode_step_context, read_step_context
from dagster_gpu.policy.placement import Placement

ENV_VAR = STEP_CONTEXT_ENV


@dataclass(frozen=True)
class StepContext:
    backend: str
    placement: Placement
    rates: Mapping[str, float]
    gpu_count: int = 1
    device_fraction: float | None = None
    launched_by_executor: bool = True
    extra: Mapping[str, str] = field(default_factory=dict)

    def to_env(self) -> dict[str, str]:
        return encode_step_context({
            "backend": self.backend,
            "placement": self.placement.to_json(),
            "rates": dict(self.rates),
            "gpu_count": self.gpu_count,
            "device_fraction": self.device_fraction,
            "extra": dict(self.extra),
        })

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "StepContext":
        d = read_step_context(env if env is not None else os.environ)
        if not d:
            return cls.in_process()
        return cls(
            backend=d["backend"],
            placement=Placement.from_json(d["placement"]),
            rates=d.get("rates", {}),
            gpu_count=int(d.get("gpu_count", 1)),
            device_fraction=d.get("device_fraction"),
            launched_by_executor=True,
            extra=d.get("extra", {}),
        )

    @classmethod
    def in_process(cls) -> "StepContext":
        return cls(
            backend="local",
            placement=Placement(backend="local", reason="in-process execution: not launched by gpu_executor"),
            rates=RateCard.load().table("local"),
            launched_by_executor=False,
        )
