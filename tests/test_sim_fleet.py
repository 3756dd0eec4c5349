"""The simulator over fleets of three and four named clusters: the real fleet policy and its waiting budgets
against each cluster alone and the exact oracle (dagster_gpu.sim.fleet_scenarios)."""

import pytest

from dagster_gpu.sim.compare import compare
from dagster_gpu.sim.engine import simulate
from dagster_gpu.sim.fleet_scenarios import fleet_loads, fleet_outage, fleet_outage_announced, fleet_prices, fleet_spill
from dagster_gpu.sim.policies import OursFleet


@pytest.mark.parametrize("make", [fleet_prices, fleet_loads, fleet_outage_announced, fleet_spill])
def test_ours_matches_the_exact_oracle_where_the_future_is_known(make):
    c = compare(make(), fleet=True)
    assert c.oracle.kind == "exact"
    assert c.figures["ours"].deadline_misses == c.oracle.deadline_misses == 0
    assert c.ratio == pytest.approx(1.0)


def test_an_unannounced_outage_costs_what_the_oracle_saves_by_knowing_its_end():
    # dept (0.6 USD/GPU-h) is down for an hour, unannounced: ours sends everything to campus (0.9); the oracle
    # holds the 3 batch steps for dept's return
    c = compare(fleet_outage(), fleet=True)
    assert dict(c.figures["ours"].by_backend) == {"campus": 6}
    assert c.oracle.deadline_misses == 0 and c.ratio == pytest.approx(1.2, abs=1e-3)


def test_prices_and_queues_spread_a_workload_over_the_fleet():
    c = compare(fleet_loads(), fleet=True)
    # dept busy 2 h, campus half busy 1 h: steps due in 30 min use all three clusters, none misses
    assert dict(c.figures["ours"].by_backend) == {"campus": 3, "cloud": 2, "dept": 1}
    assert c.figures["always-dept"].deadline_misses == 5 and c.figures["always-campus"].deadline_misses == 3
    # all idle: the 1-GPU dept (0.6) takes the batch steps, campus (0.9) the two due ones dept cannot finish in time
    assert dict(compare(fleet_prices(), fleet=True).figures["ours"].by_backend) == {"campus": 2, "dept": 4}


def test_units_over_their_budget_spill_over_once_and_run_once():
    sc = fleet_spill(budget_s=600.0)
    pol = OursFleet()
    r = simulate(sc, pol)
    # steps 1-3 queued on dept behind 900 s foreign jobs; dept's controller stops at 600 s; each is withdrawn
    # when its 600 s budget ends and goes to campus (next cheapest, idle)
    assert r.spills == [(1, "dept", "campus", 660.0), (2, "dept", "campus", 720.0), (3, "dept", "campus", 780.0)]
    for t in sc.tasks:
        segs = [s for s in r.segments if t.id in s.tasks]
        assert len(segs) == 1 and segs[0].completed  # ran once, nowhere else
        assert segs[0].cluster == ("dept" if t.id == 0 else "campus")
    assert not any(o.missed for o in r.outcomes.values())
    spilled = [d for d in pol.decisions if hasattr(d, "spill") and d.spill]
    assert spilled[0].reason.startswith("waited 600 s, over its 600 s budget on dept: spills over to campus")
    # without spill-over the three wait out the two-hour outage and miss their deadline
    stay = simulate(sc, OursFleet("ours-no-spill", spill_over=False))
    assert stay.spills == [] and sum(o.missed for o in stay.outcomes.values()) == 3


def test_a_unit_still_on_time_where_it_waits_does_not_spill_again():
    # step 3 waits on campus behind steps 1 and 2 past its budget, but campus still delivers within the deadline
    r = simulate(fleet_spill(budget_s=600.0), OursFleet())
    assert [s for s in r.spills if s[1] == "campus"] == []
