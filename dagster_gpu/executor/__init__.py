"""gpu_executor and its step handler.

``gpu_executor`` is imported on first use, so a backend module (e.g. the requeue check a Slurm array task
runs) imports without building the executor's config schema.
"""

from importlib import import_module

__all__ = ["gpu_executor"]


def __getattr__(name: str):
    if name == "gpu_executor":
        return import_module("dagster_gpu.executor.executor").gpu_executor  # on first use: importing executor.command (the Slurm requeue check) builds no config schema
    raise AttributeError(f"module 'dagster_gpu.executor' has no attribute {name!r}")
