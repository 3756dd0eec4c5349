"""Scenario suite: every policy side by side, our cost ÷ the oracle's, the article's scenario and PNGs.

    .venv/bin/python bench/sim_suite.py [--out bench/] [--article-tasks 1000] [--no-summary]

Each scenario runs twice with the same calibrated work-unit costs (``bench/results/unit_startup.json``):
*per-partition runs* (every partition a run and a unit of its own, as in issue 5) and *ranged runs*
(a backfill's partitions arrive as ranged runs whose partitions the units share, issue 8). Prints
markdown tables (paste into docs/benchmarks.md), writes bench/sim_article.png and bench/sim_suite.png
(ranged runs) and merges ``sim.ascending_cost_ratio`` (ranged) into bench/results/summary.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dagster_gpu.sim.compare import compare  # noqa: E402
from dagster_gpu.sim.plot import plot_comparison, plot_suite  # noqa: E402
from dagster_gpu.sim.scenarios import article, calibration, suite  # noqa: E402
from summary import merge_summary  # noqa: E402

POLS = ["slurm-arrays", "k8s-resident", "k8s-dra", "ours"]


def _article_tables(per, rng) -> None:
    print(f"### Article scenario: {rng.scenario.description}\n")
    print("| policy | GPU busy (per-partition → ranged) | billed GPU-h | cost USD | makespan h | misses |")
    print("|---|---|---|---|---|---|")
    for p in POLS:
        a, b = per.figures[p], rng.figures[p]
        print(f"| {p} | {a.busy_fraction:.1%} → {b.busy_fraction:.1%} | {a.billed_gpu_hours:.1f} → "
              f"{b.billed_gpu_hours:.1f} | {a.cost_usd:.2f} → {b.cost_usd:.2f} | {a.makespan_s / 3600:.2f} → "
              f"{b.makespan_s / 3600:.2f} | {a.deadline_misses} → {b.deadline_misses} |")
    print(f"| oracle ({per.oracle.kind}) | | | {per.oracle.cost_usd:.2f} → {rng.oracle.cost_usd:.2f} | | "
          f"{per.oracle.deadline_misses} → {rng.oracle.deadline_misses} |")
    f = rng.figures
    saved = 1 - f["slurm-arrays"].billed_gpu_hours / f["k8s-resident"].billed_gpu_hours
    saved0 = 1 - per.figures["slurm-arrays"].billed_gpu_hours / per.figures["k8s-resident"].billed_gpu_hours
    print("\n| claim (article) | per-partition runs | ranged runs |")
    print("|---|---|---|")
    print(f"| arrays ≈100 % busy | {per.figures['slurm-arrays'].busy_fraction:.1%} | "
          f"{f['slurm-arrays'].busy_fraction:.1%} |")
    print(f"| resident 15–25 % busy | {per.figures['k8s-resident'].busy_fraction:.1%} | "
          f"{f['k8s-resident'].busy_fraction:.1%} |")
    print(f"| arrays ≈60 % fewer billed GPU-hours than resident | {saved0:.1%} fewer | {saved:.1%} fewer |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent))
    ap.add_argument("--article-tasks", type=int, default=1000)
    ap.add_argument("--no-summary", action="store_true", help="do not write bench/results/summary.json")
    a = ap.parse_args(argv)
    out = Path(a.out)
    t0 = time.perf_counter()
    cal = calibration()
    print(f"Calibration ({cal.source}): unit start-up {cal.unit_startup_s:.2f} s, "
          f"per partition {cal.per_partition_s:.3f} s\n")
    per_art = compare(article(a.article_tasks, ranged=False))
    art = compare(article(a.article_tasks))
    plot_comparison(art, out / "sim_article.png")
    _article_tables(per_art, art)
    per = [compare(sc) for sc in suite(ranged=False)]
    cmps = [compare(sc) for sc in suite()]
    plot_suite(cmps, out / "sim_suite.png")
    print("\n### Suite, ranged runs (cost USD; misses in brackets)\n")
    print("| scenario | " + " | ".join(POLS) + " | oracle | ours ÷ oracle | misses oracle avoids |")
    print("|---|" + "---|" * (len(POLS) + 3))
    for c in cmps:
        cells = [f"{c.figures[p].cost_usd:.3f} ({c.figures[p].deadline_misses})" if p in c.figures else "-" for p in POLS]
        print(f"| {c.scenario.name} | " + " | ".join(cells) +
              f" | {c.oracle.cost_usd:.3f} ({c.oracle.deadline_misses}) {c.oracle.kind} | {c.ratio:.3f} | "
              f"{c.misses_oracle_avoids} |")
    print("\n### Ours ÷ oracle: per-partition runs → ranged runs (same calibration)\n")
    print("| scenario | runs (ranged) | per-partition runs | ranged runs | ours cost USD | misses oracle avoids |")
    print("|---|---|---|---|---|---|")
    for p, c in zip(per, cmps):
        print(f"| {c.scenario.name} | {len(c.scenario.runs())} | {p.ratio:.3f} | {c.ratio:.3f} | "
              f"{p.figures['ours'].cost_usd:.3f} → {c.figures['ours'].cost_usd:.3f} | "
              f"{p.misses_oracle_avoids} → {c.misses_oracle_avoids} |")
    print("\n| scenario | what | ours (ranged): busy, billed GPU-h, makespan s, placements |")
    print("|---|---|---|")
    for c in cmps:
        o = c.figures["ours"]
        print(f"| {c.scenario.name} | {c.scenario.description} | {o.busy_fraction:.0%}, {o.billed_gpu_hours:.2f}, "
              f"{o.makespan_s:.0f}, {dict(o.by_backend)} |")
    asc = next(c for c in cmps if c.scenario.name == "heterogeneous-sizes-ascending")
    if not a.no_summary:
        merge_summary({"sim.ascending_cost_ratio": round(asc.ratio, 4)})
        print(f"\nsummary.json: sim.ascending_cost_ratio = {asc.ratio:.4f}")
    print(f"\n(ran in {time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
