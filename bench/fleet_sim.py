"""Fleet scenarios (three and four named clusters): every policy side by side, our cost ÷ the exact oracle's.

    .venv/bin/python bench/fleet_sim.py [--no-summary]

Policies: each cluster alone (``always-<cluster>``), ours without spill-over, ours (placement over the fleet and
waiting budgets). Prints a markdown table (paste into docs/benchmarks.md) and merges ``fleet.cost_vs_oracle_worst``,
``fleet.sim_spills`` and ``fleet.sim_misses_avoided_by_spill`` into bench/results/summary.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dagster_gpu.sim.compare import compare  # noqa: E402
from dagster_gpu.sim.fleet_scenarios import fleet_suite  # noqa: E402
from summary import merge_summary  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-summary", action="store_true", help="do not write bench/results/summary.json")
    args = ap.parse_args(argv)
    t0 = time.time()
    rows, ratios, spills, avoided = [], {}, 0, 0
    print("| scenario | clusters | ours USD (misses) | no spill-over USD (misses) | cheapest single cluster USD (misses) "
          "| oracle USD (misses, mode) | ours ÷ oracle | spills |")
    print("|---|---|---|---|---|---|---|---|")
    for sc in fleet_suite():
        c = compare(sc, fleet=True)
        f, ns = c.figures["ours"], c.figures["ours-no-spill"]
        single = min((v for k, v in c.figures.items() if k.startswith("always-")), key=lambda v: (v.deadline_misses, v.cost_usd))
        n_spills = len(c.results["ours"].spills)
        spills += n_spills
        avoided += max(0, ns.deadline_misses - f.deadline_misses)
        ratios[sc.name] = c.ratio
        print(f"| {sc.name} | {len(sc.clusters)} | {f.cost_usd:.4f} ({f.deadline_misses}) | {ns.cost_usd:.4f} "
              f"({ns.deadline_misses}) | {single.policy}: {single.cost_usd:.4f} ({single.deadline_misses}) | "
              f"{c.oracle.cost_usd:.4f} ({c.oracle.deadline_misses}, {c.oracle.kind}) | {c.ratio:.3f} | {n_spills} |")
    worst = max(ratios.values())
    print(f"\nworst ours ÷ oracle {worst:.3f} ({max(ratios, key=ratios.get)}); {spills} spill(s), "
          f"{avoided} deadline miss(es) avoided by spilling; {time.time() - t0:.1f} s")
    if not args.no_summary:
        merge_summary({"fleet.cost_vs_oracle_worst": round(worst, 4), "fleet.sim_spills": spills,
                       "fleet.sim_misses_avoided_by_spill": avoided, "fleet.sim_scenarios": len(ratios)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
