"""Benchmark: ``dagster-gpu whatif``'s estimate of the demo backfill against what the same backfill then measured.

    .venv/bin/python bench/whatif_estimate.py [--history N] [--limit M]

1. The README's demo (local backend) embeds the first ``--history`` fortune files (default 12): the
   materializations whatif learns its runtime model from (rows per corpus byte, the CPU's texts/s).
2. ``dagster-gpu whatif -m pipelines.definitions --asset fortune_embeddings --json`` plans the whole corpus
   (the first ``--limit`` files, default all 43) on that instance: per partition, its share of its unit's
   estimated cost (USD; the CPU rate of ``resources/rate_card.yaml`` times the estimated seconds).
3. The demo then embeds the whole corpus on the same instance, and each new partition's materialization
   records what it measured (``billing/cost_usd``: measured seconds × the same rate; ``embedding/seconds``).

Compared over the partitions of step 3 that step 1 did not embed (a history partition is re-embedded with
every record reused, which whatif does not plan for): ``whatif.estimate_ratio_vs_measured`` = estimated
USD ÷ measured USD (1.0 = exact; the issue's bar: within 2×, 0.5–2.0), written to
bench/results/summary.json (whole corpus only) and, with the per-partition figures, to
bench/results/whatif_estimate.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO)]

from demo_span import run_demo  # noqa: E402
from summary import merge_summary  # noqa: E402
from trickle import materialization_times  # noqa: E402

ASSET = "fortune_embeddings"
PER_RUN = 50  # the demo's default: one work unit embeds up to 50 files


def whatif(work: Path) -> dict:
    """``dagster-gpu whatif --json`` on the demo's code location and instance (live local state)."""
    env = {**os.environ, "DAGSTER_HOME": str(work / f"home-{PER_RUN}"), "DAGSTER_GPU_CORPUS_URL": str(work / "corpus"),
           "DAGSTER_GPU_OUTPUT_URL": str(work / f"out-{PER_RUN}")}
    cp = subprocess.run([sys.executable, "-m", "dagster_gpu.commands.main", "whatif", "-m", "pipelines.definitions",
                         "--asset", ASSET, "--json"], cwd=REPO, env=env, capture_output=True, text=True)
    if cp.returncode != 0:
        sys.exit(f"whatif failed ({cp.returncode}):\n{cp.stderr[-3000:]}")
    return json.loads(cp.stdout)


def measured(work: Path) -> dict[str, dict]:
    """Partition -> its latest materialization's metadata (plain values), from the demo's instance."""
    return {pk: mats[-1][1] for pk, mats in materialization_times(work / f"home-{PER_RUN}", ASSET).items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--history", type=int, default=12, help="fortune files embedded before whatif plans")
    ap.add_argument("--limit", type=int, default=None, help="plan and embed only the first N files (default: all)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dagster-gpu-whatif-bench-"))
    first = run_demo(PER_RUN, work, a.history)
    history = set(measured(work))
    from pipelines.demo import prepare_corpus

    prepare_corpus(work / "corpus", limit=a.limit)  # the files step 3 embeds, listed by whatif
    doc = whatif(work)
    estimate = {r["partition"]: r["cost_usd"] for r in doc["plans"]["auto"] if r["cost_usd"] is not None}
    backends = sorted({r["placement"]["backend"] for r in doc["plans"]["auto"] if r["placement"]})
    second = run_demo(PER_RUN, work, a.limit)
    mds = measured(work)
    new = sorted(pk for pk in mds if pk not in history and pk in estimate)
    if not new:
        sys.exit(f"no partition both planned and newly measured (history {len(history)}, planned {len(estimate)})")
    est_usd = sum(estimate[pk] for pk in new)
    meas_usd = sum(mds[pk]["billing/cost_usd"] for pk in new)
    per_partition = {pk: {"estimate_usd": estimate[pk], "measured_usd": mds[pk]["billing/cost_usd"],
                          "measured_embedding_s": mds[pk]["embedding/seconds"],
                          "ratio": estimate[pk] / mds[pk]["billing/cost_usd"]} for pk in new}
    ratios = [p["ratio"] for p in per_partition.values()]
    figures = {"whatif.estimate_ratio_vs_measured": round(est_usd / meas_usd, 3)}
    result = {
        "history_partitions": len(history), "compared_partitions": len(new), "planned_backends": backends,
        "runtime_model": doc["runtime_model"], "estimate_usd": est_usd, "measured_usd": meas_usd,
        "per_partition_ratio_median": round(statistics.median(ratios), 3),
        "per_partition_ratio_min": round(min(ratios), 3), "per_partition_ratio_max": round(max(ratios), 3),
        "within_2x": sum(0.5 <= r <= 2.0 for r in ratios), "history_span_s": first["span_s"], "all_span_s": second["span_s"],
        **figures,
    }
    print(json.dumps(result, indent=1))
    (REPO / "bench" / "results" / "whatif_estimate.json").write_text(
        json.dumps({**result, "per_partition": per_partition}, indent=1) + "\n")
    if a.limit is None:
        merge_summary(figures)


if __name__ == "__main__":
    main()
