"""The ``slurm:`` section's own ``worker_python`` (a venv the compute nodes see) beats the executor-wide one,
through gpu_executor's real config schema, as ``kubernetes.worker_python`` does for pods."""

from __future__ import annotations

import dagster as dg
from dagster._config import process_config

from dagster_gpu.slurm.backend import SlurmSettings
from dagster_gpu.executor.command import worker_argv, worker_python_for
from dagster_gpu.executor.executor import GPU_EXECUTOR_CONFIG
from tests.test_worker_command import step_args


def _processed(config):
    r = process_config(dg.Shape(GPU_EXECUTOR_CONFIG), config)
    assert r.success, r.errors
    return r.value


def test_slurm_worker_python_beats_the_executor_wide_one():
    cfg = _processed({"worker_python": "/opt/venv/bin/python",
                      "slurm": {"worker_python": "/shared/venvs/embed/bin/python", "slurm_partition": "gpu"}})
    assert SlurmSettings.from_section(cfg["slurm"]).worker_python == "/shared/venvs/embed/bin/python"
    assert worker_python_for("slurm", cfg) == "/shared/venvs/embed/bin/python"
    assert worker_argv(step_args(), worker_python_for("slurm", cfg))[:3] == ("/shared/venvs/embed/bin/python", "-m", "dagster_gpu.worker.step_main")
    # the other backends keep the executor-wide one; a slurm section without it falls back to it too
    assert worker_python_for("local", cfg) == "/opt/venv/bin/python"
    assert worker_python_for("slurm", _processed({"worker_python": "/opt/venv/bin/python", "slurm": {}})) == "/opt/venv/bin/python"
    assert SlurmSettings.from_section({}).worker_python is None
