"""The step worker's command line and environment, from Dagster's ExecuteStepArgs."""

from __future__ import annotations

from dagster._grpc.types import ExecuteStepArgs


def worker_argv(args: ExecuteStepArgs, python: str | None = None) -> tuple[str, ...]:
    """``<python> -m dagster api execute_step``; the step args travel in the environment, not argv.

    ``python`` defaults to the code location's interpreter (``job_origin.executable_path``), so the
    worker needs no ``dagster`` on PATH.
    """
    base = list(args.get_command_args(skip_serialized_namedtuple=True))
    # base = [<entry point...>, "api", "execute_step"]; replace the entry point.
    tail = base[base.index("api") :]
    exe = python or args.job_origin.executable_path
    return (exe, "-m", "dagster", *tail)


def worker_env(args: ExecuteStepArgs, run_job_name: str, step_key: str) -> dict[str, str]:
    """``DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS`` plus the job/step names dagster-k8s also sets."""
    env = {e["name"]: e["value"] for e in args.get_command_env()}
    env["DAGSTER_RUN_JOB_NAME"] = run_job_name
    env["DAGSTER_RUN_STEP_KEY"] = step_key
    return env
