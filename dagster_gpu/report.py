"""Terminal rendering (rich): backfill progress and the per-partition summary table."""

from __future__ import annotations

from typing import Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dagster_gpu.backfill import BackfillProgress, PartitionSummary


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
    return f"ok {p.succeeded}  failed {p.failed}  running {p.running}  [{p.status.lower()}]"


def summary_table(rows: Sequence[PartitionSummary], title: str = "Per-partition summary") -> Table:
    """Columns: partition, rows, seconds, texts/s, backend, GPU-seconds, cost (USD); failures in red."""
    t = Table(title=title, show_footer=True)
    ok = [r for r in rows if r.ok]
    t.add_column("partition", footer=f"{len(ok)}/{len(rows)} ok")
    t.add_column("rows", justify="right", footer=str(sum(r.rows or 0 for r in ok)))
    t.add_column("seconds", justify="right", footer=f"{sum(r.seconds or 0 for r in ok):.1f}")
    t.add_column("texts/s", justify="right")
    t.add_column("backend")
    t.add_column("GPU-seconds", justify="right", footer=f"{sum(r.gpu_seconds or 0 for r in ok):.1f}")
    t.add_column("cost (USD)", justify="right", footer=f"{sum(r.cost_usd or 0 for r in ok):.6f}")
    for r in rows:
        if r.ok:
            t.add_row(
                r.partition_key, str(r.rows), f"{r.seconds or 0:.2f}", f"{r.texts_per_second or 0:.1f}", r.backend or "",
                f"{r.gpu_seconds or 0:.2f}", f"{r.cost_usd or 0:.6f}",
            )
        else:
            t.add_row(f"[red]{r.partition_key}[/red]", "[red]failed[/red]", "", "", "", "", f"[red]{(r.error or '')[:60]}[/red]")
    return t
