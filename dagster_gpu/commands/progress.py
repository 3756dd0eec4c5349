"""Terminal rendering (rich): backfill progress and the per-partition summary table."""

from __future__ import annotations

from typing import Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dagster_gpu.commands.backfill import (
    BackfillProgress, DaemonProcess, PartitionSummary, submit_asset_backfill, summarize_partitions, wait_for_backfill,
    wait_for_bills,
)
from dagster_gpu.instance.bills import billed_total
from dagster_gpu.instance.failures import FailureDetail, failure_detail


def progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def progress_detail(p: BackfillProgress) -> str:
    return f"ok {p.succeeded}  failed {p.failed}  running {p.running}  runs {p.runs}  [{p.status.lower()}]"


def useful_fraction(rows: Sequence[PartitionSummary]) -> float | None:
    """Embedding seconds ÷ billed wall seconds (``billing/wall_seconds``) summed over the materialized
    partitions (None when nothing was billed)."""
    embed = sum(r.seconds or 0.0 for r in rows if r.ok and r.billed_seconds)
    billed = sum(r.billed_seconds or 0.0 for r in rows if r.ok)
    return embed / billed if billed > 0 else None


def summary_table(rows: Sequence[PartitionSummary], title: str = "Per-partition summary") -> Table:
    """Columns: partition, rows, seconds, texts/s, backend, GPU-seconds, cost (USD) as measured, useful
    fraction, billed (USD): the partition's share of its unit's scheduler bill ("pending" until it lands;
    failed partitions have one too). Failures in red."""
    t = Table(title=title, show_footer=True)
    ok = [r for r in rows if r.ok]
    t.add_column("partition", footer=f"{len(ok)}/{len(rows)} ok")
    t.add_column("rows", justify="right", footer=str(sum(r.rows or 0 for r in ok)))
    t.add_column("seconds", justify="right", footer=f"{sum(r.seconds or 0 for r in ok):.1f}")
    t.add_column("texts/s", justify="right")
    t.add_column("backend")
    t.add_column("GPU-seconds", justify="right", footer=f"{sum(r.gpu_seconds or 0 for r in ok):.1f}")
    t.add_column("cost (USD)", justify="right", footer=f"{sum(r.cost_usd or 0 for r in ok):.6f}")
    uf = useful_fraction(rows)
    t.add_column("useful", justify="right", footer="" if uf is None else f"{uf:.2f}")
    t.add_column("billed (USD)", justify="right", footer=billed_total(rows))  # failed partitions' shares too
    for r in rows:
        billed = f"{r.billed_cost_usd:.6f}" if r.billed_cost_usd is not None else ("pending" if r.bill_pending else "")
        if r.ok:
            t.add_row(
                r.partition_key, str(r.rows), f"{r.seconds or 0:.2f}", f"{r.texts_per_second or 0:.1f}", r.backend or "",
                f"{r.gpu_seconds or 0:.2f}", f"{r.cost_usd or 0:.6f}",
                "" if r.useful_fraction is None else f"{r.useful_fraction:.2f}", billed,
            )
        else:
            t.add_row(f"[red]{r.partition_key}[/red]", "[red]failed[/red]", "", "", "", "", "", "", billed)
    return t


def failures_table(details: Sequence[FailureDetail]) -> Table:
    """Below the summary: each failed partition's key, run id, first line of the error, where the full log is."""
    t = Table(title=f"{len(details)} failed partition(s)", title_style="bold red", show_lines=True)
    t.add_column("partition", style="red", no_wrap=True)
    t.add_column("run id", no_wrap=True)
    t.add_column("error (first line)", overflow="fold")
    t.add_column("full log", overflow="fold")
    for d in details:
        t.add_row(d.partition_key, d.run_id or "–", d.error, d.log)
    return t


def print_summary(console: Console, instance, rows: Sequence[PartitionSummary], title: str) -> None:
    """The summary table, then the failed partitions (if any) with their run, error and log."""
    console.print(summary_table(rows, title=title))
    failed = [failure_detail(instance, r.partition_key, r.run_id, r.error) for r in rows if not r.ok]
    if failed:
        console.print(failures_table(failed))


def run_backfill_with_progress(
    instance,
    defs,
    asset_key,
    partition_keys: Sequence[str],
    workspace,
    *,
    title: str,
    timeout_s: float,
    daemon_log=None,
    console: Console | None = None,
    partitions_def_name: str | None = None,
    run_config=None,
    bills_wait_s: float = 60.0,
) -> list[PartitionSummary]:
    """Submit an asset backfill, run the daemon with a progress bar until it ends, print the summary.

    ``run_config`` applies to every run (e.g. ``{"execution": {"config": {"backend": "slurm", ...}}}``).
    After the runs end the daemon keeps running up to ``bills_wait_s`` seconds, until every work unit's
    scheduler bill has landed (:func:`dagster_gpu.commands.backfill.wait_for_bills`); stopping it at once would stop
    run workers still waiting for sacct. Returns the per-partition summary (see
    :func:`dagster_gpu.commands.backfill.summarize_partitions`).
    """
    console = console or Console()
    backfill_id = submit_asset_backfill(instance, defs, asset_key, partition_keys, title=title, run_config=run_config)
    console.print(f"Backfill [bold]{backfill_id}[/bold]: {len(partition_keys)} partitions of {asset_key.to_user_string()}")
    with DaemonProcess(workspace, log_file=daemon_log) as daemon, progress_bar(console) as bar:
        task = bar.add_task("backfill", total=len(partition_keys), detail="")
        final = wait_for_backfill(
            instance, backfill_id, len(partition_keys), timeout_s=timeout_s, daemon=daemon,
            on_progress=lambda p: bar.update(task, completed=p.done, detail=progress_detail(p)),
            partitions_def_name=partitions_def_name,
        )
        rows = summarize_partitions(instance, asset_key, partition_keys, backfill_id, partitions_def_name)
        pending = sum(r.bill_pending for r in rows)
        if pending and bills_wait_s > 0:
            console.print(f"Waiting up to {bills_wait_s:.0f} s for the schedulers' bills of {pending} partition(s)")
        rows = wait_for_bills(instance, asset_key, rows, timeout_s=bills_wait_s)
    print_summary(console, instance, rows, title=f"Backfill {backfill_id}: {final.status.lower()} in {final.runs} run(s)")
    uf = useful_fraction(rows)
    if uf is not None:
        console.print(f"Useful fraction (embedding seconds ÷ billed seconds, all partitions): {uf:.3f}")
    return rows
