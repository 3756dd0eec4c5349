"""The oracle (exact and lower bound) and the side-by-side comparison, on hand-checkable instances."""

import pytest

from dagster_gpu.sim.compare import compare
from dagster_gpu.sim.oracle import lower_bound, search
from dagster_gpu.sim.scenarios import article, suite
from test_sim import k8s, sc, slurm, task  # noqa: E402  (tests/ is on sys.path under pytest)


def test_exact_oracle_by_hand():
    # Slurm 1 GPU, Kubernetes 1 GPU; two 100 s steps due in 200 s. Both on Slurm: the second ends 245 -> miss.
    # Best: one each = 1.2*120/3600 + 2.4*130/3600 = 0.04 + 0.08667
    s = sc([slurm(1), k8s(1)], [task(0, 100, deadline=200.0), task(1, 100, deadline=200.0)])
    o = search(s)
    assert o.kind == "exact" and o.deadline_misses == 0
    assert o.cost_usd == pytest.approx(1.2 * 120 / 3600 + 2.4 * 130 / 3600)
    assert sorted(v[0] for v in o.assignment.values()) == ["kubernetes", "slurm"]


def test_lower_bound_by_hand():
    # one step due in 100 s: no option finishes in time (Slurm 125, Kubernetes 140) -> 1 miss, cheapest cost
    s = sc([slurm(1), k8s(1)], [task(0, 100, deadline=100.0), task(1, 10)])
    lb = lower_bound(s)
    assert lb.kind == "lower-bound" and lb.deadline_misses == 1
    assert lb.cost_usd == pytest.approx(1.2 * 120 / 3600 + 1.2 * 30 / 3600)


def test_oracle_never_worse_than_ours_and_falls_back_when_too_big():
    s = sc([slurm(1), k8s(1)], [task(i, 100, at=10.0 * i, deadline=300.0) for i in range(4)])
    c = compare(s)
    assert c.oracle.kind == "exact" and c.oracle.cost_usd <= c.figures["ours"].cost_usd + 1e-12
    assert search(s, max_leaves=1).kind == "lower-bound"


def test_article_scenario_figures():
    c = compare(article(n_tasks=100, gpus=10))
    f = c.figures
    # arrays: 216 s work per 236 s held; resident: 10 GPUs x 24 h for 100 x 216 s of work
    assert f["slurm-arrays"].busy_fraction == pytest.approx(216 / 236)
    assert f["k8s-resident"].billed_gpu_hours == pytest.approx(240.0)
    assert f["k8s-resident"].busy_fraction == pytest.approx(100 * 216 / (240 * 3600))
    assert f["ours"].cost_usd == pytest.approx(f["slurm-arrays"].cost_usd)
    assert c.oracle.kind == "lower-bound" and c.ratio == pytest.approx(1.0)


def test_suite_targets():
    rows = {c.scenario.name: c for c in (compare(s) for s in suite())}
    assert len(rows) >= 8
    for name, c in rows.items():
        assert c.oracle.kind == "exact", name
        assert c.misses_oracle_avoids == 0, name
        if name not in ("backend-outage", "heterogeneous-sizes-ascending"):
            assert c.ratio <= 1.05, (name, c.ratio)
    # known gaps, asserted so a change shows: an unannounced outage's end is unknown to the policy, and
    # deciding one step at a time, smallest first, leaves the large late steps to the dearer backend
    assert rows["backend-outage"].ratio == pytest.approx(2.52 / 1.88, rel=1e-3)
    assert rows["heterogeneous-sizes-ascending"].ratio > 1.05
