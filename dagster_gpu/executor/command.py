"""The step worker's command line and environment, from Dagster's ExecuteStepArgs.

Every backend starts the worker as a new interpreter (``<python> -m dagster api execute_step``, exec'd
by the local backend's supervisor, by a Slurm array task's script, or as a pod's command), never as a
fork of a process that holds CUDA or tokenizer threads: a forked CUDA context is unusable, and a
Hugging Face fast tokenizer whose Rust thread pool ran before a fork deadlocks in the child.
``TOKENIZERS_PARALLELISM=false`` is set in the worker's environment so a helper the worker itself forks
cannot deadlock either; the worker's encoder parallelises tokenization with its own threads instead
(``dagster_gpu.embedding.encoder``).
"""

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


#: Environment every step worker gets (see the module docstring).
WORKER_FIXED_ENV = {"TOKENIZERS_PARALLELISM": "false"}


def worker_env(args: ExecuteStepArgs, run_job_name: str, step_key: str) -> dict[str, str]:
    """``DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS`` plus the job/step names dagster-k8s also sets, and
    ``WORKER_FIXED_ENV``."""
    env = {e["name"]: e["value"] for e in args.get_command_env()}
    env["DAGSTER_RUN_JOB_NAME"] = run_job_name
    env["DAGSTER_RUN_STEP_KEY"] = step_key
    env.update(WORKER_FIXED_ENV)
    return env
