"""Step workers start in a fresh interpreter (never a fork holding CUDA or tokenizer threads), with
TOKENIZERS_PARALLELISM set; checked on the worker command, on a real local launch, and on the source. The one
fork is the local backend's fork server's, from a process that holds neither (tests/test_forkserver.py)."""

from __future__ import annotations

import ast
import json
import os
import sys
import time
from pathlib import Path

import dagster as dg
from dagster._core.definitions.reconstruct import reconstructable
from dagster._grpc.types import ExecuteStepArgs

from dagster_gpu.contracts import StepLaunch, WorkerStatus
from dagster_gpu.local.backend import LocalBackend
from dagster_gpu.executor.command import WORKER_FIXED_ENV, worker_argv, worker_env
from dagster_gpu.policy.placement import Placement
from dagster_gpu.core.request import GpuRequest

PACKAGE = Path(__file__).resolve().parents[1] / "dagster_gpu"


@dg.op
def noop():
    pass


@dg.job
def noop_job():
    noop()


def step_args() -> ExecuteStepArgs:
    return ExecuteStepArgs(job_origin=reconstructable(noop_job).get_python_origin(), run_id="run-1",
                           step_keys_to_execute=["noop"], instance_ref=None)


def test_worker_command_is_a_new_interpreter_with_tokenizers_parallelism_off():
    argv = worker_argv(step_args(), python="/opt/venv/bin/python")
    assert argv == ("/opt/venv/bin/python", "-m", "dagster_gpu.worker.step_main", "api", "execute_step")
    env = worker_env(step_args(), "noop_job", "noop")
    assert env["TOKENIZERS_PARALLELISM"] == "false" == WORKER_FIXED_ENV["TOKENIZERS_PARALLELISM"]
    assert {"DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS", "DAGSTER_RUN_JOB_NAME", "DAGSTER_RUN_STEP_KEY"} <= set(env)


CHILD = """
import json, os, sys
print(json.dumps({"heavy": sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tokenizers', 'transformers')),
                  "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM"), "pid": os.getpid()}))
"""


def test_a_local_worker_does_not_inherit_torch_or_tokenizer_state(tmp_path):
    # This process holds what a fork would leak: torch's thread pools and a Rust tokenizer pool that ran.
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        import torch
        from tokenizers import Tokenizer, models, pre_tokenizers

        tok = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        assert [e.ids for e in tok.encode_batch(["a b"] * 64)][0] == [0, 1]
        torch.ones(64, 64) @ torch.ones(64, 64)
        backend = LocalBackend(tmp_path)
        launch = StepLaunch(run_id="run-1", step_key="noop", partition_keys=(), attempt=0,
                            argv=(sys.executable, "-c", CHILD), env=worker_env(step_args(), "noop_job", "noop"),
                            request=GpuRequest(), placement=Placement(backend="local", reason="test"))
        handle = backend.launch(launch)
        deadline = time.monotonic() + 120  # waiting for the process, not a speed assertion
        while backend.state(handle).status == WorkerStatus.RUNNING and time.monotonic() < deadline:
            time.sleep(0.1)
        assert backend.state(handle).status == WorkerStatus.SUCCEEDED
    finally:
        os.environ.pop("TOKENIZERS_PARALLELISM", None)
    report = json.loads(Path(handle["log_file"]).read_text().strip().splitlines()[-1])
    assert report["heavy"] == []  # a fork of this process would list torch and tokenizers
    assert report["tokenizers_parallelism"] == "false"  # the worker env wins over the parent's "true"
    assert report["pid"] != handle["pid"]  # the worker runs under the supervisor, also a new interpreter


#: The fork server forks only from a process that ran no torch operator and holds one thread (it checks).
FORKS_ALLOWED = {PACKAGE / "local" / "forkserver.py"}


def test_no_backend_or_worker_code_forks_without_exec():
    """``os.fork``/``multiprocessing`` in the executor or worker would hand CUDA/tokenizer state to a child."""
    offenders = []
    for path in sorted(set(PACKAGE.rglob("*.py")) - FORKS_ALLOWED):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                if any(n.split(".")[0] == "multiprocessing" for n in names):
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} imports multiprocessing")
            elif isinstance(node, ast.Attribute) and node.attr in ("fork", "forkpty") and getattr(node.value, "id", None) == "os":
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} calls os.{node.attr}")
    assert offenders == []


def test_worker_python_is_per_backend_the_image_path_on_kubernetes_the_code_locations_elsewhere():
    from dagster_gpu.executor.command import worker_python_for

    args = step_args()
    # nothing configured: kubernetes runs the image's python from PATH, local/slurm the code location's
    assert worker_argv(args, worker_python_for("kubernetes", {}))[0] == "python"
    for backend in ("local", "slurm"):
        assert worker_argv(args, worker_python_for(backend, {}))[0] == args.job_origin.executable_path == sys.executable
    # the executor-wide worker_python is the fallback for every backend
    wide = {"worker_python": "/shared/venv/bin/python"}
    assert {b: worker_python_for(b, wide) for b in ("kubernetes", "local", "slurm")} == dict.fromkeys(
        ("kubernetes", "local", "slurm"), "/shared/venv/bin/python")
    # a backend's own setting beats it
    both = {**wide, "kubernetes": {"worker_python": "/opt/venv/bin/python"}, "slurm": {"partition": "gpu"}}
    assert (worker_python_for("kubernetes", both), worker_python_for("slurm", both)) == (
        "/opt/venv/bin/python", "/shared/venv/bin/python")


def test_the_kubernetes_section_accepts_worker_python():
    from dagster._config import process_config

    from dagster_gpu.k8s.settings import KubernetesSettings, config_field

    r = process_config(config_field().config_type, {"worker_python": "/opt/venv/bin/python"})
    assert r.success, r.errors
    assert KubernetesSettings.from_section(r.value).worker_python == "/opt/venv/bin/python"
    assert KubernetesSettings.from_section({}).worker_python is None
