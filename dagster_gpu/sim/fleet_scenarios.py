"""Fleet scenarios: three and four named clusters with their own prices, queue loads and outages (pure data).

Each cluster is a named Slurm or Kubernetes cluster (``ClusterSpec.kind``) priced from its own rate table
(the scenario's rate card has one table per cluster name, as :func:`dagster_gpu.fleet.config.fleet_rate_card`
builds it). Launch latencies and start-ups as in :mod:`dagster_gpu.sim.scenarios` (Slurm 5 s, a cluster reached
over SSH 15 s, Kubernetes 10 s; the measured unit start-up everywhere). Prices are illustrative: a department
cluster at power cost, a campus cluster at its internal recharge, a national centre's allocation, a cloud's
on-demand rate. Every partition is a run of its own (a sensor's ticks or a backfill of single-partition runs).
"""

from __future__ import annotations

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.sim.model import BackgroundJob, ClusterSpec, Scenario, Task, full_gpus
from dagster_gpu.sim.scenarios import HOUR, REQ, _sc, calibration, rows_for

PRICES = {"dept": 0.6, "campus": 0.9, "national": 1.1, "cloud": 2.4}  # USD per A100-hour


def cluster(name: str, n: int, *, kind: str = "slurm", latency: float | None = None, **kw) -> ClusterSpec:
    lat = latency if latency is not None else (10.0 if kind == "kubernetes" else 5.0)
    return ClusterSpec(name, (full_gpus(n),), launch_latency_s=lat, billed_overhead_s=calibration().unit_startup_s,
                       kind=kind, **kw)


def rates(*names: str) -> RateCard:
    return RateCard.from_dict({"backends": {n: {"default": PRICES[n]} for n in names}}, "fleet")


def fleet_prices() -> Scenario:
    """Four clusters, all idle, priced apart: batch steps go to the cheapest with room, deadline steps to the
    cheapest that finishes in time."""
    tasks = [Task(i, rows_for(600), 60.0 * i, 1200.0 if i % 2 else None, REQ) for i in range(6)]
    return _sc("fleet-prices", "dept 1 @0.6, campus 2 @0.9, national 4 @1.1 (ssh), cloud 4 @2.4; 6 steps, 3 due in 1200 s",
               [cluster("dept", 1), cluster("campus", 2), cluster("national", 4, latency=15.0),
                cluster("cloud", 4, kind="kubernetes")], tasks, rc=rates("dept", "campus", "national", "cloud"))


def fleet_loads() -> Scenario:
    """The cheap clusters are busy with other users' jobs (dept for 2 h, one of campus's two GPUs for 1 h):
    steps due in 30 min must look past them, by their live queues."""
    bg = (BackgroundJob(0.0, 2 * HOUR), BackgroundJob(0.0, 2 * HOUR), BackgroundJob(0.0, HOUR, ))
    tasks = [Task(i, rows_for(600), 90.0 * i, 1800.0, REQ) for i in range(6)]
    dept = cluster("dept", 2, background=bg[:2])
    campus = cluster("campus", 2, background=bg[2:])
    return _sc("fleet-loads", "dept 2 busy 2 h, campus 2 (1 busy 1 h), cloud 4; 6 steps due in 1800 s",
               [dept, campus, cluster("cloud", 4, kind="kubernetes")], tasks, rc=rates("dept", "campus", "cloud"))


def fleet_outage() -> Scenario:
    """The cheapest cluster's controller is down for the first hour (the policy is not told for how long)."""
    tasks = [Task(i, rows_for(600), 60.0 * i, 1800.0 if i < 3 else None, REQ) for i in range(6)]
    return _sc("fleet-outage", "dept 2 down 0-3600 s, campus 2, cloud 4; 3 steps due in 1800 s + 3 batch",
               [cluster("dept", 2, outages=((0.0, HOUR),)), cluster("campus", 2), cluster("cloud", 4, kind="kubernetes")],
               tasks, rc=rates("dept", "campus", "cloud"))


def fleet_outage_announced() -> Scenario:
    """As :func:`fleet_outage`, but the outage is a maintenance reservation whose end the policy is told."""
    sc = fleet_outage()
    dept = ClusterSpec("dept", sc.clusters[0].units, launch_latency_s=5.0, billed_overhead_s=calibration().unit_startup_s,
                       kind="slurm", outages=((0.0, HOUR),), outages_announced=True)
    return _sc("fleet-outage-announced", "as fleet-outage, the outage's end announced (a MAINT reservation)",
               [dept, *sc.clusters[1:]], sc.tasks, rc=sc.rate_card)


def fleet_spill(budget_s: float = 600.0) -> Scenario:
    """Steps queue on the cheapest cluster behind other users' jobs (expected to start within the deadline);
    at 600 s its controller stops for two hours. Each waits there at most ``budget_s``, then spills over
    to the next cheapest that starts it sooner; without spill-over they wait out the outage."""
    bg = tuple(BackgroundJob(0.0, 900.0) for _ in range(2))
    tasks = [Task(i, rows_for(600), 60.0 * i, 3600.0, REQ) for i in range(4)]
    dept = cluster("dept", 2, background=bg, outages=((600.0, 600.0 + 2 * HOUR),), waiting_budget_s=budget_s)
    campus = cluster("campus", 1, waiting_budget_s=budget_s)
    cloud = cluster("cloud", 4, kind="kubernetes", waiting_budget_s=budget_s)
    return _sc("fleet-spill", f"dept 2 busy until 900 s, down 600-7800 s; campus 1, cloud 4; waiting budget "
                              f"{budget_s:.0f} s; 4 steps due in 3600 s", [dept, campus, cloud], tasks,
               rc=rates("dept", "campus", "cloud"))


def fleet_suite() -> list[Scenario]:
    return [fleet_prices(), fleet_loads(), fleet_outage(), fleet_outage_announced(), fleet_spill()]
