"""The work unit's measured costs, read from the package data ``dagster_gpu/data/unit_startup.json`` (the
only file the simulator reads, so it works from an installed wheel as from a checkout; written by
``bench/unit_startup.py`` through the link ``bench/results/unit_startup.json``; the recorded copy is checked
in so the scenarios and their tests are deterministic).

- ``unit_startup_s``: billed seconds a work unit pays once — python start, the step worker's imports
  (dagster, the code location, torch, sentence-transformers) and ``load_model``; median of fresh runs.
- ``per_partition_s``: billed seconds each partition adds inside a unit beyond its embedding — a small
  file's open, read, write and materialization event; median over files.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PATH = Path(__file__).resolve().parents[1] / "data" / "unit_startup.json"


@dataclass(frozen=True)
class UnitCalibration:
    """Measured work-unit costs (seconds) and where they come from (``source``: file, date, host)."""

    unit_startup_s: float
    per_partition_s: float
    source: str


def load_calibration(path: str | Path | None = None) -> UnitCalibration:
    """Read ``unit_startup_s`` and ``per_partition_s`` from ``path`` (default :data:`DEFAULT_PATH`).

    Raises:
        FileNotFoundError: the file is missing (the message says how to make it).
        ValueError: it is not JSON, or a figure is missing, not a number, negative or not finite (the
            message names the file and the key).
    """
    p = Path(path) if path is not None else DEFAULT_PATH
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no unit calibration; run .venv/bin/python bench/unit_startup.py --json {p}")
    try:
        d = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not JSON ({e})") from e
    vals = {}
    for k in ("unit_startup_s", "per_partition_s"):
        v = d.get(k) if isinstance(d, dict) else None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{p}: {k!r} must be a finite number >= 0 seconds, got {v!r}")
        vals[k] = float(v)
    host = d.get("host", {}) if isinstance(d.get("host"), dict) else {}
    src = f"{p.name} ({d.get('measured_at', 'undated')}, {host.get('cpus', '?')} CPUs, " \
          f"device {d.get('worker_start_s', {}).get('device', '?')})"
    return UnitCalibration(vals["unit_startup_s"], vals["per_partition_s"], src)
