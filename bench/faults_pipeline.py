"""The code location of bench/faults.py: the embedding asset in ranged runs with ``backend: auto`` over the
local Slurm cluster and the Kubernetes control plane, a RetryPolicy, and the missing-partitions schedule.

Settings come from the environment, so every process (the bench, the daemon, run workers, array tasks,
pods) agrees: ``FAULTS_CORPUS`` / ``FAULTS_OUTPUT`` (directories), ``FAULTS_PER_RUN``
(max_partitions_per_run), ``FAULTS_RETRIES`` (RetryPolicy max_retries), ``FAULTS_DEADLINE_S`` (the
step's ``dagster-gpu/deadline-seconds``; 0 = batch) and ``FAULTS_SLURM_TIME_LIMIT`` (sbatch ``--time``;
the array tasks of a real cluster have one).

Placement: each step asks for one whole GPU of >= 79 GiB (an A100-80GB on either cluster; no MIG slice)
with a tight deadline (bench/faults.py: 45 s). Slurm's GPU-hour is the cheaper (resources/ratecard.yaml) and
its launch the quicker, so the policy puts a step there while the slurm partition has a free GPU (within its
array throttle); when it has none, Slurm's queue estimate misses the deadline and, the deadline missed
everywhere or met only there, the earliest finish wins: a Kubernetes pod on a free A100. That spreads one
backfill over both clusters, which is what the fault benchmark needs.

The Slurm and Kubernetes sections are those of tests/slurm_pipeline.py and tests/k8s_pipeline.py (their
environment variables apply), with the executor's retries enabled and the local backend off.

Per-run faults: the executor is gpu_executor with one change, its step handler (:class:`FaultStepHandler`)
re-reads ``FAULTS_STATE`` (bench/fault_state.py) at every step launch and applies the overrides the injector
wrote there for that run (the image, the sharing strategy) to the Kubernetes section, so a fault can give one
run an image the registry does not have while every other run keeps the real one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import dagster as dg

from dagster_gpu import CorpusSource, GpuRequest, TextFormat, asset_job, backfill_missing_schedule, embedding_asset, unit_bills_sensor
from dagster_gpu.definitions.asset_options import ComputeSpec, OutputSpec
from dagster_gpu.embedding.spec import EmbeddingSpec
from dagster_gpu.executor.executor import gpu_executor_with
from dagster_gpu.executor.step_handler import GpuStepHandler
from tests import k8s_pipeline, slurm_pipeline  # the code location's working directory is the repository

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ (a python_file code location adds only its working directory)
from fault_state import merged_kubernetes, read_state  # noqa: E402

ENV_PREFIX = "FAULTS_"
RETRIES = int(os.environ.get("FAULTS_RETRIES", "2"))
DEADLINE_S = float(os.environ.get("FAULTS_DEADLINE_S", "0"))

corpus = CorpusSource(url=os.environ.get("FAULTS_CORPUS", "/nonexistent"),
                      text_format=TextFormat(format="text", record_separator_line="%"))
fault_embeddings = embedding_asset(
    "fault_embeddings",
    corpus=corpus,
    output=OutputSpec(url=os.environ.get("FAULTS_OUTPUT", "/nonexistent")),
    spec=EmbeddingSpec(batch_size=64),
    compute=ComputeSpec(device="cpu", gpu=GpuRequest(count=1, memory_gib=79, deadline_s=DEADLINE_S or None),
                        max_partitions_per_run=int(os.environ.get("FAULTS_PER_RUN", "10"))),
    retry_policy=dg.RetryPolicy(max_retries=RETRIES) if RETRIES else None,
)
fault_job = asset_job(fault_embeddings)
#: started by bench/faults.py only once the backfill has ended (while it runs, every partition the backfill
#: has not reached yet is "missing" too); every minute, as a deployment would run it more rarely
missing_schedule = backfill_missing_schedule(fault_embeddings, job=fault_job, cron_schedule="* * * * *",
                                             name="fault_embeddings_missing_schedule")


def executor_config() -> dict:
    slurm = slurm_pipeline.executor_config()["slurm"]
    if os.environ.get("FAULTS_SLURM_TIME_LIMIT"):
        slurm["time_limit"] = os.environ["FAULTS_SLURM_TIME_LIMIT"]
    k8s = k8s_pipeline.executor_config()["kubernetes"]
    passed = [k for k in os.environ if k.startswith(ENV_PREFIX) or k == "HF_HUB_OFFLINE"]  # pods get only these
    k8s["container_context"]["env_vars"] += [f"{k}={os.environ[k]}" for k in sorted(passed)]
    return {
        "backend": "auto",
        "local": {"enabled": False},
        "slurm": slurm,
        "kubernetes": k8s,
        "retries": {"enabled": {}},
        "sleep_seconds": 0.5,
        "check_step_health_interval_seconds": 2,
    }


class FaultStepHandler(GpuStepHandler):
    """GpuStepHandler whose ``kubernetes`` section gets the run's ``FAULTS_STATE`` overrides, re-read at each
    step launch (a handler serves one run: the Kubernetes backend is rebuilt when its settings change)."""

    def __init__(self, config, default_log_dir):
        super().__init__(config, default_log_dir)
        self._base_k8s = dict(config.get("kubernetes") or {})

    def launch_step(self, step_handler_context):
        run_id = step_handler_context.dagster_run.run_id
        k8s = merged_kubernetes(self._base_k8s, read_state(os.environ.get("FAULTS_STATE")), run_id)
        with self._lock:
            if k8s != self._config.get("kubernetes"):
                self._config = {**self._config, "kubernetes": k8s}
                self._backends.pop("kubernetes", None)
        yield from super().launch_step(step_handler_context)


#: gpu_executor (dagster_gpu.executor.executor) with :class:`FaultStepHandler`.
fault_gpu_executor = gpu_executor_with(FaultStepHandler)


defs = dg.Definitions(assets=[fault_embeddings], jobs=[fault_job], schedules=[missing_schedule],
                      sensors=[unit_bills_sensor(executor_config(), minimum_interval_seconds=30)],
                      executor=fault_gpu_executor.configured(executor_config()))
