"""The fleet's config and the cost policy over several named clusters (dagster_gpu.fleet), on hand-built states."""

import pytest

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.fleet import (
    ClusterState, FleetConfigError, FleetSnapshot, decide_fleet, fleet_from_config, fleet_rate_card, spill_decision,
)
from dagster_gpu.fleet.budget import waiting_budget_s
from dagster_gpu.policy import (
    DeviceGroup, GpuRequest, KubernetesState, LocalState, NoFeasiblePlacement, Placement, RuntimeModel, SlurmState,
    Snapshot, StepSize, decide,
)

A100 = "NVIDIA A100-SXM4-80GB"
MODEL = RuntimeModel(texts_per_second=2000.0, n_history=3)  # 432,000 rows -> 216 s on a full A100
SIZE = StepSize(rows=432_000)
RATES = RateCard.from_dict({"backends": {"local": {"default": 1.0}, "dept": {"default": 0.5}, "campus": {"default": 1.0},
                                         "cloud": {"default": 3.0}}})


def pool(free=1, total=None, pending=0, est=None):
    return DeviceGroup(A100, A100, 80.0, free, total if total is not None else max(free, 1), pending, est)


def S(*pools, **kw):
    return SlurmState(pools=pools, launch_latency_s=5.0, billed_overhead_s=20.0, **kw)


def K(*pools, **kw):
    return KubernetesState(pools=pools, launch_latency_s=10.0, billed_overhead_s=30.0, **kw)


def fleet(dept=None, campus=None, cloud=None):
    cs = [ClusterState("dept", "slurm", dept or S(pool(1, 4))), ClusterState("campus", "slurm", campus or S(pool(2, 8))),
          ClusterState("cloud", "kubernetes", cloud or K(pool(4, 4)))]
    return FleetSnapshot(rate_card=RATES, clusters=tuple(cs))


# -- config ------------------------------------------------------------------------------------------------
def test_clusters_config_names_each_cluster_with_its_section_rates_and_budget():
    cfg = {"slurm": {"partition": "gpu"}, "clusters": {
        "campus": {"slurm": {"partition": "a100", "throttle": 4}, "rates": {"default": 0.9}, "waiting_budget_seconds": 600},
        "cloud": {"kubernetes": {"namespace": "embed"}}}}
    legacy, campus, cloud = fleet_from_config(cfg)
    assert (legacy.name, legacy.kind, legacy.section) == ("slurm", "slurm", {"partition": "gpu"})
    assert (campus.name, campus.kind, campus.section["throttle"], campus.rates, campus.waiting_budget_s) == (
        "campus", "slurm", 4, {"default": 0.9}, 600.0)
    assert (cloud.name, cloud.kind, cloud.rates, cloud.waiting_budget_s) == ("cloud", "kubernetes", None, None)
    card = fleet_rate_card(RateCard.load(), (legacy, campus, cloud))
    assert card.rate("campus", A100) == 0.9  # its own rates
    assert card.rate("cloud", A100) == RateCard.load().rate("kubernetes", A100) == 2.4  # its kind's table
    assert card.rate("slurm", A100) == 1.2


def test_todays_single_sections_are_a_fleet_of_their_backends():
    assert [(c.name, c.kind) for c in fleet_from_config({"slurm": {}, "kubernetes": {}})] == [
        ("slurm", "slurm"), ("kubernetes", "kubernetes")]
    assert fleet_from_config({"local": {}}) == ()


@pytest.mark.parametrize("clusters, words", [
    ({"Campus": {"slurm": {}}}, "clusters.Campus: a cluster's name must be lowercase"),
    ({"a;rm -rf": {"slurm": {}}}, "clusters.a;rm -rf: a cluster's name"),
    ({"local": {"slurm": {}}}, "clusters.local: 'local' is the run worker's host"),
    ({"campus": {}}, "clusters.campus: give exactly one of `slurm:` or `kubernetes:` (got neither)"),
    ({"campus": {"slurm": {}, "kubernetes": {}}}, "clusters.campus: give exactly one of `slurm:` or `kubernetes:` (got both)"),
    ({"campus": {"slurm": {}, "rates": {"default": -1}}}, "clusters.campus.rates: "),
    ({"campus": {"slurm": {}, "waiting_budget_seconds": -5}}, "clusters.campus.waiting_budget_seconds: expected seconds >= 0"),
    ({"slurm": {"kubernetes": {}}}, "clusters.slurm: the name is taken by the `slurm:` section"),
])
def test_bad_cluster_config_names_the_cluster_and_key(clusters, words):
    with pytest.raises(FleetConfigError) as e:
        fleet_from_config({"slurm": {}, "clusters": clusters})
    assert words in str(e.value)


# -- placement -----------------------------------------------------------------------------------------------
def test_cheapest_cluster_wins_and_the_reason_names_it_and_the_runners_up():
    p = decide_fleet(GpuRequest(), SIZE, fleet(), model=MODEL)
    assert (p.cluster, p.backend, p.device) == ("dept", "slurm", A100)
    by = {a.cluster: a for a in p.alternatives}
    # each priced from its own table: 0.5, 1.0, 3.0 USD/GPU-h x (overhead + 216 s)
    assert by["dept"].cost_usd == pytest.approx(0.5 * 236 / 3600)
    assert by["campus"].cost_usd == pytest.approx(1.0 * 236 / 3600)
    assert by["cloud"].cost_usd == pytest.approx(3.0 * 246 / 3600)
    assert p.reason.startswith("cluster dept: least expected cost of 3 feasible placement(s) (batch) over 3 cluster(s)")
    assert "runners-up: campus (slurm) " in p.reason and "cloud (kubernetes) " in p.reason
    assert p.chosen is by["dept"]
    assert Placement.from_json(p.to_json()) == p


def test_a_queued_cheap_cluster_loses_to_the_next_when_the_deadline_needs_it():
    # dept full: its controller says a GPU frees in 3,000 s -> finish 3,241 s > 600 s; campus is next cheapest
    f = fleet(dept=S(pool(0, 4, est=3000.0)))
    p = decide_fleet(GpuRequest(deadline_s=600), SIZE, f, model=MODEL)
    assert p.cluster == "campus" and p.deadline_met
    assert next(a for a in p.alternatives if a.cluster == "dept").start_delay_s == 3005.0
    assert decide_fleet(GpuRequest(), SIZE, f, model=MODEL).cluster == "dept"  # batch: cheaper, later


def test_an_unreachable_cluster_is_skipped_with_its_reason():
    f = fleet(dept=SlurmState(reachable=False, reason="ssh: connection refused"))
    p = decide_fleet(GpuRequest(), SIZE, f, model=MODEL)
    assert p.cluster == "campus"
    assert "dept (slurm): unreachable: ssh: connection refused" in p.reason


def test_forcing_a_kind_or_a_cluster():
    assert decide_fleet(GpuRequest(), SIZE, fleet(), model=MODEL, force="kubernetes").cluster == "cloud"
    assert decide_fleet(GpuRequest(), SIZE, fleet(), model=MODEL, force="campus").cluster == "campus"
    assert decide_fleet(GpuRequest(backend="kubernetes"), SIZE, fleet(), model=MODEL, force="campus").cluster == "cloud"
    with pytest.raises(NoFeasiblePlacement, match="no feasible placement in the fleet on 'nowhere'"):
        decide_fleet(GpuRequest(), SIZE, fleet(), model=MODEL, force="nowhere")


def test_a_one_cluster_per_backend_fleet_places_as_the_policy_does():
    snap = Snapshot(rate_card=RateCard.load(), slurm=S(pool(2, 10)), kubernetes=K(pool(1, 4)), local=LocalState())
    one = decide(GpuRequest(deadline_s=600), SIZE, snap, model=MODEL)
    many = decide_fleet(GpuRequest(deadline_s=600), SIZE, FleetSnapshot.from_snapshot(snap), model=MODEL)
    assert (many.cluster, many.backend, many.device) == ("slurm", one.backend, one.device)
    assert [a.cost_usd for a in many.alternatives] == [a.cost_usd for a in one.alternatives]


# -- waiting budgets -------------------------------------------------------------------------------------------
def test_waiting_budget_order_explicit_then_deadline_then_compute_weighted():
    assert waiting_budget_s(seconds=120, deadline_s=600, runtime_s=236) == 120.0
    assert waiting_budget_s(deadline_s=600, launch_s=5, runtime_s=236) == 359.0
    assert waiting_budget_s(deadline_s=100, launch_s=5, runtime_s=236) == 0.0
    assert waiting_budget_s(factor=0.5, gpus=2, runtime_s=236) == 236.0
    assert waiting_budget_s(runtime_s=236) is None


def test_a_unit_over_its_budget_spills_to_the_next_cheapest_that_starts_sooner():
    # the unit waits on dept (full, pending); campus has a free GPU
    f = fleet(dept=S(pool(0, 4, pending=1, est=3000.0)))
    stay = spill_decision(GpuRequest(), SIZE, f, cluster="dept", waited_s=100, budget_s=300, remaining_wait_s=2900,
                          model=MODEL)
    assert not stay.spill and "waited 100 s of its 300 s budget on dept" in stay.reason
    go = spill_decision(GpuRequest(), SIZE, f, cluster="dept", waited_s=301, budget_s=300, remaining_wait_s=2900,
                        model=MODEL)
    assert go.spill and go.placement.cluster == "campus" and go.placement.chosen.start_delay_s == 5.0
    assert go.reason.startswith("waited 301 s, over its 300 s budget on dept: spills over to campus (start in 5 s")


def test_no_spill_when_no_other_cluster_starts_it_sooner_or_none_can_run_it():
    f = fleet(dept=S(pool(0, 4, pending=1, est=3000.0)), campus=S(pool(0, 8, est=5000.0)),
              cloud=K(pool(0, 4, pending=9)))
    d = spill_decision(GpuRequest(), SIZE, f, cluster="dept", waited_s=900, budget_s=300, remaining_wait_s=100,
                       model=MODEL)
    assert not d.spill and "would not start it sooner" in d.reason
    alone = FleetSnapshot(rate_card=RATES, clusters=(ClusterState("dept", "slurm", S(pool(0, 4, est=3000.0))),))
    d = spill_decision(GpuRequest(), SIZE, alone, cluster="dept", waited_s=900, budget_s=300, remaining_wait_s=None,
                       model=MODEL)
    assert not d.spill and "no other cluster can run it" in d.reason
    assert not spill_decision(GpuRequest(), SIZE, f, cluster="dept", waited_s=1e6, budget_s=None,
                              remaining_wait_s=None, model=MODEL).spill


def test_a_unit_with_a_deadline_it_still_meets_where_it_waits_stays():
    # over budget, campus would start it at once, but dept still delivers: 1,000 s + 236 s <= 1,500 s left
    f = fleet(dept=S(pool(0, 4, pending=1, est=1000.0)))
    d = spill_decision(GpuRequest(deadline_s=1500), SIZE, f, cluster="dept", waited_s=700, budget_s=600,
                       remaining_wait_s=1000, model=MODEL)
    assert not d.spill and "still finishes within its deadline there (1000 s + 236 s <= 1500 s)" in d.reason
    late = spill_decision(GpuRequest(deadline_s=1200), SIZE, f, cluster="dept", waited_s=700, budget_s=600,
                          remaining_wait_s=1000, model=MODEL)
    assert late.spill and late.placement.cluster == "campus"


def test_whatif_over_a_fleet_fills_the_cheap_queues_first_and_totals_per_cluster():
    from dagster_gpu.fleet.whatif import plan_fleet, totals_by_cluster

    # 432 MB at the model's 1,000 bytes per row -> 216 s each; dept has 1 free GPU, campus 2, cloud 4
    parts = [(f"p{i}", 432_000_000) for i in range(5)]
    model = RuntimeModel(texts_per_second=2000.0, n_history=3, rows_per_byte=1e-3)
    rows = plan_fleet(parts, GpuRequest(deadline_s=300), fleet(), model)
    assert [r.placement.cluster for r in rows] == ["dept", "campus", "campus", "cloud", "cloud"]
    totals = {t.cluster: (t.partitions, round(t.cost_usd, 6)) for t in totals_by_cluster(rows)}
    assert totals == {"dept": (1, round(0.5 * 236 / 3600, 6)), "campus": (2, round(2 * 236 / 3600, 6)),
                      "cloud": (2, round(2 * 3.0 * 246 / 3600, 6))}
    forced = plan_fleet(parts[:2], GpuRequest(), fleet(), model, mode="cloud")
    assert {r.placement.cluster for r in forced} == {"cloud"}
