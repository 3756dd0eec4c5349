"""dagster-gpu: run GPU embedding steps where they are cheapest, and say what they cost.

Public API (imported lazily, so worker-side helpers such as ``dagster_gpu.worker.supervise`` and the
embedding pipeline import without Dagster):
    gpu_executor            the step-delegating executor (local | slurm | kubernetes | auto)
    embedding_asset         factory of a partitioned embedding asset (one partition per corpus file)
    corpus_sensor, backfill_missing_schedule, asset_job
    unit_bills_sensor       bills the work units no run worker billed (e.g. slurmdbd was down as runs ended)
    CorpusSource, CorpusFile, TextFormat, GpuRequest, RateCard, Placement, Alternative
"""

from importlib import import_module

_EXPORTS = {
    "Alternative": "dagster_gpu.policy.placement",
    "CorpusFile": "dagster_gpu.corpus.listing",
    "CorpusSource": "dagster_gpu.corpus.listing",
    "GpuRequest": "dagster_gpu.request",
    "Placement": "dagster_gpu.policy.placement",
    "RateCard": "dagster_gpu.billing.ratecard",
    "TextFormat": "dagster_gpu.corpus.readers",
    "asset_job": "dagster_gpu.sensors",
    "backfill_missing_schedule": "dagster_gpu.sensors",
    "corpus_sensor": "dagster_gpu.sensors",
    "embedding_asset": "dagster_gpu.assets",
    "gpu_executor": "dagster_gpu.executor.executor",
    "unit_bills_sensor": "dagster_gpu.bills_sensor",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dagster_gpu' has no attribute {name!r}")
