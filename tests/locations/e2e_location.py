"""Code location for end-to-end tests: the embedding asset over $DAGSTER_GPU_TEST_CORPUS, plus a sleepy asset;
the local backend's workers from its fork server when $DAGSTER_GPU_TEST_FORKSERVER (idle seconds) is set."""

import os
import time

import dagster as dg

from dagster_gpu import CorpusSource, GpuRequest, TextFormat, asset_job, embedding_asset, gpu_executor
from dagster_gpu.definitions.asset_options import ComputeSpec, OutputSpec
from dagster_gpu.embedding.spec import EmbeddingSpec

corpus = CorpusSource(url=os.environ["DAGSTER_GPU_TEST_CORPUS"], text_format=TextFormat(format="text", record_separator_line="%"))
embeddings = embedding_asset(
    "e2e_embeddings",
    corpus=corpus,
    output=OutputSpec(url=os.environ["DAGSTER_GPU_TEST_OUTPUT"]),
    spec=EmbeddingSpec(batch_size=32),
    compute=ComputeSpec(device="cpu", gpu=GpuRequest(count=1),
                        max_partitions_per_run=int(os.environ.get("DAGSTER_GPU_TEST_PER_RUN", "4"))),
)

sleepy_parts = dg.StaticPartitionsDefinition(["a", "b"])


@dg.asset(partitions_def=sleepy_parts, op_tags={"dagster-gpu/gpu-count": "0"})
def sleepy(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    """Sleeps $DAGSTER_GPU_TEST_SLEEP seconds (for health-check and terminate tests)."""
    context.log.info(f"sleepy pid {os.getpid()}")
    time.sleep(float(os.environ.get("DAGSTER_GPU_TEST_SLEEP", "60")))
    return dg.MaterializeResult(metadata={"pid": os.getpid()})


@dg.asset(partitions_def=sleepy_parts, op_tags={"dagster-gpu/gpu-count": "0"}, retry_policy=dg.RetryPolicy(max_retries=1))
def flaky(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    """First attempt of the partitions in $DAGSTER_GPU_TEST_SLOW_FIRST (comma-separated) sleeps
    $DAGSTER_GPU_TEST_SLEEP seconds (time to SIGKILL its worker); every other attempt returns at once."""
    slow = os.environ.get("DAGSTER_GPU_TEST_SLOW_FIRST", "").split(",")
    if context.retry_number == 0 and context.partition_key in slow:
        time.sleep(float(os.environ.get("DAGSTER_GPU_TEST_SLEEP", "60")))
    return dg.MaterializeResult(metadata={"pid": os.getpid(), "retry_number": context.retry_number})


defs = dg.Definitions(
    assets=[embeddings, sleepy, flaky],
    jobs=[asset_job(embeddings), dg.define_asset_job("sleepy_job", selection=[sleepy]), dg.define_asset_job("flaky_job", selection=[flaky])],
    executor=gpu_executor.configured({"local": {"forkserver_idle_seconds": float(os.environ["DAGSTER_GPU_TEST_FORKSERVER"])}})
    if os.environ.get("DAGSTER_GPU_TEST_FORKSERVER") else gpu_executor,
)


def sleepy_job():
    """Reconstructable target for tests (importable as tests.locations.e2e_location from the repo root)."""
    return defs.resolve_job_def("sleepy_job")


def flaky_job():
    """Reconstructable target: the flaky asset (RetryPolicy(max_retries=1))."""
    return defs.resolve_job_def("flaky_job")
