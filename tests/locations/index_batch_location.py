"""Code location for the eager index's batching under the daemon: an embedding asset over an empty corpus
($DAGSTER_GPU_IB_DIR/corpus; its partitions are added and materialized by the test, no corpus sensor), its
vector index (eager, requests held for the cron schedule $DAGSTER_GPU_IB_CRON) and ``index_automation_sensor``
ticking every 5 seconds."""

import os
from pathlib import Path

import dagster as dg

from dagster_gpu import CorpusSource, TextFormat, embedding_asset, gpu_executor
from dagster_gpu.definitions.vector_index import index_automation_sensor, vector_index_asset

ROOT = Path(os.environ.get("DAGSTER_GPU_IB_DIR", "/nonexistent"))

corpus = CorpusSource(url=str(ROOT / "corpus"), text_format=TextFormat(format="text"))
ib_embeddings = embedding_asset(name="ib_embeddings", corpus=corpus, output_url=str(ROOT / "out"), device="cpu")
ib_index = vector_index_asset(ib_embeddings, uri=str(ROOT / "lance"),
                              batch_cron_schedule=os.environ.get("DAGSTER_GPU_IB_CRON", "*/2 * * * *"))
defs = dg.Definitions(assets=[ib_embeddings, ib_index],
                      sensors=[index_automation_sensor(ib_index, minimum_interval_seconds=5)],
                      executor=gpu_executor)
