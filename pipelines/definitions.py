"""The demo code location: embeddings of the Debian ``fortunes`` corpus, one partition per file.

Environment:
    DAGSTER_GPU_CORPUS_URL   corpus directory or s3:// URL   (default: <repo>/.demo/corpus)
    DAGSTER_GPU_OUTPUT_URL   where the parquet outputs go     (default: <repo>/.demo/embeddings)
    DAGSTER_GPU_DEVICE       auto | cpu | cuda                 (default: auto)
    DAGSTER_GPU_DEMO_PER_RUN partitions per run                (default: 50)
    DAGSTER_GPU_INDEX_URI    the LanceDB database of fortune_embeddings_index (default: <repo>/.demo/lance)

Assets, upstream first: ``fortune_embeddings_corpus`` (the corpus files, external: one partition per file, its
data version the file's source version, observed by the corpus sensor and by ``python -m pipelines.demo``),
``fortune_embeddings`` (one parquet output per partition) and ``fortune_embeddings_index`` (LanceDB). The corpus
sensor requests runs of new and changed files; a partition whose file or embedding configuration changed shows
as "Unsynced" in the UI, and ``dagster-gpu stale -m pipelines.definitions -a fortune_embeddings`` lists it.
The index follows in its own runs (``fortune_embeddings_index_job``, or a backfill over both assets): the
embedding step yields materializations, not an Output, so the two do not share one run.

Every job here runs through ``gpu_executor`` (local backend unless the run config says otherwise).
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from dagster_gpu import (ComputeSpec, CorpusSource, EmbeddingSpec, GpuRequest, OutputSpec, TextFormat, asset_job,
                         backfill_missing_schedule, corpus_sensor, corpus_source, embedding_asset, gpu_executor,
                         index_automation_sensor, vector_index_asset)

REPO = Path(__file__).resolve().parents[1]
CORPUS_URL = os.environ.get("DAGSTER_GPU_CORPUS_URL", str(REPO / ".demo" / "corpus"))
OUTPUT_URL = os.environ.get("DAGSTER_GPU_OUTPUT_URL", str(REPO / ".demo" / "embeddings"))

fortune_corpus = CorpusSource(url=CORPUS_URL, text_format=TextFormat(format="text", record_separator_line="%"))

# the corpus as an external asset upstream of the embeddings, partition by partition (source versions)
fortune_corpus_asset, fortune_embeddings = corpus_source(embedding_asset(
    "fortune_embeddings",
    corpus=fortune_corpus,
    output=OutputSpec(url=OUTPUT_URL),
    spec=EmbeddingSpec(model="all-MiniLM-L6-v2", batch_size=64),
    compute=ComputeSpec(device=os.environ.get("DAGSTER_GPU_DEVICE", "auto"),
                        gpu=GpuRequest(count=1, memory_gib=2, mig_ok=True, shared_ok=True),
                        max_partitions_per_run=int(os.environ.get("DAGSTER_GPU_DEMO_PER_RUN", "50"))),
    group_name="embeddings",
), fortune_corpus)

# the rows of each embedded partition in a LanceDB table (`dagster-gpu search -m pipelines.definitions -a fortune_embeddings "..."`);
# it follows the embeddings by itself (AutomationCondition.eager(), evaluated by index_automation_sensor)
fortune_index = vector_index_asset(fortune_embeddings, uri=os.environ.get("DAGSTER_GPU_INDEX_URI", str(REPO / ".demo" / "lance")),
                                   group_name="embeddings")

fortune_job = asset_job(fortune_embeddings)
fortune_index_job = asset_job(fortune_index)

defs = dg.Definitions(
    assets=[fortune_corpus_asset, fortune_embeddings, fortune_index],
    jobs=[fortune_job, fortune_index_job],
    sensors=[corpus_sensor(fortune_embeddings, fortune_corpus, job=fortune_job, minimum_interval_seconds=30,
                           # the freshness knob: hold new files up to this many seconds for a useful unit (unset: at once)
                           max_delay_seconds=float(os.environ["DAGSTER_GPU_MAX_DELAY_S"]) if os.environ.get("DAGSTER_GPU_MAX_DELAY_S") else None),
             index_automation_sensor(fortune_index)],
    schedules=[backfill_missing_schedule(fortune_embeddings, job=fortune_job)],
    executor=gpu_executor,
)
