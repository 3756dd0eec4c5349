"""Two trivial partitioned assets on gpu_executor with ``backend: auto`` over both test clusters (the local
Slurm cluster and the Kubernetes control plane), for the cross-backend end-to-end test.

The backends' sections are those of tests/slurm_pipeline.py and tests/k8s_pipeline.py, so the same
environment variables configure them; the local backend is off. Each asset sleeps ``test/sleep`` seconds
and returns its partition key, the backend the worker ran on (from the step context gpu_executor gave
it), the placement the cost policy recorded, and the backend's own metadata.

Assets (the same partitions):
  auto_whole   one whole GPU with >= 79 GiB (an A100-80GB on either cluster)
  auto_mig     one GPU, a MIG slice acceptable (``mig-ok``)
"""

from __future__ import annotations

import os
import time

import dagster as dg

from dagster_gpu.executor.executor import gpu_executor
from tests import k8s_pipeline, slurm_pipeline  # the code location's working directory is the repository

KEYS = [f"a{i:03d}" for i in range(20)]
partitions = dg.StaticPartitionsDefinition(KEYS)


def executor_config() -> dict:
    slurm, k8s = slurm_pipeline.executor_config(), k8s_pipeline.executor_config()
    return {
        "backend": "auto",
        "local": {"enabled": False},
        "slurm": slurm["slurm"],
        "kubernetes": k8s["kubernetes"],
        "retries": {"disabled": {}},
        "sleep_seconds": 0.5,
        "check_step_health_interval_seconds": 2,
        **{k: slurm[k] for k in ("worker_python",) if k in slurm},  # the 24.11 test cluster's (chroot) interpreter
    }


def _body(context) -> dg.MaterializeResult:
    from dagster_gpu.worker.backend_env import backend_metadata
    from dagster_gpu.worker.context import StepContext

    time.sleep(float(context.run.tags.get("test/sleep", "0")))
    step = StepContext.from_env()
    md = backend_metadata(step.backend)
    md["test/partition_key"] = context.partition_key
    md["test/backend"] = step.backend
    md["test/placement"] = dg.MetadataValue.json(step.placement.to_json())
    md["test/nvidia_visible_devices"] = os.environ.get("NVIDIA_VISIBLE_DEVICES", "")
    md["test/cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return dg.MaterializeResult(metadata=md)


@dg.asset(partitions_def=partitions, op_tags={"dagster-gpu/gpu-count": "1", "dagster-gpu/gpu-memory-gib": "79"})
def auto_whole(context):
    return _body(context)


@dg.asset(partitions_def=partitions, op_tags={"dagster-gpu/gpu-count": "1", "dagster-gpu/mig-ok": "true"})
def auto_mig(context):
    return _body(context)


defs = dg.Definitions(
    assets=[auto_whole, auto_mig],
    jobs=[dg.define_asset_job(f"{a.key.path[-1]}_job", selection=[a]) for a in (auto_whole, auto_mig)],
    executor=gpu_executor.configured(executor_config()),
)
