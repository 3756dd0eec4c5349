"""Materialization metadata of one partition step (pure). Keys and units follow DESIGN.md.

Every numeric value is a plain finite float/int so the Dagster UI can plot it across partitions;
a figure that is unknown is left out (with ``gpu/unavailable_reason`` saying why), never NaN or inf.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

import dagster as dg

from dagster_gpu.embedding.pipeline import EmbeddingResult
from dagster_gpu.policy.placement import Placement
from dagster_gpu.telemetry.stats import TelemetrySummary
from dagster_gpu.worker.billing import Billing


class NonFiniteMetadata(ValueError):
    """A metadata value was NaN or infinite; the message names the key."""


def _num(key: str, v: float) -> float:
    if not math.isfinite(v):
        raise NonFiniteMetadata(f"metadata {key!r} is not finite: {v!r}")
    return float(v)


def placement_markdown(p: Placement) -> str:
    """A table of the chosen placement and its alternatives (delays/runtimes in s, cost in USD)."""
    rows = ["| backend | device | feasible | start delay (s) | runtime (s) | cost (USD) | note |", "|---|---|---|---|---|---|---|"]
    fmt = lambda x, d: "–" if x is None else f"{x:.{d}f}"  # noqa: E731
    for a in p.alternatives:
        chosen = " **(chosen)**" if a.backend == p.backend and a.device == p.device else ""
        rows.append(
            f"| {a.backend}{chosen} | {a.device or '–'} | {'yes' if a.feasible else 'no'} | {fmt(a.start_delay_s, 1)} "
            f"| {fmt(a.runtime_s, 1)} | {fmt(a.cost_usd, 6)} | {a.note} |"
        )
    body = "\n".join(rows) if p.alternatives else "_no alternatives considered_"
    return f"**{p.backend}**{' on ' + p.device if p.device else ''}: {p.reason}\n\n{body}"


def build_metadata(
    *,
    result: EmbeddingResult,
    model_name: str,
    model_device: str,
    telemetry: TelemetrySummary,
    billing: Billing,
    backend: str,
    placement: Placement,
    backend_metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The metadata dict for ``context.add_output_metadata`` / ``MaterializeResult``.

    Raises NonFiniteMetadata if any numeric input is NaN/inf (a bug upstream, never silently dropped).
    """
    md: dict[str, Any] = {
        "dagster_gpu/backend": backend,
        "dagster_gpu/placement": dg.MetadataValue.md(placement_markdown(placement)),
        "dagster_gpu/placement_json": dg.MetadataValue.json(placement.to_json()),
        "embedding/rows": int(result.rows),
        "embedding/records_read": int(result.records),
        "embedding/skipped_empty_rows": int(result.skipped_empty_rows),
        "embedding/dim": int(result.dim),
        "embedding/model": model_name,
        "embedding/device": model_device,
        "embedding/seconds": _num("embedding/seconds", result.seconds),
        "embedding/texts_per_second": _num("embedding/texts_per_second", result.texts_per_second),
        "embedding/truncated_rows": int(result.truncated_rows),
        "embedding/output_uri": dg.MetadataValue.path(result.output_uri),
        "embedding/dtype": result.dtype,
        "embedding/batch_size_final": int(result.batch_size_final),
        "embedding/torch_threads": int(result.torch_threads),
        "billing/device_type": billing.device_type,
        "billing/devices": _num("billing/devices", billing.devices),
        "billing/wall_seconds": _num("billing/wall_seconds", billing.wall_seconds),
        "billing/gpu_seconds": _num("billing/gpu_seconds", billing.gpu_seconds),
        "billing/rate_usd_per_gpu_hour": _num("billing/rate_usd_per_gpu_hour", billing.rate_usd_per_gpu_hour),
        "billing/cost_usd": _num("billing/cost_usd", billing.cost_usd),
        "billing/source": billing.source,
        "gpu/samples": int(telemetry.samples),
    }
    if telemetry.device_uuids:
        md["gpu/device_uuids"] = ",".join(telemetry.device_uuids)
    if telemetry.product_name:
        md["gpu/product_name"] = telemetry.product_name
    if billing.device_type != "cpu":
        md["gpu/device_fraction"] = _num("gpu/device_fraction", billing.devices)
    for key, v in (
        ("gpu/utilization_mean_percent", telemetry.utilization_mean_percent),
        ("gpu/utilization_p95_percent", telemetry.utilization_p95_percent),
        ("gpu/memory_peak_mib", telemetry.memory_peak_mib),
    ):
        if v is not None:
            md[key] = _num(key, v)
    reason = telemetry.unavailable_reason
    if model_device == "cpu":
        reason = f"CPU-only: the model ran on CPU ({reason})" if reason else "CPU-only: the model ran on CPU"
    if reason:
        md["gpu/unavailable_reason"] = reason
    for k, v in (backend_metadata or {}).items():
        md[k] = v
    return md


def placement_from_metadata(md: Mapping[str, Any]) -> Placement | None:
    """Read back a Placement from a materialization's metadata (``dagster_gpu/placement_json``)."""
    v = md.get("dagster_gpu/placement_json")
    if v is None:
        return None
    data = getattr(v, "data", v)
    return Placement.from_json(data if isinstance(data, dict) else json.loads(data))
