"""A retrieval-style code location: license texts (long documents) embedded in chunks by a prompted model,
their ids and titles carried into every row.

Build the corpus and the model first: ``python -m pipelines.make_licenses`` (see that module), then
``dagster dev -m pipelines.retrieval``. Environment:
    DAGSTER_GPU_RETRIEVAL_HOME   where make_licenses wrote corpus/ and model/   (default: <repo>/.retrieval)
    DAGSTER_GPU_DEVICE           auto | cpu | cuda                                (default: auto)
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from dagster_gpu import (ComputeSpec, CorpusSource, EmbeddingSpec, GpuRequest, OutputSpec, TextFormat, TokenChunks,
                         asset_job, corpus_sensor, embedding_asset, gpu_executor)

HOME = Path(os.environ.get("DAGSTER_GPU_RETRIEVAL_HOME", str(Path(__file__).resolve().parents[1] / ".retrieval")))

license_corpus = CorpusSource(url=str(HOME / "corpus"), pattern="*.jsonl", text_format=TextFormat(format="jsonl"))

license_chunks = embedding_asset(
    "license_chunks",
    corpus=license_corpus,
    output=OutputSpec(url=str(HOME / "embeddings")),
    spec=EmbeddingSpec(
        model=str(HOME / "model"),          # MiniLM with e5-style prompts; its default prompt is "passage: "
        prompt_name="document",             # the passage side (queries use the model's "query" prompt)
        chunking=TokenChunks(max_tokens=256, overlap=32, boundary="paragraph"),
        id_column="id",
        carry_columns=("title", "source"),
        include_text=True,
    ),
    compute=ComputeSpec(device=os.environ.get("DAGSTER_GPU_DEVICE", "auto"),
                        gpu=GpuRequest(count=1, memory_gib=2, mig_ok=True, shared_ok=True)),
    group_name="retrieval",
)

license_job = asset_job(license_chunks)

defs = dg.Definitions(
    assets=[license_chunks],
    jobs=[license_job],
    sensors=[corpus_sensor(license_chunks, license_corpus, job=license_job, minimum_interval_seconds=30)],
    executor=gpu_executor,
)
