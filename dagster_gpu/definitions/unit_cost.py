"""What one work unit of an embedding asset costs, from what was measured and learned
(:class:`dagster_gpu.policy.batching.UnitCost`), for the corpus sensor's hold decision and the bridging of
scattered partitions into one run.

- start-up and per-partition seconds: the packaged unit calibration ``dagster_gpu/data/unit_startup.json``
  (``unit_startup_s``, ``per_partition_s``: medians of fresh worker processes, measured by ``bench/unit_startup.py``);
- embedding seconds per byte: the runtime model learned from the asset's earlier materializations
  (:func:`dagster_gpu.instance.history.runtime_model`): ``rows_per_byte / texts_per_second``, the CPU rate for
  an asset that asks no GPU (``dagster-gpu/gpu-count`` 0) or whose history ran on CPU only; the model's stated
  fallback (2000 texts/s on a GPU, 46.3 measured on CPU, 200 bytes/row) without history.
"""

from __future__ import annotations

import math
from pathlib import Path

import dagster as dg

from dagster_gpu.core.jsonfile import read_json
from dagster_gpu.policy.batching import UnitCost
from dagster_gpu.instance.history import runtime_model
from dagster_gpu.core.request import GpuRequest

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


def unit_cost(instance: dg.DagsterInstance, asset: dg.AssetsDefinition) -> UnitCost:
    """The asset's :class:`UnitCost` (module docstring). One event-log query (the last 50 materializations)."""
    startup_s, per_partition_s = calibration_seconds()
    model = runtime_model(instance, asset.key)
    cpu = GpuRequest.from_tags(asset.op.tags or {}).count == 0
    if model.cpu_texts_per_second and (cpu or not model.per_product):  # CPU history, and a CPU step or no GPU history
        tps = model.cpu_texts_per_second
    elif cpu:
        tps = model.cpu_rate()
    else:
        tps = model.texts_per_second
    return UnitCost(startup_s, per_partition_s, model.rows_per_byte / tps,
                    source=f"start-up {startup_s:.1f} s ({CALIBRATION.name}), {model.describe(gpu=not cpu, cpu=cpu)}")
