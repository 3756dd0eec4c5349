"""The embedding asset factory: one dynamic partition per corpus file, one parquet file per partition."""



import posixpath
import time
from typing import Any, Mapping, Sequence

import dagster as dg
import psutil

from dagster_gpu.corpus.listing import CorpusNotFound, CorpusSource
from dagster_gpu.corpus.readers import CorpusReadError
from dagster_gpu.embedding.model import ModelNotFound, load_model
from dagster_gpu.embedding.pipeline import embed_partition
from dagster_gpu.request import TAG_ASSET_KEY, TAG_CORPUS_URL, GpuRequest
from dagster_gpu.telemetry.nvml import NvmlSampler
from dagster_gpu.worker.backend_env import backend_metadata
from dagster_gpu.worker.billing import measure
from dagster_gpu.worker.context import StepContext
from dagster_gpu.worker.k8s_claim import claim_metadata
from dagster_gpu.worker.metadata import build_metadata


def output_uri_for(output_url: str, asset_name: str, partition_key: str) -> str:
    """``<output_url>/<asset_name>/<partition_key>.parquet`` (the key is already path-safe)."""
    return posixpath.join(output_url.rstrip("/"), asset_name, f"{partition_key}.parquet")


def _torch_gpu(model_device: str) -> tuple[str | None, int]:
    if not model_device.startswith("cuda"):
        return None, 0
    import torch

    return torch.cuda.get_device_name(0), torch.cuda.device_count()


def embedding_asset(
    *,
    corpus: CorpusSource,
    output_url: str,
    name: str = "embeddings",
    partitions_def: dg.DynamicPartitionsDefinition | None = None,
    model: str = "all-MiniLM-L6-v2",
    batch_size: int = 64,
    max_seq_length: int | None = None,
    device: str = "auto",
    dtype: str | None = None,
    read_batch_rows: int = 4096,
    gpu: GpuRequest = GpuRequest(),
    telemetry_interval_s: float = 0.5,
    output_storage_options: Mapping[str, Any] | None = None,
    group_name: str | None = None,
    key_prefix: Sequence[str] | None = None,
    retry_policy: dg.RetryPolicy | None = None,
) -> dg.AssetsDefinition:
    """Build a partitioned asset that embeds one corpus file per partition.

    Args:
        corpus: where the files are and how to read them.
        output_url: directory or ``s3://bucket/prefix`` for the outputs (see :func:`output_uri_for`).
        name: asset name.
        partitions_def: defaults to ``DynamicPartitionsDefinition(name=f"{name}_files")``.
        model: a local sentence-transformers directory or ``all-MiniLM-L6-v2`` (packaged, offline).
        batch_size: texts per forward pass. max_seq_length: tokens (None = the model's own).
        device: ``auto`` (CUDA when present, else CPU), ``cpu``, ``cuda``, ``cuda:1``…
        dtype: ``float16`` or ``bfloat16`` to run the model in reduced precision on CUDA (opt-in; CPU always
            runs float32); recorded as ``embedding/dtype``.
        read_batch_rows: records per I/O batch (bounds worker memory).
        gpu: the GPU request, written to the op tags gpu_executor reads.
        telemetry_interval_s: NVML sampling period in seconds.

    The step fails with ``dagster.Failure`` (no retry) naming the partition and file on bad input,
    a missing file or model; other partitions are unaffected.
    """
    pdef = partitions_def or dg.DynamicPartitionsDefinition(name=f"{name}_files")

    @dg.asset(
        name=name,
        key_prefix=list(key_prefix) if key_prefix else None,
        partitions_def=pdef,
        op_tags={**gpu.to_tags(), TAG_CORPUS_URL: corpus.url, TAG_ASSET_KEY: "/".join([*(key_prefix or []), name])},
        kinds={"pytorch", "parquet"},
        group_name=group_name,
        retry_policy=retry_policy,
        description=f"Sentence embeddings ({model}) of each file of corpus {corpus.url}, one parquet file per partition under {output_url}.",
        metadata={"dagster_gpu/corpus_url": corpus.url, "dagster_gpu/output_url": output_url},
    )
    def _embed(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        started = time.time()
        step = StepContext.from_env()
        key = context.partition_key
        try:
            source = corpus.file_for_key(key)
            loaded = load_model(model, device=device, max_seq_length=max_seq_length, dtype=dtype)
        except (CorpusNotFound, ModelNotFound) as e:
            raise dg.Failure(description=f"partition {key!r}: {e}", allow_retries=False) from e
        out_uri = output_uri_for(output_url, name, key)
        context.log.info(
            f"partition {key!r}: embedding {source.uri} ({source.size_bytes} bytes) on {loaded.device} -> {out_uri}"
        )
        try:
            with NvmlSampler(telemetry_interval_s) as sampler:
                result = embed_partition(
                    source.uri,
                    out_uri,
                    loaded,
                    corpus.text_format,
                    batch_size=batch_size,
                    read_batch_rows=read_batch_rows,
                    storage_options=dict(corpus.storage_options),
                )
        except CorpusReadError as e:
            raise dg.Failure(
                description=f"partition {key!r}: {e}",
                metadata={"corpus/file": source.uri},
                allow_retries=False,
            ) from e
        telemetry = sampler.summary()
        product, count = telemetry.product_name, len(telemetry.device_uuids)
        if product is None:
            product, count = _torch_gpu(loaded.device)
        t0 = psutil.Process().create_time() if step.launched_by_executor else started
        billing = measure(step.rates, max(0.0, time.time() - t0), loaded.device, product, count, step.device_fraction)
        claim = claim_metadata() if step.backend == "kubernetes" else {}
        return dg.MaterializeResult(
            metadata=build_metadata(
                result=result,
                model_name=model,
                model_device=loaded.device,
                telemetry=telemetry,
                billing=billing,
                backend=step.backend,
                placement=step.placement,
                backend_metadata={**backend_metadata(step.backend), **claim, "corpus/file": source.uri},
            )
        )

    return _embed
