"""dagster-gpu: run GPU embedding steps where they are cheapest, and say what they cost.

Public API:
    gpu_executor            the step-delegating executor (local | slurm | kubernetes | auto)
    embedding_asset         factory of a partitioned embedding asset (one partition per corpus file)
    corpus_sensor, backfill_missing_schedule, asset_job
    corpus_source           the corpus as an external asset the embeddings depend on (per-partition source versions)
    unit_bills_sensor       bills the work units no run worker billed (e.g. slurmdbd was down as runs ended)
    CorpusSource, CorpusFile, TextFormat, TokenChunks, GpuRequest, RateCard, Placement, Alternative
    __version__             the installed distribution's version (``importlib.metadata``)

The names are imported on first use (PEP 562 ``__getattr__``), so that worker-side modules such as
``dagster_gpu.local.supervise`` and the embedding pipeline import without Dagster; the ``TYPE_CHECKING``
block below gives type checkers and IDEs the same names with their types. ``__version__`` raises
``importlib.metadata.PackageNotFoundError`` when the package runs from sources that were never installed.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dagster_gpu.definitions.assets import embedding_asset as embedding_asset
    from dagster_gpu.billing.ratecard import RateCard as RateCard
    from dagster_gpu.definitions.bills_sensor import unit_bills_sensor as unit_bills_sensor
    from dagster_gpu.corpus.listing import CorpusFile as CorpusFile, CorpusSource as CorpusSource
    from dagster_gpu.corpus.readers import TextFormat as TextFormat
    from dagster_gpu.embedding.chunking import TokenChunks as TokenChunks
    from dagster_gpu.executor.executor import gpu_executor as gpu_executor
    from dagster_gpu.policy.placement import Alternative as Alternative, Placement as Placement
    from dagster_gpu.core.request import GpuRequest as GpuRequest
    from dagster_gpu.definitions.sensors import (
        asset_job as asset_job,
        backfill_missing_schedule as backfill_missing_schedule,
        corpus_sensor as corpus_sensor,
    )
    from dagster_gpu.partitions.source_versions import corpus_source as corpus_source

    __version__: str

#: public name -> the module that defines it (the same pairs as the TYPE_CHECKING block above;
#: tests/test_wheel.py checks that they agree and that each resolves).
_EXPORTS = {
    "Alternative": "dagster_gpu.policy.placement",
    "CorpusFile": "dagster_gpu.corpus.listing",
    "CorpusSource": "dagster_gpu.corpus.listing",
    "GpuRequest": "dagster_gpu.core.request",
    "Placement": "dagster_gpu.policy.placement",
    "RateCard": "dagster_gpu.billing.ratecard",
    "TextFormat": "dagster_gpu.corpus.readers",
    "TokenChunks": "dagster_gpu.embedding.chunking",
    "asset_job": "dagster_gpu.definitions.sensors",
    "backfill_missing_schedule": "dagster_gpu.definitions.sensors",
    "corpus_sensor": "dagster_gpu.definitions.sensors",
    "corpus_source": "dagster_gpu.partitions.source_versions",
    "embedding_asset": "dagster_gpu.definitions.assets",
    "gpu_executor": "dagster_gpu.executor.executor",
    "unit_bills_sensor": "dagster_gpu.definitions.bills_sensor",
}

__all__ = sorted(_EXPORTS)


if not TYPE_CHECKING:  # hidden from type checkers, so that they flag a name the package does not export

    def __getattr__(name: str) -> Any:
        if name in _EXPORTS:
            value = getattr(import_module(_EXPORTS[name]), name)
        elif name == "__version__":
            from importlib.metadata import version

            value = version("dagster-gpu")
        else:
            raise AttributeError(f"module 'dagster_gpu' has no attribute {name!r}")
        globals()[name] = value  # the next access is a plain attribute
        return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | {"__version__"})
