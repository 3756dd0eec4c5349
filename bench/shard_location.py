"""Code location of bench/shard_speedup.py: one parquet corpus ($SHARD_BENCH_CORPUS) embedded by two assets through
gpu_executor's local backend, ``whole`` (the file is one partition) and ``sharded`` (``shard_bytes`` =
$SHARD_BENCH_SHARD_BYTES: the file is several partitions), each run one partition (one work unit)."""

import os

import dagster as dg

from dagster_gpu import CorpusSource, GpuRequest, asset_job, embedding_asset, gpu_executor
from dagster_gpu.definitions.asset_options import ComputeSpec
from dagster_gpu.embedding.spec import EmbeddingSpec

OUTPUT = os.environ["SHARD_BENCH_OUTPUT"]
SETTINGS = dict(output=OUTPUT, spec=EmbeddingSpec(batch_size=64, max_seq_length=64, include_text=True),
                compute=ComputeSpec(device="cpu", read_batch_rows=2048, gpu=GpuRequest(count=1),
                                    max_partitions_per_run=1, reuse=False))

whole_corpus = CorpusSource(url=os.environ["SHARD_BENCH_CORPUS"], pattern="*.parquet")
sharded_corpus = CorpusSource(url=os.environ["SHARD_BENCH_CORPUS"], pattern="*.parquet",
                              shard_bytes=int(os.environ["SHARD_BENCH_SHARD_BYTES"]),
                              shard_plan_url=os.path.join(OUTPUT, "_shard_plans"))
whole = embedding_asset("whole", corpus=whole_corpus, **SETTINGS)
sharded = embedding_asset("sharded", corpus=sharded_corpus, **SETTINGS)

defs = dg.Definitions(assets=[whole, sharded], jobs=[asset_job(whole), asset_job(sharded)], executor=gpu_executor)
