"""Work units in the simulator (issue 8), worked out by hand, and the calibration file the scenarios read."""

import json

import pytest

from dagster_gpu.policy.runtime import RuntimeModel
from dagster_gpu.sim.calibration import DEFAULT_PATH, load_calibration
from dagster_gpu.sim.engine import simulate
from dagster_gpu.sim.metrics import figures, timeline
from dagster_gpu.sim.model import Preemption, Task
from dagster_gpu.sim.policies import AlwaysBackend, Ours
from dagster_gpu.sim.scenarios import calibration, k8s as sk8s, local as slocal, model as smodel, slurm as sslurm
from test_sim import RC, k8s, sc, slurm  # noqa: E402  (tests/ is on sys.path under pytest)

# rows / 100 = seconds of work on a full GPU; each partition adds 1 s inside a unit
UNIT_MODEL = RuntimeModel(texts_per_second=100.0, n_history=1, per_partition_s=1.0)


def ranged(work_s, run=0, deadline=None):
    return [Task(i, int(w * 100), 0.0, deadline, run=run) for i, w in enumerate(work_s)]


def test_one_unit_pays_one_start_up():
    s = sc([slurm(1)], ranged([50, 100, 30]), model=UNIT_MODEL)
    r = simulate(s, AlwaysBackend("slurm"))
    # one unit, largest first: ready 5, start-up 20, then 1 + 100, 1 + 50, 1 + 30 -> 5..208
    (g,) = r.segments
    assert (g.start_s, g.end_s, g.completed, g.tasks) == (5.0, 208.0, True, (1, 0, 2))
    assert g.useful_s == 180.0 and g.work_spans == ((26.0, 126.0), (127.0, 177.0), (178.0, 208.0))
    assert {i: o.end_s for i, o in r.outcomes.items()} == {1: 126.0, 0: 177.0, 2: 208.0}
    f = figures(r, RC)
    assert f.billed_gpu_hours == pytest.approx(203 / 3600) and f.busy_fraction == pytest.approx(180 / 203)
    # per-partition runs of the same work: three start-ups
    s1 = sc([slurm(1)], [Task(t.id, t.rows) for t in ranged([50, 100, 30])], model=UNIT_MODEL)
    assert figures(simulate(s1, AlwaysBackend("slurm")), RC).billed_gpu_hours == pytest.approx((3 * 21 + 180) / 3600)
    t, busy, held = timeline(r, 100.0, 200.0)
    # busy: 26..100 | 100..126 + 127..177 + 178..200 | 200..208; held 5..208
    assert busy == pytest.approx([0.74, 0.98, 0.08]) and held == pytest.approx([0.95, 1.0, 0.08])


def test_units_spread_over_the_pool_largest_first():
    s = sc([slurm(2)], ranged([50, 100, 30]), model=UNIT_MODEL)
    r = simulate(s, AlwaysBackend("slurm"))
    # capacity 2: unit 0 = [100], unit 1 = [50, 30]; both ready at 5
    assert [(g.tasks, g.start_s, g.end_s) for g in r.segments] == [((0, 2), 5.0, 107.0), ((1,), 5.0, 126.0)]


def test_preemption_keeps_finished_partitions_and_requeues_the_rest():
    s = sc([slurm(1, preemptions=(Preemption(150.0, 30.0),))], ranged([100, 50, 30]), model=UNIT_MODEL)
    r = simulate(s, AlwaysBackend("slurm"))
    # partition 0 done at 126; preempted at 150 (partition 1 lost); preemptor 150..180; the rest
    # [1, 2] ready at 155, restart 180 with a new start-up: 180 + 20 + 51 + 31 = 282
    a, b = r.segments
    assert (a.start_s, a.end_s, a.completed, a.useful_s, a.tasks) == (5.0, 150.0, False, 100.0, (0, 1, 2))
    assert (b.start_s, b.end_s, b.completed, b.useful_s, b.tasks) == (180.0, 282.0, True, 80.0, (1, 2))
    assert {i: o.end_s for i, o in r.outcomes.items()} == {0: 126.0, 1: 251.0, 2: 282.0}
    f = figures(r, RC)
    assert f.billed_gpu_hours == pytest.approx((145 + 102) / 3600) and f.busy_fraction == pytest.approx(180 / 247)


def test_ours_plans_the_range_and_meets_deadlines_by_spilling():
    # due in 200 s on 1 Slurm + 1 Kubernetes GPU: Slurm unit [150] ends 5 + 20 + 151 = 176; the 60 s
    # partition would end at 237 there, so it gets a Kubernetes unit (10 + 30 + 61 = 101)
    s = sc([slurm(1), k8s(1)], ranged([60, 150], deadline=200.0), model=UNIT_MODEL)
    r = simulate(s, Ours())
    assert {i: (o.cluster, o.end_s) for i, o in r.outcomes.items()} == {1: ("slurm", 176.0), 0: ("kubernetes", 101.0)}
    assert figures(r, RC).cost_usd == pytest.approx(1.2 * 171 / 3600 + 2.4 * 91 / 3600)


def test_runs_must_share_arrival_and_request():
    tasks = [Task(0, 100, 0.0, run=1), Task(1, 100, 5.0, run=1)]
    with pytest.raises(ValueError, match="run 1 mixes arrival times"):
        sc([slurm(1)], tasks).runs()


def test_scenarios_read_the_recorded_calibration():
    d = json.loads(DEFAULT_PATH.read_text())
    cal = calibration()
    assert (cal.unit_startup_s, cal.per_partition_s) == (d["unit_startup_s"], d["per_partition_s"])
    assert cal.unit_startup_s > 0 and cal.per_partition_s > 0
    for c in (sslurm(1), sk8s(1), slocal(1)):
        assert c.billed_overhead_s == cal.unit_startup_s
    assert smodel().per_partition_s == cal.per_partition_s


def test_calibration_errors_name_the_file_and_key(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.json: no unit calibration; run"):
        load_calibration(tmp_path / "missing.json")
    p = tmp_path / "u.json"
    p.write_text('{"unit_startup_s": 3.5, "per_partition_s": -1}')
    with pytest.raises(ValueError, match=r"u.json: 'per_partition_s' must be a finite number >= 0"):
        load_calibration(p)
    p.write_text("{nope")
    with pytest.raises(ValueError, match="u.json: not JSON"):
        load_calibration(p)
    p.write_text('{"unit_startup_s": 3.5, "per_partition_s": 0.25, "measured_at": "2026-01-01T00:00:00Z"}')
    c = load_calibration(p)
    assert (c.unit_startup_s, c.per_partition_s) == (3.5, 0.25) and "2026-01-01" in c.source
