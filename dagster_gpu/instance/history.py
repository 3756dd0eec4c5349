"""Thin Dagster adapter: read earlier materializations of an asset into :class:`HistoryPoint` records.

The only I/O of the policy package. It reads, per materialization, ``embedding/rows``,
``embedding/texts_per_second``, ``gpu/product_name`` (``cpu`` when ``billing/device_type`` is ``cpu``),
``gpu/utilization_mean_percent`` and the corpus file size (the first of :data:`SIZE_KEYS` present). Records missing rows or texts/s are skipped.

A materialization that reused rows (``embedding/reused_rows`` > 0) teaches nothing: what reached the model is a
biased sample (the changed records, and the rows at the max sequence length that reuse always embeds again, the
slowest ones) behind the fixed work of reading and hashing the whole file, so its texts/s is not a full embed's
(a newcomer's plan grew by half after one mostly reused re-run). ``whatif`` plans full embeds; reuse only makes
a re-run cheaper than planned.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from dagster_gpu.billing.keys import DEVICE_TYPE, WALL_SECONDS
from dagster_gpu.instance.bills import unit_of
from dagster_gpu.instance.events import metadata_get
from dagster_gpu.policy.batching import UnitSample
from dagster_gpu.policy.runtime import HistoryPoint, RuntimeModel

ROWS_KEY = "embedding/rows"
TPS_KEY = "embedding/texts_per_second"
REUSED_KEY = "embedding/reused_rows"
PRODUCT_KEY = "gpu/product_name"
#: The rate card's device type the step was billed as: ``cpu`` for a step that embedded on the CPU (which
#: writes no ``gpu/product_name``).
DEVICE_TYPE_KEY = DEVICE_TYPE
UTIL_KEY = "gpu/utilization_mean_percent"
#: Materializations the runtime model learns from, and those the finished units are looked for in (newest first).
RUNTIME_HISTORY = 50
UNIT_HISTORY = 200
#: Metadata keys holding the partition's corpus file size in bytes, first match wins.
SIZE_KEYS = ("corpus/bytes", "embedding/input_bytes", "dagster_gpu/partition_bytes")


def point_from_metadata(md: Mapping[str, Any]) -> HistoryPoint | None:
    """One :class:`HistoryPoint` from a materialization's metadata (MetadataValue or plain values); None for one
    without rows or texts/s, or one that reused rows (see the module doc)."""
    rows, tps = metadata_get(md, ROWS_KEY), metadata_get(md, TPS_KEY)
    try:
        rows_i, tps_f = int(rows), float(tps)
    except (TypeError, ValueError):
        return None
    reused = metadata_get(md, REUSED_KEY)
    if isinstance(reused, (int, float)) and not isinstance(reused, bool) and reused > 0:
        return None
    size = next((metadata_get(md, k) for k in SIZE_KEYS if metadata_get(md, k) is not None), None)
    util = metadata_get(md, UTIL_KEY)
    product = metadata_get(md, PRODUCT_KEY)
    if not product and str(metadata_get(md, DEVICE_TYPE_KEY) or "").lower() == "cpu":
        product = "cpu"  # measured on the CPU: it teaches CPU throughput, never a GPU's
    return HistoryPoint(
        rows=rows_i,
        texts_per_second=tps_f,
        bytes=int(size) if isinstance(size, (int, float)) else None,
        product=str(product) if product else None,
        utilization_percent=float(util) if isinstance(util, (int, float)) else None,
    )


def points_from_metadata(mds: Iterable[Mapping[str, Any]]) -> list[HistoryPoint]:
    return [p for p in (point_from_metadata(md) for md in mds) if p is not None]


def recent_metadata(instance: Any, asset_key: Any, limit: int) -> list[Mapping[str, Any]]:
    """The metadata of the last ``limit`` materializations of ``asset_key`` (any partition), newest first:
    one ``instance.fetch_materializations(AssetRecordsFilter(asset_key=...), limit=...)`` (Dagster 1.13)."""
    from dagster import AssetKey, AssetRecordsFilter

    key = asset_key if isinstance(asset_key, AssetKey) else AssetKey.from_user_string(str(asset_key))
    result = instance.fetch_materializations(AssetRecordsFilter(asset_key=key), limit=limit, ascending=False)
    return [rec.asset_materialization.metadata for rec in result.records if rec.asset_materialization is not None]


def fetch_history(instance: Any, asset_key: Any, limit: int = RUNTIME_HISTORY) -> list[HistoryPoint]:
    """The last ``limit`` materializations of ``asset_key`` (any partition) as history points."""
    return points_from_metadata(recent_metadata(instance, asset_key, limit))


def runtime_model(instance: Any, asset_key: Any, limit: int = RUNTIME_HISTORY, cpu_slowdown: float = 20.0) -> RuntimeModel:
    """:class:`RuntimeModel` for ``asset_key`` from the instance (the fallback when there is no history)."""
    return RuntimeModel.from_history(fetch_history(instance, asset_key, limit), cpu_slowdown=cpu_slowdown)


def unit_samples(mds: Iterable[Mapping[str, Any]], *, cpu: bool) -> list[UnitSample]:
    """The finished work units among materializations' metadata ``mds`` that embedded on the CPU (``cpu``) or
    on a GPU (not ``cpu``), as :class:`UnitSample` records: those whose every partition
    (``dagster_gpu/unit_partitions``) is among them, none of which reused rows (a reused partition's seconds are
    not a full embed's, the module docstring), each unit named by its Slurm array task, pod or local unit."""

    units: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for md in mds:
        unit = unit_of(md)
        if unit is not None:
            units.setdefault(unit, []).append(md)
    out = []
    for group in units.values():
        try:
            n = int(metadata_get(group[0], "dagster_gpu/unit_partitions"))
            on_cpu = all(str(metadata_get(md, DEVICE_TYPE_KEY) or "").lower() == "cpu" for md in group)
            reused = any((metadata_get(md, REUSED_KEY) or 0) > 0 for md in group)
            billed = sum(float(metadata_get(md, WALL_SECONDS)) for md in group)
            useful = sum(float(metadata_get(md, "embedding/seconds")) for md in group)
            size = sum(int(next(metadata_get(md, k) for k in SIZE_KEYS if metadata_get(md, k) is not None)) for md in group)
        except (TypeError, ValueError, StopIteration):
            continue
        if len(group) == n and on_cpu == cpu and not reused:
            out.append(UnitSample(n, billed, useful, size))
    return out


def fetch_unit_samples(instance: Any, asset_key: Any, *, cpu: bool, limit: int = UNIT_HISTORY) -> list[UnitSample]:
    """:func:`unit_samples` of the last ``limit`` materializations of ``asset_key``."""
    return unit_samples(recent_metadata(instance, asset_key, limit), cpu=cpu)
