"""The step worker's command line and environment, from Dagster's ExecuteStepArgs.

Every backend starts the worker as a new interpreter (``<python> -m dagster_gpu.worker.step_main api execute_step``:
Dagster's ``execute_step`` behind an entry point that takes SIGTERM before Dagster does, exec'd
by the local backend's supervisor, by a Slurm array task's script, or as a pod's command), never as a
fork of a process that holds CUDA or tokenizer threads: a forked CUDA context is unusable, and a
Hugging Face fast tokenizer whose Rust thread pool ran before a fork deadlocks in the child.
``TOKENIZERS_PARALLELISM=false`` is set in the worker's environment so a helper the worker itself forks
cannot deadlock either; the worker's encoder parallelises tokenization with its own threads instead
(``dagster_gpu.embedding.encoder``).
"""

from __future__ import annotations

from typing import Any, Mapping

from dagster._grpc.types import ExecuteStepArgs

#: The worker interpreter per backend when neither the backend's section nor the executor names one. On
#: Kubernetes the image's ``python`` from PATH: the code location's interpreter path rarely exists in an
#: image, and dagster-k8s likewise starts steps from the image's PATH (dagster_k8s/executor.py
#: K8sStepHandler runs ``ExecuteStepArgs.get_command_args()``, whose entry point is the code location's
#: ``entry_point``, ``["dagster"]`` for a code server: dagster/_grpc/types.py ``_get_entry_point``).
#: Elsewhere None: the code location's own interpreter (``job_origin.executable_path``), which exists on
#: the same host or, for Slurm, on the cluster's shared filesystem.
DEFAULT_WORKER_PYTHON = {"kubernetes": "python"}


def worker_python_for(backend: str, executor_config: Mapping[str, Any]) -> str | None:
    """The worker interpreter for a step placed on ``backend``: the backend section's ``worker_python``
    (e.g. ``kubernetes: {worker_python: /opt/venv/bin/python}``), else the executor-wide ``worker_python``
    (kept as a fallback for every backend), else :data:`DEFAULT_WORKER_PYTHON` (None: the code location's
    interpreter, see :func:`worker_argv`)."""
    section = executor_config.get(backend)
    explicit = section.get("worker_python") if isinstance(section, Mapping) else None
    return explicit or executor_config.get("worker_python") or DEFAULT_WORKER_PYTHON.get(backend)


def worker_argv(args: ExecuteStepArgs, python: str | None = None) -> tuple[str, ...]:
    """``<python> -m dagster_gpu.worker.step_main api execute_step`` (:data:`WORKER_MODULE`: Dagster's ``dagster api
    execute_step`` behind a SIGTERM handler installed first); the step args travel in the environment, not argv.

    ``python`` defaults to the code location's interpreter (``job_origin.executable_path``), so the
    worker needs no ``dagster`` on PATH.
    """
    base = list(args.get_command_args(skip_serialized_namedtuple=True))
    # base = [<entry point...>, "api", "execute_step"]; replace the entry point.
    tail = base[base.index("api") :]
    exe = python or args.job_origin.executable_path
    return (exe, "-m", WORKER_MODULE, *tail)


#: The step worker's entry point (:mod:`dagster_gpu.worker.step_main`).
WORKER_MODULE = "dagster_gpu.worker.step_main"
#: The module a relayed step worker runs instead of ``dagster api execute_step`` (``events: relay``), behind the
#: same entry point.
RELAY_WORKER_MODULE = "dagster_gpu.worker.relay_step"


def relay_worker_argv(argv: tuple[str, ...]) -> tuple[str, ...]:
    """:func:`worker_argv`'s command with ``api execute_step`` replaced by :data:`RELAY_WORKER_MODULE` (same
    interpreter and entry point; the step args still travel in the environment)."""
    return (argv[0], "-m", WORKER_MODULE, RELAY_WORKER_MODULE)


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
