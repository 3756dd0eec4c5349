"""dagster-gpu: run GPU embedding steps where they are cheapest, and say what they cost.

Public API:
    gpu_executor            the step-delegating executor (local | slurm | kubernetes | auto)
    embedding_asset         factory of a partitioned embedding asset (one partition per corpus file)
    vector_index_asset      a LanceDB index that follows an embedding asset partition by partition ([index] extra)
    index_automation_sensor evaluates the index's AutomationCondition (it follows its embeddings by itself)
    corpus_sensor, backfill_missing_schedule, asset_job
    corpus_source           the corpus as an external asset the embeddings depend on (per-partition source versions)
    unit_bills_sensor       bills the work units no run worker billed (e.g. slurmdbd was down as runs ended)
    EmbeddingSpec, OutputSpec, ComputeSpec   embedding_asset's grouped options (vectors, output, compute)
    CorpusSource, CorpusFile, TextFormat, TokenChunks, GpuRequest, RateCard, Placement, Alternative
    __version__             the installed distribution's version (``importlib.metadata``)

Everything a code location writes is here and in ``__all__``. The paths earlier versions documented
(:data:`_MOVED_MODULES`, e.g. ``dagster_gpu.index.asset``) still import for one minor release: their names
resolve to the same objects with a ``DeprecationWarning`` naming the new path.

The names are imported on first use (PEP 562 ``__getattr__``), so that worker-side modules such as
``dagster_gpu.local.supervise`` and the embedding pipeline import without Dagster; the ``TYPE_CHECKING``
block below gives type checkers and IDEs the same names with their types. ``__version__`` raises
``importlib.metadata.PackageNotFoundError`` when the package runs from sources that were never installed.
"""

from __future__ import annotations

import sys
import warnings
from importlib import import_module
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dagster_gpu.billing.ratecard import RateCard as RateCard
    from dagster_gpu.core.request import GpuRequest as GpuRequest
    from dagster_gpu.corpus.listing import CorpusFile as CorpusFile
    from dagster_gpu.corpus.listing import CorpusSource as CorpusSource
    from dagster_gpu.corpus.readers import TextFormat as TextFormat
    from dagster_gpu.definitions.asset_options import ComputeSpec as ComputeSpec
    from dagster_gpu.definitions.asset_options import OutputSpec as OutputSpec
    from dagster_gpu.definitions.assets import embedding_asset as embedding_asset
    from dagster_gpu.definitions.bills_sensor import unit_bills_sensor as unit_bills_sensor
    from dagster_gpu.definitions.sensors import (
        asset_job as asset_job,
    )
    from dagster_gpu.definitions.sensors import (
        backfill_missing_schedule as backfill_missing_schedule,
    )
    from dagster_gpu.definitions.sensors import (
        corpus_sensor as corpus_sensor,
    )
    from dagster_gpu.definitions.vector_index import (
        index_automation_sensor as index_automation_sensor,
    )
    from dagster_gpu.definitions.vector_index import (
        vector_index_asset as vector_index_asset,
    )
    from dagster_gpu.embedding.chunking import TokenChunks as TokenChunks
    from dagster_gpu.embedding.spec import EmbeddingSpec as EmbeddingSpec
    from dagster_gpu.executor.executor import gpu_executor as gpu_executor
    from dagster_gpu.partitions.source_versions import corpus_source as corpus_source
    from dagster_gpu.policy.placement import Alternative as Alternative
    from dagster_gpu.policy.placement import Placement as Placement

    __version__: str

#: public name -> the module that defines it (the same pairs as the TYPE_CHECKING block above;
#: tests/test_wheel.py checks that they agree and that each resolves).
_EXPORTS = {
    "Alternative": "dagster_gpu.policy.placement",
    "ComputeSpec": "dagster_gpu.definitions.asset_options",
    "CorpusFile": "dagster_gpu.corpus.listing",
    "CorpusSource": "dagster_gpu.corpus.listing",
    "EmbeddingSpec": "dagster_gpu.embedding.spec",
    "GpuRequest": "dagster_gpu.core.request",
    "OutputSpec": "dagster_gpu.definitions.asset_options",
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
    "index_automation_sensor": "dagster_gpu.definitions.vector_index",
    "unit_bills_sensor": "dagster_gpu.definitions.bills_sensor",
    "vector_index_asset": "dagster_gpu.definitions.vector_index",
}

#: Deprecated module path (documented or imported by code locations of an earlier release) -> the module its names
#: live in now. Removed in 0.3.0.
_MOVED_MODULES = {
    "dagster_gpu.index.asset": "dagster_gpu.definitions.vector_index",
    "dagster_gpu.assets": "dagster_gpu.definitions.assets",
    "dagster_gpu.sensors": "dagster_gpu.definitions.sensors",
    "dagster_gpu.bills_sensor": "dagster_gpu.definitions.bills_sensor",
    "dagster_gpu.source_versions": "dagster_gpu.partitions.source_versions",
    "dagster_gpu.request": "dagster_gpu.core.request",
    "dagster_gpu.keys": "dagster_gpu.core.partition_keys",
    "dagster_gpu.outputs": "dagster_gpu.embedding.outputs",
    "dagster_gpu.instance.settings": "dagster_gpu.settings.schema",
    "dagster_gpu.instance.source_versions": "dagster_gpu.partitions.source_versions",
}
_REMOVED_IN = "0.3.0"

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


def _new_path(old: str, name: str) -> str:
    """Where ``name`` of deprecated module ``old`` is imported from now: the package root for a public name."""
    if _EXPORTS.get(name) == _MOVED_MODULES[old]:
        return f"from dagster_gpu import {name}"
    return f"from {_MOVED_MODULES[old]} import {name}"


class _MovedModules(MetaPathFinder, Loader):
    """Imports each deprecated path of :data:`_MOVED_MODULES` as a module whose attributes are the new module's
    (the same objects), each access warning with ``DeprecationWarning`` that names the new path. Last on
    ``sys.meta_path``: a module file at the old path would win."""

    def find_spec(self, fullname, path=None, target=None):
        return ModuleSpec(fullname, self) if fullname in _MOVED_MODULES else None

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        old = module.__name__

        def __getattr__(name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            value = getattr(import_module(_MOVED_MODULES[old]), name)  # AttributeError as the new module's
            warnings.warn(f"{old} is deprecated and will be removed in dagster-gpu {_REMOVED_IN}: "
                          f"use `{_new_path(old, name)}`", DeprecationWarning, stacklevel=2)
            return value

        module.__getattr__ = __getattr__
        module.__dir__ = lambda: dir(import_module(_MOVED_MODULES[old]))


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | {"__version__"})
