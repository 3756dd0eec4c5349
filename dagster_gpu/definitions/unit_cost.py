"""What one work unit of an embedding asset costs, from what was measured and learned
(:class:`dagster_gpu.policy.batching.UnitCost`), for the corpus sensor's hold decision and the bridging of
scattered partitions into one run.

- start-up and per-partition seconds: learned from the asset's finished work units on the same kind of device
  (CPU or GPU) (:func:`dagster_gpu.policy.batching.learned_overheads` over
  :func:`dagster_gpu.instance.history.fetch_unit_samples`: what the units really paid, fork server or fresh
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

import dagster as dg

from dagster_gpu.core.jsonfile import read_json
from dagster_gpu.policy.batching import UnitCost, learned_overheads
from dagster_gpu.instance.history import fetch_unit_samples, runtime_model
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
    """The asset's :class:`UnitCost` (module docstring). Two event-log queries (the last 50 and 200
    materializations)."""
    model = runtime_model(instance, asset.key)
    cpu = GpuRequest.from_tags(asset.op.tags or {}).count == 0
    if model.cpu_texts_per_second and (cpu or not model.per_product):  # CPU history, and a CPU step or no GPU history
        tps = model.cpu_texts_per_second
        on_cpu = True
    elif cpu:
        tps = model.cpu_rate()
        on_cpu = True
    else:
        tps = model.texts_per_second
        on_cpu = False
    seconds_per_byte = model.rows_per_byte / tps
    units = fetch_unit_samples(instance, asset.key, cpu=on_cpu)
    learned = learned_overheads(units, seconds_per_byte)
    if learned is not None:
        startup_s, per_partition_s = learned
        where = f"median of the last {len(units)} unit(s) of this asset on {'the CPU' if on_cpu else 'a GPU'}"
    else:
        startup_s, per_partition_s = calibration_seconds()
        where = CALIBRATION.name
    return UnitCost(startup_s, per_partition_s, seconds_per_byte,
                    source=f"start-up {startup_s:.1f} s, {per_partition_s:.2f} s a partition ({where}), "
                           f"{model.describe(gpu=not cpu, cpu=cpu)}")
