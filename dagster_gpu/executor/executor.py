"""``gpu_executor``: a step-delegating Dagster executor that places each step on local, Slurm or Kubernetes.

Run config (``execution: config:``): :data:`GPU_EXECUTOR_CONFIG`; each backend's section is generated from its
settings class (``dagster_gpu.settings.schema``). Every key with its type, default and description:
docs/reference/configuration.md, generated from this schema when the docs site is built.

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

from dagster_gpu.executor.fleet import clusters_field
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
    "clusters": clusters_field(),
    "retries": get_retries_config(),
    "max_concurrent": dg.Field(dg.Noneable(int), default_value=None, is_required=False,
                               description="Steps of one run in flight at once (Dagster's StepDelegatingExecutor); null: no limit."),
    "tag_concurrency_limits": get_tag_concurrency_limits_config(),
    "sleep_seconds": dg.Field(float, is_required=False, description="Event-log polling period (s)."),
    "check_step_health_interval_seconds": dg.Field(
        int, default_value=5,
        description="Seconds between health checks of each running step's worker: a worker that ended without "
                    "its step recording an outcome fails the step with the backend's state, exit code and log tail."),
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
