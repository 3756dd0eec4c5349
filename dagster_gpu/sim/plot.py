"""PNG of one comparison: a utilization timeline per policy (busy vs billed GPU-equivalents) and cost bars.

matplotlib with the Agg backend (no display needed). The only I/O of the simulator: writing the file.
"""

from __future__ import annotations

from pathlib import Path

from dagster_gpu.sim.compare import Comparison
from dagster_gpu.sim.metrics import timeline


def plot_comparison(cmp: Comparison, path: str | Path, bins: int = 200) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(cmp.figures)
    end = max(max((s.end_s for s in r.segments), default=0.0) for r in cmp.results.values())
    end = max(end, max((h[4] for r in cmp.results.values() for h in r.held), default=0.0))
    step = max(1.0, end / bins)
    fig, axes = plt.subplots(len(names) + 1, 1, figsize=(10, 2.2 * (len(names) + 1)), constrained_layout=True)
    for ax, name in zip(axes, names):
        t, busy, held = timeline(cmp.results[name], step, end)
        hours = [x / 3600 for x in t]
        ax.fill_between(hours, held, step="post", alpha=0.3, label="billed (held) GPUs")
        ax.fill_between(hours, busy, step="post", alpha=0.8, label="busy GPUs")
        f = cmp.figures[name]
        ax.set_title(f"{name}: busy {f.busy_fraction:.0%} of {f.billed_gpu_hours:.1f} billed GPU-h, "
                     f"{f.cost_usd:.2f} USD, {f.deadline_misses} misses", fontsize=9)
        ax.set_ylabel("GPUs")
        ax.set_xlim(0, end / 3600)
        ax.legend(loc="upper right", fontsize=7)
    axes[-2].set_xlabel("hours")
    ax = axes[-1]
    costs = [cmp.figures[n].cost_usd for n in names] + [cmp.oracle.cost_usd]
    labels = names + [f"oracle ({cmp.oracle.kind})"]
    ax.bar(labels, costs, color=["C0", "C1", "C2", "C3", "C7"][: len(labels)])
    for i, c in enumerate(costs):
        ax.text(i, c, f"{c:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("cost USD")
    ax.set_title(f"{cmp.scenario.name}: cost per policy", fontsize=9)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return Path(path)


def plot_suite(cmps: list[Comparison], path: str | Path) -> Path:
    """Cost of each policy ÷ the oracle's, per scenario (grouped bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pols = ["slurm-arrays", "k8s-resident", "k8s-dra", "ours"]
    fig, ax = plt.subplots(figsize=(12, 4.5), constrained_layout=True)
    w = 0.2
    for j, p in enumerate(pols):
        xs = [i + (j - 1.5) * w for i in range(len(cmps))]
        ys = [c.figures[p].cost_usd / c.oracle.cost_usd if p in c.figures and c.oracle.cost_usd else 0 for c in cmps]
        ax.bar(xs, ys, w, label=p)
    ax.axhline(1.05, color="k", ls="--", lw=0.8, label="target 1.05x")
    ax.set_xticks(range(len(cmps)), [c.scenario.name for c in cmps], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("cost / oracle")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return Path(path)
