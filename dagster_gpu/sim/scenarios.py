"""The article's scenario and the suite of eight small scenarios (pure data).

Measured (``bench/unit_startup.py`` -> ``bench/results/unit_startup.json``, read by
:mod:`dagster_gpu.sim.calibration`): the billed start-up of a work unit (python, the step worker's
imports, model load), paid once per unit on every backend — each backend starts the same step worker,
and the billing clock starts with it (Slurm: the job's start; Kubernetes: the pod's running interval,
after image pull and container creation) — and the billed seconds each partition adds inside a unit.

Stated, not measured: a partition embeds ``rows`` texts at 2,000 texts/s on a full A100 (the policy's
fallback figure, see ``dagster_gpu.policy.runtime``); unbilled launch latency: Slurm 5 s, Kubernetes
10 s (scheduling + claim allocation + container creation), local GPU host 1 s. Prices from
``resources/ratecard.yaml`` unless a scenario says otherwise (A100: Slurm 1.20, Kubernetes 2.40, local
1.00 USD per GPU-hour; a MIG slice its parent's rate × compute fraction).

Runs: partitions that arrive together from a backfill form one ranged run (``Task.run``; ``ranged=False``
gives the per-partition runs of issue 5 for comparison); arrivals spread in time (a sensor's ticks) are
runs of one partition.
"""

from __future__ import annotations

from functools import lru_cache

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.core.request import GpuRequest
from dagster_gpu.policy.runtime import RuntimeModel
from dagster_gpu.sim.calibration import UnitCalibration, load_calibration
from dagster_gpu.sim.model import (
    BackgroundJob,
    ClusterSpec,
    Preemption,
    Resident,
    Scenario,
    Task,
    full_gpus,
    mig_slices,
)

TPS = 2000.0
HOUR = 3600.0
REQ = GpuRequest(count=1, memory_gib=2.0)
REQ_MIG = GpuRequest(count=1, memory_gib=2.0, mig_ok=True)


@lru_cache(maxsize=1)
def calibration() -> UnitCalibration:
    """The measured unit costs (read once; see :mod:`dagster_gpu.sim.calibration`)."""
    return load_calibration()


def rows_for(work_s: float) -> int:
    """Rows that take ``work_s`` seconds on a full A100 at :data:`TPS`."""
    return int(round(work_s * TPS))


def slurm(n: int, **kw) -> ClusterSpec:
    return ClusterSpec("slurm", (full_gpus(n),), launch_latency_s=5.0,
                       billed_overhead_s=calibration().unit_startup_s, **kw)


def k8s(n: int, mig: int = 0, profile: str = "1g.10gb", **kw) -> ClusterSpec:
    units = ((full_gpus(n),) if n else ()) + ((mig_slices(mig, profile),) if mig else ())
    return ClusterSpec("kubernetes", units, launch_latency_s=10.0, billed_overhead_s=calibration().unit_startup_s,
                       **kw)


def local(n: int = 1) -> ClusterSpec:
    return ClusterSpec("local", (full_gpus(n),), launch_latency_s=1.0, billed_overhead_s=calibration().unit_startup_s)


def model(gpu_busy: float = 1.0) -> RuntimeModel:
    return RuntimeModel(texts_per_second=TPS, gpu_busy=gpu_busy, n_history=10,
                        per_partition_s=calibration().per_partition_s)


def _run(ranged: bool, run: int = 0) -> int | None:
    return run if ranged else None


def article(n_tasks: int = 1000, gpus: int = 10, work_s: float = 216.0, per_run: int = 100,
            ranged: bool = True) -> Scenario:
    """10 A100-80GB, 1,000 embedding steps needing 2 GB each, one day's window.

    ``work_s = 216`` makes the day's work 60 GPU-hours, i.e. 6 h on 10 GPUs and 18 h idle for a resident
    deployment: the article's own "about 18 hours of GPU idle per day" (section 1). Arrays use the
    article's throttle ``--array=1-100%10`` as ``%10``; its 100 tasks per array are our ``per_run``
    partitions per ranged run (``BackfillPolicy.multi_run(100)``), so the backfill is 10 ranged runs
    (``ranged=False``: one run per partition). Both backends have 10 A100s; resident pods hold 10.
    """
    tasks = tuple(Task(i, rows_for(work_s), 0.0, None, REQ, _run(ranged, i // per_run)) for i in range(n_tasks))
    what = f"{n_tasks // per_run} ranged runs of {per_run}" if ranged else "one run per partition"
    return Scenario(
        "article", f"{n_tasks} x {work_s:.0f} s partitions ({what}), {gpus} A100, 24 h window",
        (slurm(gpus, array_throttle=gpus), k8s(gpus)), tasks, model(), RateCard.load(), 24 * HOUR,
        Resident(gpus),
    )


def _sc(name, desc, clusters, tasks, gpu_busy=1.0, rc=None, window=4 * HOUR, resident=2) -> Scenario:
    return Scenario(name, desc, tuple(clusters), tuple(tasks), model(gpu_busy), rc or RateCard.load(), window,
                    Resident(resident))


def queue_contention() -> Scenario:
    """Slurm's 2 GPUs are taken by other users for 3 h; deadline steps must go elsewhere, batch ones wait."""
    bg = tuple(BackgroundJob(0.0, 3 * HOUR) for _ in range(3))
    tasks = [Task(i, rows_for(600), 60.0 * i, 3600.0 if i % 2 == 0 else None, REQ) for i in range(6)]
    return _sc("queue-contention", "slurm 2 GPUs busy 3 h (3 foreign jobs); k8s 2 GPUs; 3 deadline + 3 batch",
               [slurm(2, background=bg), k8s(2)], tasks)


def price_asymmetry(ranged: bool = True) -> Scenario:
    """Kubernetes (spot-priced) is cheaper than Slurm; a local GPU host sits in between. A backfill of 3
    batch partitions and one of 4 due in 1500 s (a run carries one deadline)."""
    rc = RateCard.from_dict({"backends": {"slurm": {"default": 1.2}, "kubernetes": {"default": 0.9},
                                          "local": {"default": 1.0}}}, "price-asymmetry")
    tasks = [Task(i, rows_for(600), 0.0, 1500.0 if i >= 3 else None, REQ, _run(ranged, 0 if i < 3 else 1))
             for i in range(7)]
    return _sc("price-asymmetry", "k8s 0.90 < local 1.00 < slurm 1.20 USD/GPU-h; 2+1+2 GPUs; 4 steps due in 1500 s",
               [slurm(2), k8s(2), local(1)], tasks, rc=rc)


def mig_fit(ranged: bool = True) -> Scenario:
    """2 GB steps that keep an A100 15 % busy: a 1g.10gb slice (1/7) runs them at 95 % speed."""
    tasks = [Task(i, rows_for(600), 0.0, None, REQ_MIG, _run(ranged)) for i in range(8)]
    return _sc("mig-fit", "k8s 1 A100 + 7 MIG 1g.10gb; slurm 2 A100; 8 batch steps, u = 0.15",
               [slurm(2), k8s(1, mig=7)], tasks, gpu_busy=0.15)


def mixed_deadlines() -> Scenario:
    """Batch steps and steps due in 15 or 30 min, staggered, on small fleets."""
    dls = [None, 900.0, 1800.0, None, 900.0, None, 1800.0, 900.0]
    tasks = [Task(i, rows_for(500 if i % 3 else 800), 120.0 * i, dls[i], REQ) for i in range(8)]
    return _sc("mixed-deadlines", "slurm 2, k8s 2; 8 steps every 2 min, deadlines none/900/1800 s",
               [slurm(2), k8s(2)], tasks)


def backend_outage() -> Scenario:
    """Slurm's controller is down for the first hour (unknown to the policy how long)."""
    tasks = [Task(i, rows_for(600), 30.0 * i, 1800.0 if i < 3 else None, REQ) for i in range(6)]
    return _sc("backend-outage", "slurm down 0-3600 s; k8s 3; 3 steps due in 1800 s + 3 batch",
               [slurm(3, outages=((0.0, HOUR),)), k8s(3)], tasks)


def backend_outage_announced() -> Scenario:
    """As :func:`backend_outage`, but the outage is a Slurm maintenance reservation whose end is known."""
    tasks = [Task(i, rows_for(600), 30.0 * i, 1800.0 if i < 3 else None, REQ) for i in range(6)]
    return _sc("backend-outage-announced", "as backend-outage, the end announced (MAINT reservation)",
               [slurm(3, outages=((0.0, HOUR),), outages_announced=True), k8s(3)], tasks)


def sensor_burst() -> Scenario:
    """A sensor fires 8 fresh partitions within 80 s, each due in 15 min; MIG acceptable (u = 0.3)."""
    tasks = [Task(i, rows_for(300), 10.0 * i, 900.0, REQ_MIG) for i in range(8)]
    return _sc("sensor-burst", "8 arrivals in 80 s due in 900 s; slurm 2 (%2); k8s 2 A100 + 7 MIG 1g; u = 0.3",
               [slurm(2, array_throttle=2), k8s(2, mig=7)], tasks, gpu_busy=0.3)


def heterogeneous_sizes(ascending: bool = False, ranged: bool = True) -> Scenario:
    """Partitions from 1 to 40 minutes of work, all due in 45 minutes, on 2 + 2 GPUs.

    ``ascending=True`` submits them smallest first: a policy deciding one partition at a time in that
    order fills Slurm with the small ones and must send the late large ones to Kubernetes (issue 5's
    greedy limit); as one ranged run, the policy sees the whole range and plans it largest first.
    """
    works = [60, 2400, 300, 1200, 120, 1800, 600, 240]
    if ascending:
        works = sorted(works)
    tasks = [Task(i, rows_for(w), 0.0, 2700.0, REQ, _run(ranged)) for i, w in enumerate(works)]
    name = "heterogeneous-sizes" + ("-ascending" if ascending else "")
    return _sc(name, "8 steps of 1-40 min work due in 2700 s" + (", smallest first" if ascending else "")
               + "; slurm 2, k8s 2", [slurm(2), k8s(2)], tasks)


def slurm_preemption(ranged: bool = True) -> Scenario:
    """Our QOS is preemptible: two preemptions hit Slurm; the policy only knows the rate (1 per GPU-hour).
    A backfill of 3 partitions due in 2400 s and one of 3 batch partitions."""
    pre = (Preemption(400.0, 1800.0), Preemption(700.0, 1800.0))
    tasks = [Task(i, rows_for(600), 0.0, 2400.0 if i < 3 else None, REQ, _run(ranged, 0 if i < 3 else 1))
             for i in range(6)]
    return _sc("slurm-preemption", "slurm 4 (2 preemptions, each holding the GPU 30 min), k8s 2; 3 due in 2400 s",
               [slurm(4, preemptions=pre, preemptions_per_gpu_hour=1.0), k8s(2)], tasks)


def suite(ranged: bool = True) -> list[Scenario]:
    """The eight scenarios of issue 5, in its order (outage: unannounced and announced; sizes: listed and
    ascending); ``ranged=False``: every partition a run of its own, as in issue 5."""
    r = ranged
    return [queue_contention(), price_asymmetry(r), mig_fit(r), mixed_deadlines(), backend_outage(),
            backend_outage_announced(), sensor_burst(), heterogeneous_sizes(ranged=r),
            heterogeneous_sizes(ascending=True, ranged=r), slurm_preemption(r)]
