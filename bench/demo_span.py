"""Benchmark: the README's first command (the fortunes demo backfill, local backend) in ranged runs against
one run per partition, side by side in one command.

    .venv/bin/python bench/demo_span.py [--limit N]

Runs ``python -m pipelines.demo`` twice on the same corpus, each with a fresh instance and output directory:
``--per-run 1`` (one run, worker and model load per partition: the path before ranged runs) and the default
(runs of 50 partitions: one work unit embeds up to 50 files). Prints each backfill's span (submit to last run
finished), the useful fraction (embedding seconds ÷ measured seconds), the speedup of the span, and writes
``demo.useful_fraction`` and ``demo.speedup`` to bench/results/summary.json (whole corpus only).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from summary import merge_summary  # noqa: E402


def run_demo(per_run: int, work: Path, limit: int | None) -> dict:
    home, out, summary = work / f"home-{per_run}", work / f"out-{per_run}", work / f"summary-{per_run}.json"
    cmd = [sys.executable, "-m", "pipelines.demo", "--home", str(home), "--output", str(out), "--corpus", str(work / "corpus"),
           "--per-run", str(per_run), "--summary-json", str(summary)]
    if limit:
        cmd += ["--limit", str(limit)]
    cp = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if cp.returncode != 0:
        sys.exit(f"demo with --per-run {per_run} failed ({cp.returncode}); log under {home}:\n{cp.stdout[-3000:]}\n{cp.stderr[-3000:]}")
    return json.loads(summary.read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=None, help="only the first N fortune files")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dagster-gpu-demo-bench-"))
    per_partition = run_demo(1, work, a.limit)
    print(json.dumps({"variant": "per_partition", **per_partition}), flush=True)
    ranged = run_demo(50, work, a.limit)
    print(json.dumps({"variant": "ranged", **ranged}), flush=True)
    figures = {"demo.useful_fraction": round(ranged["useful_fraction"], 3),
               "demo.speedup": round(per_partition["span_s"] / ranged["span_s"], 2)}
    print(json.dumps({**figures, "demo.per_partition_useful_fraction": round(per_partition["useful_fraction"], 3)}))
    (REPO / "bench" / "results" / "demo_span.json").write_text(
        json.dumps({"per_partition": per_partition, "ranged": ranged, "summary": figures}, indent=1) + "\n")
    if a.limit is None:
        merge_summary(figures)


if __name__ == "__main__":
    main()
