"""The embedding asset in ranged runs on the Slurm or Kubernetes backend (end-to-end tests and bench/).

Settings come from the environment, so every process (test, daemon, run workers, array tasks, pods)
agrees: ``RANGED_TEST_CORPUS`` / ``RANGED_TEST_OUTPUT`` (directories), ``RANGED_TEST_BACKEND`` (``slurm``
or ``kubernetes``), ``RANGED_TEST_PER_RUN`` (max_partitions_per_run), ``RANGED_TEST_RETRIES`` (the asset's
RetryPolicy max_retries; 0 = none). The Slurm and Kubernetes executor settings are those of
``slurm_pipeline`` / ``k8s_pipeline``, with retries enabled.
"""

from __future__ import annotations

import os

import dagster as dg

from dagster_gpu import CorpusSource, GpuRequest, TextFormat, asset_job, embedding_asset
from dagster_gpu.executor.executor import gpu_executor

BACKEND = os.environ.get("RANGED_TEST_BACKEND", "slurm")
RETRIES = int(os.environ.get("RANGED_TEST_RETRIES", "1"))

corpus = CorpusSource(url=os.environ.get("RANGED_TEST_CORPUS", "/nonexistent"),
                      text_format=TextFormat(format="text", record_separator_line="%"))
ranged_embeddings = embedding_asset(
    name="ranged_embeddings",
    corpus=corpus,
    output_url=os.environ.get("RANGED_TEST_OUTPUT", "/nonexistent"),
    device="cpu",
    batch_size=64,
    gpu=GpuRequest(count=1, mig_ok=BACKEND == "kubernetes"),
    max_partitions_per_run=int(os.environ.get("RANGED_TEST_PER_RUN", "10")),
    retry_policy=dg.RetryPolicy(max_retries=RETRIES) if RETRIES else None,
)
ranged_job = asset_job(ranged_embeddings)


def executor_config() -> dict:
    if BACKEND == "kubernetes":
        from tests import k8s_pipeline as p
    else:
        from tests import slurm_pipeline as p
    cfg = p.executor_config()
    cfg["retries"] = {"enabled": {}}
    if BACKEND == "kubernetes":  # pods get only the environment the container context names
        passed = [k for k in os.environ if k.startswith("RANGED_TEST_") or k == "HF_HUB_OFFLINE"]
        cfg["kubernetes"]["container_context"]["env_vars"] += [f"{k}={os.environ[k]}" for k in passed]
    return cfg


defs = dg.Definitions(assets=[ranged_embeddings], jobs=[ranged_job], executor=gpu_executor.configured(executor_config()))
