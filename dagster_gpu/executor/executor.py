"""``gpu_executor``: a step-delegating Dagster executor that places each step on local, Slurm or Kubernetes.

Run config (``execution: config:``)::

    backend: auto | local | slurm | kubernetes      # default auto (the cost policy, or the only backend)
    rate_card: /path/to/ratecard.yaml              # default: the packaged dagster_gpu/data/ratecard.yaml
    worker_python: /opt/venv/bin/python            # fallback for every backend; a backend's own worker_python wins
                                                   # (default: kubernetes the image's python, else the code
                                                   # location's interpreter)
    local: {log_dir: ..., cuda_visible_devices: "0", terminate_grace_seconds: 10, enabled: true}
    slurm: {...}                                   # see dagster_gpu.slurm.backend
    kubernetes: {...}                              # see dagster_gpu.k8s.backend
    retries: {enabled: {}} | {disabled: {}}
    max_concurrent: N                              # steps in flight per run
    tag_concurrency_limits: [...]
    sleep_seconds: 0.5                             # event-log polling period
    check_step_health_interval_seconds: 5

The per-step GPU request comes from the asset's op tags (``dagster_gpu.core.request``). Steps are verified
(``should_verify_step``) so a duplicate worker never runs a step twice.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
from dagster import multiple_process_executor_requirements
from dagster._core.execution.retries import RetryMode, get_retries_config
from dagster._core.execution.tags import get_tag_concurrency_limits_config
from dagster_gpu.executor.registry import BACKENDS
from dagster_gpu.executor.step_handler import GpuStepHandler
from dagster_gpu.executor.user_terminate import GpuStepDelegatingExecutor


def _backend_fields() -> dict[str, dg.Field]:
    return {name: module.config_field() for name, module in BACKENDS.items()}


GPU_EXECUTOR_CONFIG = {
    "backend": dg.Field(
        dg.Enum("GpuBackend", [dg.EnumValue(v) for v in ("auto", "local", "slurm", "kubernetes")]),
        default_value="auto",
        description="Where steps run: a fixed backend, or auto (cost policy over the configured backends).",
    ),
    "rate_card": dg.Field(dg.StringSource, is_required=False, description="Rate card YAML (USD per GPU-hour)."),
    "worker_python": dg.Field(dg.StringSource, is_required=False, description="Python interpreter for step workers of every backend whose section sets no worker_python (default: on kubernetes the image's python from PATH, elsewhere the code location's interpreter)."),
    **_backend_fields(),
    "retries": get_retries_config(),
    "max_concurrent": dg.Field(dg.Noneable(int), default_value=None, is_required=False),
    "tag_concurrency_limits": get_tag_concurrency_limits_config(),
    "sleep_seconds": dg.Field(float, is_required=False, description="Event-log polling period (s)."),
    "check_step_health_interval_seconds": dg.Field(int, default_value=5),
}


def gpu_executor_with(step_handler_class: type[GpuStepHandler]) -> dg.ExecutorDefinition:
    """gpu_executor (same name, config schema and requirements) whose steps go through ``step_handler_class``,
    a :class:`GpuStepHandler` subclass built as ``step_handler_class(config, default_log_dir)``."""

    @dg.executor(name="gpu_executor", config_schema=GPU_EXECUTOR_CONFIG, requirements=multiple_process_executor_requirements())
    def _gpu_executor(init_context: dg.InitExecutorContext) -> GpuStepDelegatingExecutor:
        return _build(init_context, step_handler_class)

    return _gpu_executor


@dg.executor(
    name="gpu_executor",
    config_schema=GPU_EXECUTOR_CONFIG,
    requirements=multiple_process_executor_requirements(),
)
def gpu_executor(init_context: dg.InitExecutorContext) -> GpuStepDelegatingExecutor:
    """Step-delegating executor placing each step on ``local``, ``slurm`` or ``kubernetes`` (see module doc)."""
    return _build(init_context, GpuStepHandler)


def _build(init_context: dg.InitExecutorContext, step_handler_class: type[GpuStepHandler]) -> GpuStepDelegatingExecutor:
    cfg = dict(init_context.executor_config)
    instance = init_context.instance
    default_log_dir = Path(instance.root_directory if instance.is_persistent else os.getcwd()) / "dagster_gpu" / "local-workers"
    handler = step_handler_class(cfg, default_log_dir)
    return GpuStepDelegatingExecutor(
        handler,
        retries=RetryMode.from_config(cfg["retries"]),
        sleep_seconds=cfg.get("sleep_seconds"),
        check_step_health_interval_seconds=cfg["check_step_health_interval_seconds"],
        max_concurrent=cfg.get("max_concurrent"),
        tag_concurrency_limits=cfg.get("tag_concurrency_limits"),
        should_verify_step=True,
    )
