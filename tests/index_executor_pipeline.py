"""A code location for the index-through-gpu_executor test: the corpus source asset, the embedding asset and
its vector index under $DAGSTER_GPU_IXE_DIR, a job for each (the corpus sensor requests the embeddings' job).

The two assets cannot share one run: the embedding step reports its partitions as AssetMaterialization events
and yields no ``Output`` (``output_required=False``), so Dagster skips a downstream step of the same run
("skipped dependencies: ['ixe_embeddings.result']"). The index follows in its own run, as an asset backfill over
both assets runs it once the embeddings' partitions are materialized.

The worker processes gpu_executor starts import this module again (``dg.reconstructable``), so every
setting comes from the environment."""

import os
from pathlib import Path

import dagster as dg

from dagster_gpu import CorpusSource, GpuRequest, TextFormat, corpus_source, embedding_asset, gpu_executor
from dagster_gpu.definitions.vector_index import vector_index_asset
from dagster_gpu.definitions.sensors import corpus_sensor

ROOT = Path(os.environ.get("DAGSTER_GPU_IXE_DIR", "/nonexistent"))
corpus = CorpusSource(url=str(ROOT / "corpus"), text_format=TextFormat(format="text", record_separator_line="%"))
corpus_spec, ixe_embeddings = corpus_source(
    embedding_asset(name="ixe_embeddings", corpus=corpus, output_url=str(ROOT / "out"), device="cpu", batch_size=32,
                    gpu=GpuRequest(count=1), max_partitions_per_run=4),
    corpus)
ixe_index = vector_index_asset(ixe_embeddings, uri=str(ROOT / "lance"), ann_min_rows=10**9)
embeddings_job = dg.define_asset_job("ixe_embeddings_job", selection=[ixe_embeddings])
index_job = dg.define_asset_job("ixe_index_job", selection=[ixe_index])
ixe_sensor = corpus_sensor(ixe_embeddings, corpus, job=embeddings_job)
defs = dg.Definitions(assets=[corpus_spec, ixe_embeddings, ixe_index], jobs=[embeddings_job, index_job],
                      sensors=[ixe_sensor], executor=gpu_executor)


def get_embeddings_job():
    """Reconstructable targets (importable as tests.index_executor_pipeline from the repo root)."""
    return defs.resolve_job_def("ixe_embeddings_job")


def get_index_job():
    return defs.resolve_job_def("ixe_index_job")
