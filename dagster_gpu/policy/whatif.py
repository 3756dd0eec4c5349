"""What-if: print the plan for a backfill without launching anything.

    python -m dagster_gpu.policy.whatif CORPUS --snapshot snap.json [--rate-card ratecard.yaml]
        [--tag dagster-gpu/deadline-seconds=600 ...] [--history history.json] [--json] [--max-rows N]

CORPUS is a directory or an fsspec URL (``s3://bucket/prefix``); each file under it is one partition
(key = path relative to CORPUS without its suffix), its size in bytes the partition size. Each mode
(``auto`` = the policy, ``slurm``, ``kubernetes``) plans the partitions in key order on its own copy of
the snapshot, each placement consuming a free device or queueing behind the previous ones
(:func:`dagster_gpu.policy.snapshot.after_submit`). Prints backend + estimated cost per partition and
the totals of the three modes. ``whatif_main(argv)`` is the entry point the ``dagster-gpu`` CLI hooks.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.policy.placement import Placement
from dagster_gpu.policy.policy import NoFeasiblePlacement, decide
from dagster_gpu.policy.runtime import HistoryPoint, RuntimeModel, StepSize
from dagster_gpu.policy.snapshot import Snapshot, after_submit
from dagster_gpu.request import GpuRequest

MODES = ("auto", "slurm", "kubernetes")


@dataclass(frozen=True)
class PlanRow:
    """One partition's plan in one mode; ``placement`` None when infeasible (``error`` says why)."""

    partition: str
    size_bytes: int
    placement: Placement | None
    error: str = ""

    @property
    def cost_usd(self) -> float | None:
        a = self.placement.chosen if self.placement else None
        return a.cost_usd if a else None


def list_partitions(corpus: str) -> list[tuple[str, int]]:
    """``(partition key, size in bytes)`` for each file under ``corpus`` (local dir or fsspec URL), sorted."""
    if "://" not in corpus:
        root = Path(corpus)
        return sorted(
            (str(p.relative_to(root).with_suffix("")), p.stat().st_size) for p in root.rglob("*") if p.is_file()
        )
    import fsspec

    fs, path = fsspec.core.url_to_fs(corpus)
    out = []
    for name, info in fs.find(path, detail=True).items():
        if info.get("type", "file") == "file":
            rel = name[len(path):].lstrip("/")
            out.append((rel.rsplit(".", 1)[0] if "." in rel else rel, int(info.get("size") or 0)))
    return sorted(out)


def plan(
    partitions: Sequence[tuple[str, int]], request: GpuRequest, snapshot: Snapshot, model: RuntimeModel, mode: str
) -> list[PlanRow]:
    """Plan every partition in order under ``mode`` (``auto`` or a forced backend). Pure."""
    rows = []
    snap = snapshot
    for key, size in partitions:
        try:
            p = decide(request, StepSize(bytes=size), snap, model=model, force=None if mode == "auto" else mode)
        except NoFeasiblePlacement as e:
            rows.append(PlanRow(key, size, None, str(e)))
            continue
        rows.append(PlanRow(key, size, p))
        snap = after_submit(snap, p.backend, p.device, p.product)
    return rows


def _total(rows: list[PlanRow]) -> tuple[float, int, float]:
    """(total cost USD, infeasible count, latest finish s)."""
    cost = sum(r.cost_usd or 0.0 for r in rows)
    bad = sum(1 for r in rows if r.placement is None)
    fin = max((r.placement.chosen.finish_s for r in rows if r.placement and r.placement.chosen), default=0.0)
    return cost, bad, fin


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dagster-gpu whatif", description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", help="corpus directory or fsspec URL; one file per partition")
    ap.add_argument("--snapshot", required=True, help="snapshot JSON (Snapshot.to_json)")
    ap.add_argument("--rate-card", help="rate card YAML (default: the snapshot's, else the packaged one)")
    ap.add_argument("--tag", action="append", default=[], help="step tag KEY=VALUE (dagster-gpu/...)")
    ap.add_argument("--history", help="JSON list of HistoryPoint fields (rows, texts_per_second, bytes, ...)")
    ap.add_argument("--json", action="store_true", help="print the plan as JSON instead of tables")
    ap.add_argument("--max-rows", type=int, default=50, help="partitions shown in the table (default 50)")
    return ap


def whatif_main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code (0 ok, 2 bad input)."""
    args = _parser().parse_args(argv)
    try:
        tags = dict(t.split("=", 1) for t in args.tag)
        request = GpuRequest.from_tags(tags)
        rc = RateCard.load(args.rate_card) if args.rate_card else None
        snapshot = Snapshot.loads(Path(args.snapshot).read_text(), rate_card=rc)
        hist = [HistoryPoint(**h) for h in json.loads(Path(args.history).read_text())] if args.history else []
        partitions = list_partitions(args.corpus)
    except (ValueError, OSError, KeyError, TypeError) as e:
        print(f"whatif: {e}", file=sys.stderr)
        return 2
    model = RuntimeModel.from_history(hist)
    plans = {m: plan(partitions, request, snapshot, model, m) for m in MODES}
    if args.json:
        print(json.dumps({
            "runtime_model": model.source,
            "plans": {m: [{"partition": r.partition, "bytes": r.size_bytes, "error": r.error,
                           "placement": r.placement.to_json() if r.placement else None} for r in rows]
                      for m, rows in plans.items()},
            "totals_usd": {m: _total(rows)[0] for m, rows in plans.items()},
        }, indent=1))
        return 0
    _print_tables(plans, model, args.max_rows)
    return 0


def _print_tables(plans: dict[str, list[PlanRow]], model: RuntimeModel, max_rows: int) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    if not con.is_terminal:
        con = Console(width=160)
    t = Table(title=f"Plan (policy 'auto'); runtime from {model.source}")
    for col in ("partition", "MB", "backend", "device", "start s", "runtime s", "cost USD", "deadline"):
        t.add_column(col, justify="right" if col in ("MB", "start s", "runtime s", "cost USD") else "left")
    auto = plans["auto"]
    for r in auto[:max_rows]:
        a = r.placement.chosen if r.placement else None
        if a is None:
            t.add_row(r.partition, f"{r.size_bytes / 1e6:.1f}", "-", "-", "-", "-", "-", r.error[:60])
            continue
        t.add_row(
            r.partition, f"{r.size_bytes / 1e6:.1f}", a.backend, a.device or "", f"{a.start_delay_s:.0f}",
            f"{a.runtime_s:.0f}", f"{a.cost_usd:.4f}", "met" if r.placement.deadline_met else "MISS",
        )
    if len(auto) > max_rows:
        t.add_row(f"... {len(auto) - max_rows} more", "", "", "", "", "", "", "")
    con.print(t)
    s = Table(title=f"Totals over {len(auto)} partitions")
    for col in ("mode", "cost USD", "vs auto", "infeasible", "deadline misses", "last finish s", "backends"):
        s.add_column(col)
    base = _total(auto)[0]
    for m, rows in plans.items():
        cost, bad, fin = _total(rows)
        misses = sum(1 for r in rows if r.placement and not r.placement.deadline_met)
        counts: dict[str, int] = {}
        for r in rows:
            if r.placement:
                counts[r.placement.backend] = counts.get(r.placement.backend, 0) + 1
        s.add_row(
            "all-" + m if m != "auto" else "auto (policy)", f"{cost:.4f}",
            f"{cost / base:.2f}x" if base > 0 else "-", str(bad), str(misses), f"{fin:.0f}",
            ", ".join(f"{k}={v}" for k, v in sorted(counts.items())),
        )
    con.print(s)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(whatif_main())
