"""What one work unit of an embedding asset costs, from what was measured and learned
(:class:`dagster_gpu.policy.batching.UnitCost`), for the corpus sensor's hold decision and the bridging of
scattered partitions into one run.

- start-up and per-partition seconds: learned from the asset's finished work units on the same kind of device
  (CPU or GPU) (:func:`dagster_gpu.policy.batching.learned_overheads` over
  :func:`dagster_gpu.instance.history.unit_samples`: what the units really paid, fork server or fresh
  interpreter, this host's speed), else the packaged unit calibration ``dagster_gpu/data/unit_startup.json``
  (``unit_startup_s``, ``per_partition_s``: medians of fresh worker processes, measured by ``bench/unit_startup.py``);
- embedding seconds per byte: the runtime model learned from the asset's earlier materializations
  (:func:`dagster_gpu.instance.history.runtime_model`): ``rows_per_byte / texts_per_second``, the CPU rate for
  an asset that asks no GPU (``dagster-gpu/gpu-count`` 0) or whose history ran on CPU only; the model's stated
  fallback (2000 texts/s on a GPU, 46.3 measured on CPU, 200 bytes/row) without history.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import dagster as dg

from dagster_gpu.core.jsonfile import read_json
from dagster_gpu.core.request import GpuRequest
from dagster_gpu.instance.history import (
    RUNTIME_HISTORY,
    UNIT_HISTORY,
    points_from_metadata,
    recent_metadata,
    unit_samples,
)
from dagster_gpu.policy.batching import UnitCost, UnitSample, learned_overheads
from dagster_gpu.policy.runtime import RuntimeModel

CALIBRATION = Path(__file__).resolve().parents[1] / "data" / "unit_startup.json"


def calibration_seconds(path: Path = CALIBRATION) -> tuple[float, float]:
    """(``unit_startup_s``, ``per_partition_s``) of the unit calibration at ``path``. Raises ValueError naming
    the file when it is missing or a figure is not a finite number >= 0."""
    doc = read_json(path)
    out = []
    for k in ("unit_startup_s", "per_partition_s"):
        v = doc.get(k) if isinstance(doc, dict) else None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{path}: {k!r} must be a finite number >= 0 seconds, got {v!r}")
        out.append(float(v))
    return out[0], out[1]


def overheads(units: Sequence[UnitSample], seconds_per_byte: float, learned_from: str) -> tuple[float, float, str]:
    """(``startup_s``, ``per_partition_s``, where they come from): learned from ``units``
    (:func:`dagster_gpu.policy.batching.learned_overheads`; ``learned_from`` says whose), else the packaged
    calibration (:func:`calibration_seconds`)."""
    learned = learned_overheads(units, seconds_per_byte)
    if learned is None:
        return (*calibration_seconds(), CALIBRATION.name)
    return (*learned, f"median of the last {len(units)} unit(s) of {learned_from}")


def cost_source(startup_s: float, per_partition_s: float, where: str, model: RuntimeModel, cpu: bool) -> str:
    """The one line that says where a :class:`UnitCost`'s figures come from (the tick's and whatif's)."""
    return (f"start-up {startup_s:.1f} s, {per_partition_s:.2f} s a partition ({where}), "
            f"{model.describe(gpu=not cpu, cpu=cpu)}")


def unit_cost(instance: dg.DagsterInstance, asset: dg.AssetsDefinition) -> UnitCost:
    """The asset's :class:`UnitCost` (module docstring). One event-log query (the last
    :data:`~dagster_gpu.instance.history.UNIT_HISTORY` materializations; the runtime model learns from the
    newest :data:`~dagster_gpu.instance.history.RUNTIME_HISTORY` of them)."""
    mds = recent_metadata(instance, asset.key, UNIT_HISTORY)
    model = RuntimeModel.from_history(points_from_metadata(mds[:RUNTIME_HISTORY]))
    cpu = GpuRequest.from_tags(asset.op.tags or {}).count == 0
    on_cpu = cpu or bool(model.cpu_texts_per_second and not model.per_product)  # a CPU step, or CPU history only
    if model.cpu_texts_per_second and on_cpu:
        tps = model.cpu_texts_per_second
    elif cpu:
        tps = model.cpu_rate()
    else:
        tps = model.texts_per_second
    seconds_per_byte = model.rows_per_byte / tps
    where_learned = f"this asset on {'the CPU' if on_cpu else 'a GPU'}"
    startup_s, per_partition_s, where = overheads(unit_samples(mds, cpu=on_cpu), seconds_per_byte, where_learned)
    return UnitCost(startup_s, per_partition_s, seconds_per_byte,
                    source=cost_source(startup_s, per_partition_s, where, model, cpu))
