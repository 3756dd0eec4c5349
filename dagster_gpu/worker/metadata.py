"""Materialization metadata of one partition step (pure). Keys and units: docs/reference/metadata.md.

Every measured figure is a plain finite float/int so the Dagster UI plots it across partitions, a float
rounded to :data:`SIGNIFICANT_DIGITS` significant digits (what a clock or NVML sample means; the UI shows a
float's full ``repr``); a figure that is unknown is left out (with ``gpu/unavailable_reason`` saying why),
never NaN or inf. The step's settings (:data:`SETTING_KEYS`: output dimension, devices billed, rate, threads)
are the same for every partition of a deployment, so they are text: the UI's Plots tab draws one chart per
Int/Float entry of a partition's latest materialization (``extractNumericData`` in dagster-ui's
``AssetMaterializationGraphs.tsx``), and a flat line per setting would take half of it.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

import dagster as dg

from dagster_gpu.billing.keys import (
    COST_USD,
    DEVICE_TYPE,
    DEVICES,
    GPU_SECONDS,
    RATE_USD_PER_GPU_HOUR,
    SOURCE,
    WALL_SECONDS,
    WHAT,
    what_measured,
)
from dagster_gpu.billing.measured import Billing
from dagster_gpu.embedding.pipeline import EmbeddingResult
from dagster_gpu.policy.placement import Alternative, Placement
from dagster_gpu.telemetry.stats import TelemetrySummary


class NonFiniteMetadata(ValueError):
    """A metadata value was NaN or infinite; the message names the key."""


#: Significant digits a measured float keeps (23.28464388847351 s -> 23.28, 0.0003233978317843543 USD -> 0.0003234),
#: never fewer than its integer digits (12345.678 s -> 12346.0): a worker's clock and NVML's samples do not mean
#: more, and the relative error (≤ 5e-4) is below what separates two partitions' runs.
SIGNIFICANT_DIGITS = 4

#: Keys whose value is a setting of the step, not a measurement: stored as text (not plotted).
SETTING_KEYS = frozenset({
    "embedding/dim", "embedding/max_seq_length", "embedding/truncate_dim", "embedding/torch_threads",
    "embedding/devices", DEVICES, RATE_USD_PER_GPU_HOUR, "gpu/device_fraction",
})


def rounded(v: float, digits: int = SIGNIFICANT_DIGITS) -> float:
    """``v`` rounded to ``digits`` significant digits, or to a whole number when it has more integer digits
    than that (0.0 stays 0.0; half to even, as ``round``). Pure."""
    if v == 0:
        return 0.0
    return float(round(v, max(0, digits - 1 - math.floor(math.log10(abs(v))))))


def _num(key: str, v: float) -> float:
    if not math.isfinite(v):
        raise NonFiniteMetadata(f"metadata {key!r} is not finite: {v!r}")
    return float(v)


def _shown(key: str, v: Any) -> Any:
    """How entry ``key`` is stored: a setting as text, a measured float rounded, anything else as it is.
    Every float passes :func:`_num` here, the backend's and the unit's entries too (NonFiniteMetadata)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return v
    if isinstance(v, float):
        v = _num(key, v)
    if key in SETTING_KEYS:
        return dg.MetadataValue.text(f"{v:g}" if isinstance(v, float) else str(v))
    return rounded(v) if isinstance(v, float) else v


#: The figures people look at first, in this order; every other key follows in insertion order.
FIRST_KEYS = (
    "embedding/rows",
    "embedding/texts_per_second",
    "gpu/utilization_mean_percent",
    GPU_SECONDS,
    COST_USD,
    "embedding/useful_fraction",
    "dagster_gpu/backend",
    "dagster_gpu/cluster",
    "dagster_gpu/placement",
)

_COLUMNS = (  # (header, attribute, decimals); a column whose every value is unknown is left out
    ("start delay (s)", "start_delay_s", 1),
    ("runtime (s)", "runtime_s", 1),
    ("cost (USD)", "cost_usd", 6),
    ("of which preemption (USD)", "expected_preemption_cost_usd", 6),
)


def _says_something(a: Alternative) -> bool:
    return bool(a.note) or not a.feasible or any(getattr(a, attr) is not None for _, attr, _ in _COLUMNS)


def _where(backend: str, cluster: str | None) -> str:
    """``campus (slurm)`` for a fleet's cluster named apart from its backend, else the backend."""
    return f"{cluster} ({backend})" if cluster and cluster != backend else backend


def placement_markdown(p: Placement) -> str:
    """The chosen placement and a compact table of the alternatives that say something.

    Units: delays and runtimes in seconds, cost in USD. Left out: alternatives with no estimate, no
    note and feasible (they say nothing), columns unknown for every alternative left, and the table
    itself when the only alternative left is the chosen one (a forced ``local`` step, say).
    """
    head = f"**{_where(p.backend, p.cluster)}**{' on ' + p.device if p.device else ''}: {p.reason}"
    alts = [a for a in p.alternatives if _says_something(a)]
    if not alts:
        return f"{head}\n\n_no alternatives considered_" if not p.alternatives else head
    if len(alts) == 1 and alts[0].backend == p.backend and alts[0].device == p.device and alts[0].feasible:
        only = alts[0]
        extra = [f"{h} {getattr(only, attr):.{d}f}" for h, attr, d in _COLUMNS if getattr(only, attr) is not None]
        return head + (f" ({', '.join(extra)})" if extra else "") + (f"; {only.note}" if only.note else "")
    cols = [(h, attr, d) for h, attr, d in _COLUMNS if any(getattr(a, attr) is not None for a in alts)]
    show_note = any(a.note for a in alts)
    header = ["backend", "device", "feasible", *(h for h, _, _ in cols), *(["note"] if show_note else [])]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for a in alts:
        chosen = " **(chosen)**" if (a.backend, a.device, a.cluster) == (p.backend, p.device, p.cluster) else ""
        cells = [f"{_where(a.backend, a.cluster)}{chosen}", a.device or "–", "yes" if a.feasible else "no"]
        cells += ["–" if getattr(a, attr) is None else f"{getattr(a, attr):.{d}f}" for _, attr, d in cols]
        if show_note:
            cells.append(a.note)
        rows.append("| " + " | ".join(cells) + " |")
    return f"{head}\n\n" + "\n".join(rows)


def ordered(md: Mapping[str, Any]) -> dict[str, Any]:
    """``md`` with :data:`FIRST_KEYS` first (those present, in that order), then the rest as they came."""
    first = {k: md[k] for k in FIRST_KEYS if k in md}
    return {**first, **{k: v for k, v in md.items() if k not in first}}


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
    lineage: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The metadata dict for ``context.add_output_metadata`` / ``MaterializeResult``.

    Key order is what the UI shows: :data:`FIRST_KEYS` first (rows, texts/s, utilization,
    GPU-seconds, cost, useful fraction, backend, placement), then what was produced, allocated and billed.
    The placement appears once, as a Markdown table; its JSON is on the step's launch event
    (``STEP_WORKER_STARTING`` metadata ``dagster_gpu/placement``, see :func:`placement_from_metadata`).

    ``lineage`` (the unit's, see :func:`dagster_gpu.worker.unit.unit_lineage`) adds ``embedding/fingerprint``,
    ``embedding/model_revision``, ``embedding/prompt`` (the prompt's name, else its text; "" = none),
    ``embedding/normalize``, ``embedding/truncate_dim`` (when set), ``embedding/output_dtype``,
    ``embedding/max_seq_length``, ``embedding/chunking`` (JSON, when chunked) and ``embedding/pooling`` (JSON).

    Measured floats are :func:`rounded`; :data:`SETTING_KEYS` are text (``"384"``, ``"0.142857"``: read them
    back with ``float``/``int``).

    Raises NonFiniteMetadata if any numeric input is NaN/inf (a bug upstream, never silently dropped).
    """
    md: dict[str, Any] = {
        "dagster_gpu/backend": backend,
        **({"dagster_gpu/cluster": placement.cluster} if placement.cluster else {}),  # the fleet's cluster it ran on
        "dagster_gpu/placement": dg.MetadataValue.md(placement_markdown(placement)),
        "embedding/rows": int(result.rows),
        "embedding/records_read": int(result.records),
        "embedding/skipped_empty_rows": int(result.skipped_empty_rows),
        "embedding/dim": int(result.dim),
        "embedding/model": model_name,
        "embedding/device": model_device,
        "embedding/seconds": _num("embedding/seconds", result.seconds),
        "embedding/truncated_rows": int(result.truncated_rows),
        "embedding/chunks": int(result.rows),
        "embedding/records_embedded": int(result.records_embedded),
        "embedding/reused_rows": int(getattr(result, "reused_rows", 0)),
        "embedding/resumed_rows": int(getattr(result, "resumed_rows", 0)),
        "embedding/tokens": int(result.tokens),
        "embedding/token_coverage": _num("embedding/token_coverage", result.token_coverage),
        "embedding/output_uri": dg.MetadataValue.path(result.output_uri),
        "embedding/dtype": result.dtype,
        "embedding/replaced_rows": int(result.replaced_rows),
        "embedding/skipped_undecodable_rows": int(result.skipped_undecodable_rows),
        "embedding/batch_size_final": int(result.batch_size_final),
        "embedding/torch_threads": int(result.torch_threads),
        DEVICE_TYPE: billing.device_type,
        DEVICES: _num(DEVICES, billing.devices),
        WALL_SECONDS: _num(WALL_SECONDS, billing.wall_seconds),
        GPU_SECONDS: _num(GPU_SECONDS, billing.gpu_seconds),
        RATE_USD_PER_GPU_HOUR: _num(RATE_USD_PER_GPU_HOUR, billing.rate_usd_per_gpu_hour),
        COST_USD: _num(COST_USD, billing.cost_usd),
        SOURCE: billing.source,
        WHAT: what_measured(),
        "gpu/samples": int(telemetry.samples),
    }
    reused_all = int(result.rows) > 0 and int(getattr(result, "reused_rows", 0)) == int(result.rows)
    if not reused_all:  # every row reused: nothing reached the model, so there is no throughput to show
        md["embedding/texts_per_second"] = _num("embedding/texts_per_second", result.texts_per_second)
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
    if lineage is not None:
        md.update(lineage_entries(lineage))
    for k, v in (backend_metadata or {}).items():
        md[k] = v
    return ordered({k: _shown(k, v) for k, v in md.items()})


def lineage_entries(lineage: Mapping[str, Any]) -> dict[str, Any]:
    """The ``embedding/*`` lineage keys of a materialization (see :func:`build_metadata`). Pure."""
    md: dict[str, Any] = {
        "embedding/fingerprint": str(lineage["fingerprint"]),
        "embedding/model_revision": str(lineage.get("model_revision") or ""),
        "embedding/prompt": str(lineage.get("prompt_name") or lineage.get("prompt") or ""),
        "embedding/normalize": bool(lineage.get("normalize", True)),
        "embedding/output_dtype": str(lineage.get("output_dtype", "float32")),
    }
    if lineage.get("max_seq_length") is not None:
        md["embedding/max_seq_length"] = int(lineage["max_seq_length"])
    if lineage.get("truncate_dim") is not None:
        md["embedding/truncate_dim"] = int(lineage["truncate_dim"])
    if lineage.get("chunking") is not None:
        md["embedding/chunking"] = dg.MetadataValue.json(dict(lineage["chunking"]))
    if lineage.get("pooling"):
        md["embedding/pooling"] = dg.MetadataValue.json(dict(lineage["pooling"]))
    return md


def placement_from_metadata(md: Mapping[str, Any]) -> Placement | None:
    """Read back a Placement from a launch event's metadata (``dagster_gpu/placement``, JSON).

    Accepts a ``JsonMetadataValue``, a dict or a JSON string; None when the key is absent or holds the
    Markdown rendering (a materialization's), which cannot be read back.
    """
    v = md.get("dagster_gpu/placement")
    if v is None:
        return None
    data = getattr(v, "data", v)
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError:
            return None
    return Placement.from_json(data) if isinstance(data, dict) else None


def group_metadata(source: Any, changes: Any = None, limit: int = 10) -> dict[str, Any]:
    """A file group partition's materialization metadata (empty for a file or a shard; pure): ``dagster_gpu/group``
    ("43 of 1024", 1-based), ``corpus/files`` (files in the bucket), and with ``changes``
    (:class:`dagster_gpu.corpus.groups.FileChanges` against the previous output) ``corpus/files_changed`` (files
    changed, added or removed: a count), ``corpus/files_added`` and ``corpus/files_removed`` (counts) and
    ``corpus/files_changed_list`` (text: at most ``limit`` file keys of each kind, or ``first materialization: N
    file(s)``). The rows are ``embedding/rows``; the files' versions are in the output's key-value metadata."""
    g = getattr(source, "group", None)
    if g is None:
        return {}
    md: dict[str, Any] = {"dagster_gpu/group": f"{g.index + 1} of {g.count}", "corpus/files": len(source.members)}
    if changes is not None:
        md.update({"corpus/files_changed": int(changes.count), "corpus/files_added": len(changes.added),
                   "corpus/files_removed": len(changes.removed),
                   "corpus/files_changed_list": changes.describe(limit)})
    return md
