"""``dagster-gpu report``: a self-contained HTML page (inline SVG charts, no server, no network) of a
backfill or of an asset's last N materializations.

Per partition: cost (USD) by backend (as measured, and its share of its unit's scheduler bill:
:func:`dagster_gpu.instance.bills.billed_share`), GPU-seconds, useful fraction, GPU utilization, texts/s against
rows, the placement chosen and the policy's estimated cost against the measured one; totals per
backend; each failed partition with its run and the reason. Sources: each materialization's metadata
(keys in docs/reference/metadata.md), each failed run's step failure, and each run's
launch event (``STEP_WORKER_STARTING`` metadata ``dagster_gpu/placement``, whose
chosen alternative carries the estimate ``cost_usd``).

Useful fraction = embedding seconds ÷ measured seconds (:func:`dagster_gpu.billing.metering.useful_fraction`):
per partition ``embedding/useful_fraction`` when the materialization has it, else ``embedding/seconds`` ÷
``billing/wall_seconds`` (the wall seconds the step worker measured), else ÷ (``billing/gpu_seconds`` ÷
``billing/devices``, the same seconds); None when neither is known. Totals (per backend, whole report) are
the ratio of sums, as in ``dagster-gpu backfill``'s summary. "Measured" figures are the step worker's own
(materialization metadata ``billing/*``, ``billing/source: measured``); "the scheduler's bill" is each
partition's share of its work unit's bill (observations with ``billing/source`` sacct, pod-interval, process).

The page counts partitions, not materializations (``--last N`` may hold one partition twice), and marks a
partition no longer registered (pruned: its corpus file was deleted).
"""

from __future__ import annotations

import argparse
import html
import io
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import dagster as dg

from dagster_gpu.billing.keys import COST_USD, DEVICE_TYPE, DEVICES, GPU_SECONDS, WALL_SECONDS
from dagster_gpu.billing.metering import useful_fraction as ratio_of_sums
from dagster_gpu.commands.common import instance_or_none
from dagster_gpu.core.extras import require_extra
from dagster_gpu.core.request import BACKENDS
from dagster_gpu.instance.bills import SCHEDULERS_BILL, BilledShare, PendingBill, billed_share, billed_total, unit_of
from dagster_gpu.instance.events import metadata_get, metadata_number
from dagster_gpu.instance.failures import launch_metadata, partition_line, step_failure_message
from dagster_gpu.partitions.run_ranges import PartitionRangeError, run_partition_keys
from dagster_gpu.policy.forced import ForcedBackend
from dagster_gpu.worker.metadata import placement_from_metadata


@dataclass(frozen=True)
class ReportRow(PendingBill):
    """One materialization (one partition of one run). Units: USD, seconds, percent, texts per second."""

    partition: str
    run_id: str
    backend: str
    rows: int | None
    texts_per_second: float | None
    cost_usd: float | None
    gpu_seconds: float | None
    useful_fraction: float | None
    utilization_percent: float | None
    gpu_unavailable_reason: str | None
    device: str | None
    estimated_cost_usd: float | None
    placement_reason: str
    bill: BilledShare | None = None  # its share of its unit's scheduler bill; None until that lands
    embedding_seconds: float | None = None  # embedding/seconds
    estimated_seconds: float | None = None  # the policy's runtime estimate (its share of the unit's)
    measured_seconds: float | None = None  # the wall seconds the worker measured (billing/wall_seconds)
    unit: tuple[str, str] | None = None  # (metadata key, value) of the work unit that ran it
    cluster: str | None = None  # dagster_gpu/cluster: the fleet's cluster it ran on (None: the backend's own section)

    @property
    def where(self) -> str:
        """What the per-cluster table groups by: ``campus (slurm)`` for a fleet's cluster, else the backend."""
        return f"{self.cluster} ({self.backend})" if self.cluster and self.cluster != self.backend else self.backend


def _measured_seconds(md: Mapping[str, Any]) -> float | None:
    """``billing/wall_seconds``, else ``billing/gpu_seconds`` ÷ ``billing/devices`` (the same seconds)."""
    wall = metadata_get(md, WALL_SECONDS)
    if isinstance(wall, (int, float)):
        return float(wall)
    gs, dev = metadata_get(md, GPU_SECONDS), metadata_number(md, DEVICES)  # devices: a setting, as text
    if isinstance(gs, (int, float)):
        return float(gs) / dev if dev is not None and dev > 0 else float(gs)
    return None


def useful_fraction(md: Mapping[str, Any]) -> float | None:
    """See the module docstring; clipped to [0, 1]."""
    given = metadata_get(md, "embedding/useful_fraction")
    if isinstance(given, (int, float)):
        return max(0.0, min(1.0, float(given)))
    emb = metadata_get(md, "embedding/seconds")
    return ratio_of_sums([(emb if isinstance(emb, (int, float)) else None, _measured_seconds(md))])


def total_useful_fraction(rows: Sequence["ReportRow"]) -> float | None:
    """Σ embedding seconds ÷ Σ measured seconds over ``rows`` (the ratio of sums)."""
    return ratio_of_sums((r.embedding_seconds, r.measured_seconds) for r in rows)


def row_from(partition: str, run_id: str, md: Mapping[str, Any], launch_md: Mapping[str, Any] | None,
             partitions_in_run: int = 1) -> ReportRow:
    """One row from a materialization's metadata and its run's launch metadata (pure). A ranged run's
    estimate (one step for ``partitions_in_run`` partitions) is shared equally among them."""
    placement = placement_from_metadata(launch_md or {})
    chosen = placement.chosen if placement else None
    est = chosen.cost_usd / max(1, partitions_in_run) if chosen and chosen.cost_usd is not None else None
    est_s = chosen.runtime_s / max(1, partitions_in_run) if chosen and chosen.runtime_s is not None else None

    def num(key: str) -> float | None:
        x = metadata_get(md, key)
        return float(x) if isinstance(x, (int, float)) else None

    rows = metadata_get(md, "embedding/rows")
    reused = metadata_get(md, "embedding/reused_rows")
    # every row's vector reused from the previous output: no text reached the model, no throughput (shown "–")
    all_reused = isinstance(rows, (int, float)) and rows > 0 and reused == rows
    return ReportRow(
        partition=partition, run_id=run_id, backend=str(metadata_get(md, "dagster_gpu/backend") or "?"),
        cluster=metadata_get(md, "dagster_gpu/cluster") or None,
        rows=int(rows) if isinstance(rows, (int, float)) else None,
        texts_per_second=None if all_reused else num("embedding/texts_per_second"), cost_usd=num(COST_USD),
        gpu_seconds=num(GPU_SECONDS), useful_fraction=useful_fraction(md),
        utilization_percent=num("gpu/utilization_mean_percent"),
        gpu_unavailable_reason=metadata_get(md, "gpu/unavailable_reason"),
        device=str(metadata_get(md, DEVICE_TYPE) or (placement.device if placement else "") or ""),
        estimated_cost_usd=est, placement_reason=placement.reason if placement else "",
        embedding_seconds=num("embedding/seconds"), measured_seconds=_measured_seconds(md), estimated_seconds=est_s,
    )


# -- reading the instance ---------------------------------------------------------------------------
def _rows_for_run(instance: dg.DagsterInstance, run_id: str, asset_key: dg.AssetKey) -> list[ReportRow]:
    mats = []
    for rec in instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records:
        m = rec.event_log_entry.asset_materialization
        if m is not None and m.asset_key == asset_key:
            mats.append(m)
    launch = launch_metadata(instance, run_id)
    rows = []
    for m in mats:
        unit = unit_of(m.metadata) or unit_of(launch)
        rows.append(replace(row_from(m.partition or "-", run_id, m.metadata, launch, len(mats)), unit=unit,
                            bill=billed_share(instance, asset_key, m.partition, unit) if m.partition else None))
    return rows


def collect(instance: dg.DagsterInstance, asset_key: dg.AssetKey, *, backfill_id: str | None = None,
            last: int | None = None, partitions_def_name: str | None = None,
            ) -> tuple[list[ReportRow], list[tuple[str, str, str]]]:
    """(rows, failed) of a backfill's runs, or of the asset's last ``last`` materializations and every
    failed or canceled run of the asset since the first of their runs (the last ``last`` such runs when it
    has no materialization): a run that materialized nothing is reported too.

    ``failed``: (partition key, run id, the partition's line of the run's failure message) for each
    partition of a failed run that it did not materialize (a range's keys resolved in the dynamic
    partitions ``partitions_def_name``; the range itself when it cannot be). Raises ValueError when
    neither ``backfill_id`` nor ``last`` is given or the backfill is unknown."""
    from dagster import RunsFilter

    bad = (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
    if backfill_id:
        if instance.get_backfill(backfill_id) is None:
            raise ValueError(f"no backfill {backfill_id!r} in this instance")
        runs = [r.dagster_run for r in instance.get_run_records(RunsFilter.for_backfill(backfill_id), order_by="id", ascending=True)]
    elif last:
        recs = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=asset_key), limit=last, ascending=False).records
        ids = list(dict.fromkeys(r.run_id for r in reversed(recs)))
        first = instance.get_run_record_by_id(ids[0]) if ids else None
        since = RunsFilter(statuses=list(bad), created_after=first.create_timestamp) if first else RunsFilter(statuses=list(bad))
        failed_runs = []
        for r in instance.get_run_records(since):  # newest first
            if _plans(instance, r.dagster_run, asset_key):
                failed_runs.append(r.dagster_run)
                if first is None and len(failed_runs) == last:
                    break
        ids += [r.run_id for r in reversed(failed_runs) if r.run_id not in ids]
        runs = sorted((r for r in (instance.get_run_record_by_id(i) for i in ids) if r is not None), key=lambda r: r.create_timestamp)
        runs = [r.dagster_run for r in runs]
    else:
        raise ValueError("give a backfill id or a number of materializations")
    rows: list[ReportRow] = []
    failed: list[tuple[str, str, str]] = []
    for run in runs:
        got = _rows_for_run(instance, run.run_id, asset_key)
        rows += got
        if run.status in bad:
            failed += _failed_partitions(instance, run, {r.partition for r in got}, partitions_def_name)
    if last:
        rows = rows[-last:]
    return rows, failed


def _plans(instance: dg.DagsterInstance, run: dg.DagsterRun, asset_key: dg.AssetKey) -> bool:
    """The run set out to materialize ``asset_key`` (its ASSET_MATERIALIZATION_PLANNED events: a run of a job
    or of ``materialize()`` may carry no asset selection)."""
    if run.asset_selection:
        return asset_key in run.asset_selection
    recs = instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED).records
    return any(r.event_log_entry.dagster_event is not None and r.event_log_entry.dagster_event.asset_key == asset_key
               for r in recs)


def _failed_partitions(instance: dg.DagsterInstance, run: dg.DagsterRun, materialized: set[str],
                       partitions_def_name: str | None) -> list[tuple[str, str, str]]:
    message = step_failure_message(instance, run.run_id) or run.status.value
    try:
        keys = run_partition_keys(instance, run.tags, partitions_def_name)
    except PartitionRangeError:
        t = run.tags
        keys = (f"{t.get('dagster/asset_partition_range_start')}…{t.get('dagster/asset_partition_range_end')}",)
    return [(k, run.run_id, partition_line(message, k)) for k in keys or ("-",) if k not in materialized]


# -- rendering ----------------------------------------------------------------------------------------
_COLORS = {"local": "#7f7f7f", "slurm": "#1f77b4", "kubernetes": "#2ca02c"}


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    a, b = text.find("<metadata>"), text.find("</metadata>")
    return text[:a] + text[b + len("</metadata>"):] if a >= 0 and b > a else text


#: Above this many rows a per-partition chart is a histogram of the partitions' values (one bar per partition
#: would be a few pixels wide, its label unreadable).
MAX_BARS = 40


def _histogram(rows: Sequence[ReportRow], attr: str, title: str, ylabel: str, missing: str) -> str:
    """How many partitions fall in each of 20 bins of ``attr`` (x axis: ``ylabel``), stacked by backend;
    the title says how many partitions and how many have no value (``missing``)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    known = [r for r in rows if getattr(r, attr) is not None]
    backends = [b for b in _COLORS if any(r.backend == b for r in known)]
    backends += sorted({r.backend for r in known} - set(backends))
    if known:
        ax.hist([[getattr(r, attr) for r in known if r.backend == b] for b in backends], bins=20, stacked=True,
                color=[_COLORS.get(b, "#9467bd") for b in backends], label=backends,
                range=(0, 100) if ylabel == "percent" else None)
        ax.legend(fontsize=7)
    none = len(rows) - len(known)
    ax.set_title(f"{title}\n({len(rows)} partitions" + (f"; {none} {missing}" if none else "") + ")", fontsize=10)
    ax.set_xlabel(ylabel)
    ax.set_ylabel("partitions")
    readable_ticks(ax.xaxis)
    return _svg(fig)


def readable_ticks(axis, most: int = 6) -> None:
    """At most ``most`` ticks on a matplotlib ``axis``, at round values, their labels short: values under 0.01 or
    from 10,000 up as a mantissa with one power of ten for the axis (``1.5``, ``2.0`` and ``×10⁻⁴``), so that
    costs of a few ten-thousandths of a dollar do not print as touching ``0.00015`` labels."""
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    axis.set_major_locator(MaxNLocator(nbins=most - 1, min_n_ticks=2))
    fmt = ScalarFormatter(useMathText=True)
    fmt.set_powerlimits((-2, 4))
    axis.set_major_formatter(fmt)


def _bars(rows: Sequence[ReportRow], attr: str, title: str, ylabel: str, missing: str) -> str:
    """One bar per row (partition), coloured by backend, ``missing`` written where a row has no value; a
    :func:`_histogram` instead above :data:`MAX_BARS` rows."""
    if len(rows) > MAX_BARS:
        return _histogram(rows, attr, title, ylabel, missing)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(rows) + 2), 3))
    xs = list(range(len(rows)))
    vals = [getattr(r, attr) for r in rows]
    ax.bar(xs, [v or 0 for v in vals], color=[_COLORS.get(r.backend, "#9467bd") for r in rows])
    for x, v in zip(xs, vals):
        if v is None:
            ax.annotate(missing, (x, 0), rotation=90, ha="center", va="bottom", fontsize=7, color="#b00")
    ax.set_xticks(xs, [r.partition for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0, top=100 if ylabel == "percent" else None)
    readable_ticks(ax.yaxis)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for b, c in _COLORS.items() if any(r.backend == b for r in rows)]
    ax.legend(handles, [b for b in _COLORS if any(r.backend == b for r in rows)], fontsize=7)
    return _svg(fig)


def _scatter(xs, ys, labels, title, xlabel, ylabel, diagonal=False) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.scatter(xs, ys, c=[_COLORS.get(b, "#9467bd") for b in labels])
    if diagonal and xs:
        hi = max(max(xs), max(ys)) * 1.05
        ax.plot([0, hi], [0, hi], "--", color="#999", linewidth=1, label="estimate = measured")
        ax.legend(fontsize=7)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return _svg(fig)


def cpu_only(rows: Sequence[ReportRow]) -> bool:
    """Every row ran on CPU (its device type ``cpu``) and none has a GPU utilization: nothing to chart. Pure."""
    return bool(rows) and all((r.device or "").startswith("cpu") and r.utilization_percent is None for r in rows)


def no_estimates(rows: Sequence[ReportRow]) -> str:
    """Why a report has no policy estimates, from its rows' placement reasons: one backend configured
    (``auto: B is the only configured backend``: nothing to choose between), or a placement forced by tag or
    config; a sentence."""
    only = {b for b in BACKENDS if any(r.placement_reason == ForcedBackend(b, "only").reason for r in rows)}
    if only and all(r.placement_reason in {ForcedBackend(b, "only").reason for b in only} for r in rows):
        return (f"No policy estimates: {', '.join(sorted(only))} was the only configured backend, so there was no "
                f"choice to estimate; with a second backend configured, backend: auto records the estimated cost "
                f"of every alternative at each launch.")
    return ("No policy estimates: every placement was forced (a fixed backend or a dagster-gpu/backend tag) or had "
            "only one configured backend; with backend: auto and several backends each launch records the "
            "estimated cost of every alternative.")


@dataclass(frozen=True)
class FailedBill(PendingBill):
    """A failed partition's share of the scheduler's bill of the unit that ran it (:func:`failed_bills`)."""

    partition: str
    unit: tuple[str, str] | None
    bill: BilledShare | None


def failed_bills(instance: dg.DagsterInstance, asset_key: dg.AssetKey,
                 failed: Sequence[tuple[str, str, str]]) -> list[FailedBill]:
    """Each failed partition's (as :func:`collect` gives them) share of its unit's bill: the unit named by its
    run's launch event, the share as for a materialized partition (:func:`dagster_gpu.instance.bills.billed_share`)."""
    units: dict[str, tuple[str, str] | None] = {}
    out = []
    for key, run_id, _ in failed:
        if run_id not in units:
            units[run_id] = unit_of(launch_metadata(instance, run_id))
        unit = units[run_id]
        out.append(FailedBill(key, unit, billed_share(instance, asset_key, key, unit)))
    return out


def render_html(rows: Sequence[ReportRow], failed: Sequence[tuple[str, str, str]], title: str,
                registered: set[str] | None = None, failed_bills: Sequence[PendingBill] = ()) -> str:
    """The whole page: totals, per-backend table, charts (inline SVG; a histogram above :data:`MAX_BARS`
    partitions), placements, failed partitions ((partition key, run id, why) as :func:`collect` gives them).
    ``registered``: the partition keys the asset has now; a row's partition not among them is marked pruned
    (None: nothing is marked). ``failed_bills``: the failed partitions' shares (:func:`failed_bills`), added to
    the total of :data:`SCHEDULERS_BILL` as the CLI summary adds them. Raises MissingExtra (one line) without
    the report extra (matplotlib)."""
    require_extra("report", "dagster-gpu report")
    import matplotlib

    matplotlib.use("Agg")
    e = html.escape
    per_backend: dict[str, list[ReportRow]] = {}
    for r in rows:
        per_backend.setdefault(r.where, []).append(r)
    total = sum(r.cost_usd or 0 for r in rows)
    partitions = {r.partition for r in rows}
    pruned = sorted(partitions - registered) if registered is not None else []
    uf = total_useful_fraction(rows)
    counted = (f"{len(partitions)} partition(s) materialized" if len(partitions) == len(rows)
               else f"{len(rows)} materialization(s) of {len(partitions)} partition(s)")
    parts = [f"<h1>{e(title)}</h1>",
             f"<p>{counted}" + (f" ({len(pruned)} since pruned: {e(', '.join(pruned))})" if pruned else "")
             + f", {len(set(k for k, _, _ in failed))} failed; measured cost "
             f"<b>{total:.6f} USD</b>, {sum(r.gpu_seconds or 0 for r in rows):.1f} GPU-seconds"
             + (f", useful fraction <b>{uf:.3f}</b> (Σ embedding ÷ Σ measured seconds)" if uf is not None else "")
             + f"; {e(SCHEDULERS_BILL)}: <b>{billed_total([*rows, *failed_bills])} USD</b>.</p>"]
    parts.append("<h2>Per cluster</h2><table><tr><th>cluster (backend)</th><th>partitions</th><th>materializations</th><th>rows</th>"
                 "<th>measured GPU-seconds</th><th>measured (USD)</th><th>scheduler's bill (USD)</th><th>estimated (USD)</th>"
                 "<th>useful fraction</th></tr>")
    for b, rs in sorted(per_backend.items()):
        buf = total_useful_fraction(rs)
        est = [r.estimated_cost_usd for r in rs if r.estimated_cost_usd is not None]
        paired = [r for r in rs if r.estimated_cost_usd is not None and r.cost_usd]
        ratio = (sum(r.estimated_cost_usd for r in paired) / sum(r.cost_usd for r in paired)) if paired else None
        parts.append(f"<tr><td>{e(b)}</td><td>{len({r.partition for r in rs})}</td><td>{len(rs)}</td>"
                     f"<td>{sum(r.rows or 0 for r in rs)}</td>"
                     f"<td>{sum(r.gpu_seconds or 0 for r in rs):.1f}</td><td>{sum(r.cost_usd or 0 for r in rs):.6f}</td>"
                     f"<td>{billed_total(rs)}</td><td>{f'{sum(est):.6f}' if est else '–'}"
                     f"{f' (×{ratio:.2f} of measured)' if ratio is not None else ''}</td>"
                     f"<td>{'–' if buf is None else f'{buf:.3f}'}</td></tr>")
    parts.append("</table>")
    if rows:
        parts.append('<h2>Charts</h2><div class="charts">')
        parts.append(_bars(rows, "cost_usd", "Measured cost per partition", "USD", "n/a"))
        unit = "CPU-seconds" if cpu_only(rows) else "GPU-seconds"  # a CPU run's seconds are CPU seconds
        parts.append(_bars(rows, "gpu_seconds", f"Measured {unit} per partition", unit, "n/a"))
        parts.append(_bars(rows, "useful_fraction", "Useful fraction (embedding ÷ measured seconds)", "fraction", "n/a"))
        if cpu_only(rows):  # no GPU: an empty 0–100 frame would say nothing
            parts.append('<p class="nochart">Mean GPU utilization: no GPU measured (CPU run)</p>')
        else:
            parts.append(_bars(rows, "utilization_percent", "Mean GPU utilization", "percent", "unavailable"))
        tp = [r for r in rows if r.rows is not None and r.texts_per_second is not None]
        parts.append(_scatter([r.rows for r in tp], [r.texts_per_second for r in tp], [r.backend for r in tp],
                              "Throughput against partition size", "rows", "texts/s"))
        ev = [r for r in rows if r.estimated_cost_usd is not None and r.cost_usd is not None]
        if ev:
            parts.append(_scatter([r.estimated_cost_usd for r in ev], [r.cost_usd for r in ev], [r.backend for r in ev],
                                  "Policy estimate against measured cost", "estimated USD", "measured USD", diagonal=True))
        parts.append("</div>")
        if not ev:
            parts.append(f"<p>{e(no_estimates(rows))}</p>")
    parts.append("<h2>Partitions</h2><table><tr><th>partition</th><th>run</th><th>backend</th><th>device</th><th>rows</th>"
                 "<th>texts/s</th><th>utilization %</th><th>measured GPU-s</th><th>useful</th><th>measured USD</th>"
                 "<th>scheduler's bill USD</th><th>estimate USD</th><th>measured s</th><th>estimate s</th>"
                 "<th>placement reason</th></tr>")
    f = lambda x, d: "–" if x is None else f"{x:.{d}f}"  # noqa: E731
    for r in rows:
        util = f(r.utilization_percent, 1) if r.utilization_percent is not None else f'<span title="{e(r.gpu_unavailable_reason or "")}">n/a</span>'
        mark = ' <span class="pruned" title="its corpus file was deleted and the partition removed">(pruned)</span>' \
            if r.partition in pruned else ""
        parts.append(f"<tr><td>{e(r.partition)}{mark}</td><td><code>{e(r.run_id[:8])}</code></td><td>{e(r.backend)}</td>"
                     f"<td>{e(r.device or '')}</td><td>{r.rows if r.rows is not None else '–'}</td><td>{f(r.texts_per_second, 1)}</td>"
                     f"<td>{util}</td><td>{f(r.gpu_seconds, 2)}</td><td>{f(r.useful_fraction, 2)}</td><td>{f(r.cost_usd, 6)}</td>"
                     f"<td>{'pending' if r.bill_pending else f(r.billed_cost_usd, 6)}</td>"
                     f"<td>{f(r.estimated_cost_usd, 6)}</td><td>{f(r.measured_seconds, 1)}</td><td>{f(r.estimated_seconds, 1)}</td>"
                     f"<td>{e(r.placement_reason)}</td></tr>")
    parts.append("</table>")
    if failed:
        parts.append("<h2>Failed partitions</h2><table><tr><th>partition</th><th>run</th><th>why</th></tr>" + "".join(
            f"<tr><td>{e(k)}</td><td><code>{e(rid)}</code></td><td>{e(why)}</td></tr>" for k, rid, why in failed) + "</table>")
    style = ("body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px;text-align:right}"
             "td:first-child,th:first-child{text-align:left}.charts svg{max-width:48%;height:auto;margin:4px}"
             ".pruned{color:#b00}.nochart{color:#555;font-style:italic}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{style}</style></head>"
            f"<body>{''.join(parts)}</body></html>\n")


def report_main(argv: Sequence[str] | None = None) -> int:
    """``dagster-gpu report -a ASSET (--backfill ID | --last N) [-o FILE]``; exit 0, or 2 on bad input."""
    ap = argparse.ArgumentParser(prog="dagster-gpu report", description=__doc__.split("\n\n")[0])
    ap.add_argument("-a", "--asset", required=True, help="asset key, '/'-separated")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--backfill", help="backfill id")
    g.add_argument("--last", type=int, help="the asset's last N materializations, and its failed runs since")
    ap.add_argument("--partitions-def", help="the asset's dynamic partitions definition, to name the failed partitions "
                                              "of a ranged run (default: <asset name>_files, embedding_asset's)")
    ap.add_argument("-o", "--output", default="dagster-gpu-report.html")
    args = ap.parse_args(argv)
    if args.last is not None and args.last < 1:
        ap.error(f"--last must be at least 1, got {args.last}")
    out = Path(args.output)
    if not out.parent.is_dir():
        ap.error(f"-o {args.output}: directory {out.parent} does not exist")
    instance = instance_or_none("dagster-gpu report")
    if instance is None:
        return 2
    key = dg.AssetKey.from_user_string(args.asset)
    if not instance.has_asset_key(key):
        print(f"dagster-gpu report: no asset {args.asset!r} in this instance ({instance.root_directory})", file=sys.stderr)
        return 2
    try:
        rows, failed = collect(instance, key, backfill_id=args.backfill, last=args.last,
                               partitions_def_name=args.partitions_def or f"{key.path[-1]}_files")
    except ValueError as e:
        print(f"dagster-gpu report: {e}", file=sys.stderr)
        return 2
    what = f"backfill {args.backfill}" if args.backfill else f"last {args.last} materializations"
    pdef = args.partitions_def or f"{key.path[-1]}_files"
    registered = set(instance.get_dynamic_partitions(pdef)) or None  # None: no such dynamic partitions: mark nothing
    out.write_text(render_html(rows, failed, f"{args.asset}: {what}", registered=registered,
                               failed_bills=failed_bills(instance, key, failed)))
    runs = len({rid for _, rid, _ in failed})
    n = len({r.partition for r in rows})
    print(f"{args.output}: {len(rows)} materialization(s) of {n} partition(s), {len({k for k, _, _ in failed})} "
          f"failed partition(s) in {runs} failed run(s)")
    return 0
