"""dagster-gpu: run GPU embedding steps where they are cheapest, and say what they cost.

Public API:
    gpu_executor            the step-delegating executor (local | slurm | kubernetes | auto)
    embedding_asset         factory of a partitioned embedding asset (one partition per corpus file)
    corpus_sensor, backfill_missing_schedule, asset_job
    CorpusSource, TextFormat, GpuRequest, RateCard, Placement
"""

from dagster_gpu.assets import embedding_asset
from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.corpus.listing import CorpusFile, CorpusSource
from dagster_gpu.corpus.readers import TextFormat
from dagster_gpu.executor.executor import gpu_executor
from dagster_gpu.policy.placement import Alternative, Placement
from dagster_gpu.request import GpuRequest
from dagster_gpu.sensors import asset_job, backfill_missing_schedule, corpus_sensor

__all__ = [
    "Alternative",
    "CorpusFile",
    "CorpusSource",
    "GpuRequest",
    "Placement",
    "RateCard",
    "TextFormat",
    "asset_job",
    "backfill_missing_schedule",
    "corpus_sensor",
    "embedding_asset",
    "gpu_executor",
]
