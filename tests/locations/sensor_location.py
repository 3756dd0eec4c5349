"""Code location for the corpus sensor's daemon tests: an embedding asset over $DAGSTER_GPU_SD_DIR/corpus, its
vector index (``AutomationCondition.eager()``, evaluated by ``index_automation_sensor``), the corpus sensor
(running by default, every $DAGSTER_GPU_SD_INTERVAL seconds; the freshness knob from $DAGSTER_GPU_SD_MAX_DELAY,
unset = off); runs of at most $DAGSTER_GPU_SD_PER_RUN partitions (default 10); workers from the local backend's fork server
when $DAGSTER_GPU_SD_FORKSERVER (its idle seconds) is set. The worker processes import this module again, so every setting comes from the environment."""

import os
from pathlib import Path

import dagster as dg

from dagster_gpu import CorpusSource, GpuRequest, TextFormat, embedding_asset, gpu_executor
from dagster_gpu.definitions.vector_index import index_automation_sensor, vector_index_asset
from dagster_gpu.definitions.sensors import asset_job, corpus_sensor

ROOT = Path(os.environ.get("DAGSTER_GPU_SD_DIR", "/nonexistent"))
INTERVAL = int(os.environ.get("DAGSTER_GPU_SD_INTERVAL", "5"))
MAX_DELAY = os.environ.get("DAGSTER_GPU_SD_MAX_DELAY")
PER_RUN = int(os.environ.get("DAGSTER_GPU_SD_PER_RUN", "10"))
FORKSERVER = os.environ.get("DAGSTER_GPU_SD_FORKSERVER")

corpus = CorpusSource(url=str(ROOT / "corpus"), text_format=TextFormat(format="text", record_separator_line="%"))
sd_embeddings = embedding_asset(name="sd_embeddings", corpus=corpus, output_url=str(ROOT / "out"), device="cpu",
                                batch_size=32, gpu=GpuRequest(count=1), max_partitions_per_run=PER_RUN)
sd_index = vector_index_asset(sd_embeddings, uri=str(ROOT / "lance"), ann_min_rows=10**9)
job = asset_job(sd_embeddings)
sensor = corpus_sensor(sd_embeddings, corpus, job=job, minimum_interval_seconds=INTERVAL,
                       default_status=dg.DefaultSensorStatus.RUNNING,
                       max_delay_seconds=float(MAX_DELAY) if MAX_DELAY else None)
defs = dg.Definitions(
    assets=[sd_embeddings, sd_index], jobs=[job],
    sensors=[sensor, index_automation_sensor(sd_index, minimum_interval_seconds=INTERVAL)],
    executor=gpu_executor.configured({"sleep_seconds": 0.2, "retries": {"disabled": {}},
                                      **({"local": {"forkserver_idle_seconds": float(FORKSERVER)}} if FORKSERVER else {})}),
)
