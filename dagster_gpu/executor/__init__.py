"""gpu_executor and its step handler."""

from dagster_gpu.executor.executor import gpu_executor

__all__ = ["gpu_executor"]
