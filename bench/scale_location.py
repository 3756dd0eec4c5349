"""The code location of bench/scale_e2e.py: the embedding asset over a corpus of many small JSON Lines files in
file groups, its corpus sensor, gpu_executor on the local backend (CPU).

Settings come from the environment, so every process (the bench, the daemon and its code server, the run
workers, the step workers, the webserver) agrees: ``SCALE_CORPUS`` / ``SCALE_OUTPUT`` (directories),
``SCALE_MODEL`` (a sentence-transformers directory: bench/scale_e2e.py builds a tiny one),
``SCALE_BUCKETS`` (``group_buckets``), ``SCALE_PER_RUN`` (``max_partitions_per_run``: 64 makes 1,024 buckets 16
runs) and ``SCALE_SENSOR_INTERVAL`` (the sensor's minimum interval, seconds; the sensor is stopped until the
bench starts it).

Record-level reuse is on (``ComputeSpec``'s default ``reuse=True``): a bucket embedded again takes the
previous output's vector of every record whose text is unchanged, so a catch-up embeds only the changed
records of the buckets it redoes.
"""

from __future__ import annotations

import os

import dagster as dg

from dagster_gpu import CorpusSource, GpuRequest, asset_job, corpus_sensor, embedding_asset, gpu_executor
from dagster_gpu.definitions.asset_options import ComputeSpec, OutputSpec
from dagster_gpu.embedding.spec import EmbeddingSpec

corpus = CorpusSource(url=os.environ.get("SCALE_CORPUS", "/nonexistent"), recursive=True,
                      group_buckets=int(os.environ.get("SCALE_BUCKETS", "1024")))
scale_embeddings = embedding_asset(
    "scale_embeddings",
    corpus=corpus,
    output=OutputSpec(url=os.environ.get("SCALE_OUTPUT", "/nonexistent")),
    spec=EmbeddingSpec(model=os.environ.get("SCALE_MODEL", "all-MiniLM-L6-v2"), batch_size=256),
    compute=ComputeSpec(device="cpu", gpu=GpuRequest(count=1),
                        max_partitions_per_run=int(os.environ.get("SCALE_PER_RUN", "64")), reuse=True),
)
scale_job = asset_job(scale_embeddings)
scale_sensor = corpus_sensor(scale_embeddings, corpus, job=scale_job,
                             minimum_interval_seconds=int(os.environ.get("SCALE_SENSOR_INTERVAL", "30")))

defs = dg.Definitions(
    assets=[scale_embeddings], jobs=[scale_job], sensors=[scale_sensor],
    executor=gpu_executor.configured({"backend": "local", "sleep_seconds": 0.5, "retries": {"disabled": {}}}),
)
