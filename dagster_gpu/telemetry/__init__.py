"""GPU telemetry sampled in the step worker (NVML) and its summary statistics."""

from dagster_gpu.telemetry.nvml import NvmlSampler
from dagster_gpu.telemetry.stats import TelemetrySummary, summarize

__all__ = ["NvmlSampler", "TelemetrySummary", "summarize"]
