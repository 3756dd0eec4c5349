"""Scenario suite: every policy side by side, our cost ÷ the oracle's, the article's scenario and PNGs.

    .venv/bin/python bench/sim_suite.py [--out bench/] [--article-tasks 1000]

Prints markdown tables (paste into bench/RESULTS.md) and writes bench/sim_article.png and
bench/sim_suite.png.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dagster_gpu.sim.compare import compare  # noqa: E402
from dagster_gpu.sim.plot import plot_comparison, plot_suite  # noqa: E402
from dagster_gpu.sim.scenarios import article, suite  # noqa: E402

POLS = ["slurm-arrays", "k8s-resident", "k8s-dra", "ours"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent))
    ap.add_argument("--article-tasks", type=int, default=1000)
    a = ap.parse_args(argv)
    out = Path(a.out)
    t0 = time.perf_counter()
    art = compare(article(a.article_tasks))
    plot_comparison(art, out / "sim_article.png")
    f = art.figures
    print(f"### Article scenario: {art.scenario.description}\n")
    print("| policy | GPU busy | billed GPU-h | cost USD | makespan h | misses |")
    print("|---|---|---|---|---|---|")
    for p in POLS:
        x = f[p]
        print(f"| {p} | {x.busy_fraction:.1%} | {x.billed_gpu_hours:.1f} | {x.cost_usd:.2f} | "
              f"{x.makespan_s / 3600:.2f} | {x.deadline_misses} |")
    print(f"| oracle ({art.oracle.kind}) | | | {art.oracle.cost_usd:.2f} | | {art.oracle.deadline_misses} |")
    saved = 1 - f["slurm-arrays"].billed_gpu_hours / f["k8s-resident"].billed_gpu_hours
    print("\n| claim (article) | ours |")
    print("|---|---|")
    print(f"| arrays ≈100 % busy | {f['slurm-arrays'].busy_fraction:.1%} busy |")
    print(f"| resident 15–25 % busy | {f['k8s-resident'].busy_fraction:.1%} busy |")
    print(f"| arrays ≈60 % fewer billed GPU-hours than resident | {saved:.1%} fewer |")
    cmps = [compare(sc) for sc in suite()]
    plot_suite(cmps, out / "sim_suite.png")
    print("\n### Suite (cost USD; misses in brackets)\n")
    print("| scenario | " + " | ".join(POLS) + " | oracle | ours ÷ oracle | misses oracle avoids |")
    print("|---|" + "---|" * (len(POLS) + 3))
    for c in cmps:
        cells = [f"{c.figures[p].cost_usd:.3f} ({c.figures[p].deadline_misses})" if p in c.figures else "-" for p in POLS]
        print(f"| {c.scenario.name} | " + " | ".join(cells) +
              f" | {c.oracle.cost_usd:.3f} ({c.oracle.deadline_misses}) {c.oracle.kind} | {c.ratio:.3f} | "
              f"{c.misses_oracle_avoids} |")
    print("\n| scenario | what | ours: busy, billed GPU-h, makespan s, placements |")
    print("|---|---|---|")
    for c in cmps:
        o = c.figures["ours"]
        print(f"| {c.scenario.name} | {c.scenario.description} | {o.busy_fraction:.0%}, {o.billed_gpu_hours:.2f}, "
              f"{o.makespan_s:.0f}, {dict(o.by_backend)} |")
    print(f"\n(ran in {time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
