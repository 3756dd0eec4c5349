"""Benchmark: an N-partition backfill (default 200) of a trivial step on the local Slurm cluster.

    eval "$(resources/slurm/cluster.sh env)"; resources/postgres/postgres.sh start
    .venv/bin/python bench/slurm_backfill.py [--partitions 200] [--max-runs 50] [--throttle 4]
        [--slurm-version 22.05|24.11]

``--slurm-version`` picks one of the local test clusters (tests/slurm_helpers.py ``CLUSTERS``) and takes its
environment (SLURM_CONF, PATH with its client wrappers first, and for 24.11 ``DGPU_TEST_SLURM_PYTHON``, the
interpreter its chrooted array tasks run; resources/slurm/README.md); without it the bench uses the cluster
the environment names. The cluster's ``sinfo -V`` must print that version, else the bench exits.

Runs the backfill three times, one after the other on the same host, through dagster-daemon with the run
queue limited to ``--max-runs`` concurrent runs (one run per partition, no BackfillPolicy):
  1. gpu_executor, slurm backend (steps become job array tasks), coalescing window with its holds
     (launches wait while our earlier arrays still have throttle-many pending tasks, and while the
     backfill is starting more runs, up to 10 launches; dagster_gpu/slurm/window.py),
  2. the same with both holds off (``coalesce_backlog_tasks: 0``, ``coalesce_target_tasks: 0``: the
     plain quiet-gap window), and
  3. Dagster's multiprocess executor (steps run as local subprocesses),
and prints: partitions per sbatch call, controller RPCs per partition (``sdiag``, reset before the run),
orchestrating-host memory per in-flight partition (RSS of the daemon's process tree, which holds the
code server and every run worker, divided by runs in flight; sampled every 2 s), and the makespan ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import dagster as dg  # noqa: E402
from dagster._core.storage.dagster_run import DagsterRunStatus, RunsFilter  # noqa: E402

import slurm_helpers as H  # noqa: E402
from dagster_gpu.commands.backfill import DaemonProcess, submit_asset_backfill, wait_for_backfill  # noqa: E402
from dagster_gpu.slurm.client import SlurmClient  # noqa: E402


def tree_rss(pid: int) -> int:
    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for q in procs:
        try:
            total += q.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run_backfill(variant: str, n: int, max_runs: int, throttle: int) -> dict:
    executor = "multiprocess" if variant == "multiprocess" else "slurm"
    home, env = H.make_dagster_home(max_concurrent_runs=max_runs)
    env = {**env, "SLURM_TEST_EXECUTOR": executor, "SLURM_TEST_THROTTLE": str(throttle),
           "SLURM_TEST_BACKLOG": "0" if variant == "slurm-no-hold" else "",
           "SLURM_TEST_TARGET": "0" if variant == "slurm-no-hold" else "",
           # 2 shared CPUs: Dagster's code server needs longer than its 60 s default to answer the daemon
           # while dozens of run workers start (DagsterUserCodeUnreachableError fails runs otherwise)
           "DAGSTER_GRPC_TIMEOUT_SECONDS": "300",
           "SLURM_TEST_WINDOW": "3", "SLURM_TEST_MAX_WINDOW": "20", "SLURM_TEST_POLL": "2"}  # fmt: skip
    os.environ.update(env)
    import importlib

    import slurm_pipeline

    importlib.reload(slurm_pipeline)
    client = SlurmClient(slurm_conf=H.slurm_conf())
    client.sdiag_reset()
    keys = [f"p{i:03d}" for i in range(n)]
    samples: list[tuple[int, int]] = []
    stop = threading.Event()
    with dg.DagsterInstance.get() as instance:
        with DaemonProcess(home / "workspace.yaml", env=env, log_file=home / "daemon.log") as d:

            def sample():
                while not stop.is_set():
                    inflight = instance.get_runs_count(RunsFilter(statuses=[DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]))
                    samples.append((tree_rss(d.proc.pid), inflight))
                    stop.wait(2.0)

            t0 = time.time()
            bid = submit_asset_backfill(instance, slurm_pipeline.defs, dg.AssetKey("trivial"), keys, title=f"bench-{executor}")
            th = threading.Thread(target=sample, daemon=True)
            th.start()
            prog = wait_for_backfill(instance, bid, n, timeout_s=7200, poll_s=2, daemon=d)
            makespan = time.time() - t0
            stop.set()
            th.join()
    sd = client.sdiag()
    res = {"variant": variant, "partitions": n, "succeeded": prog.succeeded, "failed": prog.failed,
           "makespan_s": round(makespan, 1), "home": str(home)}  # fmt: skip
    per = [rss / k for rss, k in samples if k > 0]
    res["rss_per_inflight_partition_mib_mean"] = round(sum(per) / len(per) / 2**20, 1) if per else None
    res["rss_peak_mib"] = round(max((r for r, _ in samples), default=0) / 2**20, 1)
    res["inflight_peak"] = max((k for _, k in samples), default=0)
    res["controller_rpcs"] = sd.rpc_total
    res["controller_rpcs_per_partition"] = round(sd.rpc_total / n, 2)
    res["rpc_by_type"] = dict(sorted(sd.rpc_by_type.items(), key=lambda kv: -kv[1])[:8])
    if executor == "slurm":
        batches = H.spool_batches(Path(env["DAGSTER_GPU_SLURM_SPOOL"]))
        res["sbatch_calls"] = len(batches)
        res["tasks_per_sbatch"] = [b["tasks"] for b in batches]
        res["partitions_per_sbatch"] = round(n / max(1, len(batches)), 1)
    return res


VARIANTS = ["slurm", "slurm-no-hold", "multiprocess"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=200)
    ap.add_argument("--max-runs", type=int, default=50)
    ap.add_argument("--throttle", type=int, default=4)
    ap.add_argument("--only", choices=VARIANTS, action="append", help="run only these variants (repeatable)")
    ap.add_argument("--slurm-version", choices=sorted(H.CLUSTERS), help="local test cluster to run on (default: the environment's)")
    a = ap.parse_args()
    cluster = H.CLUSTERS[a.slurm_version] if a.slurm_version else None
    if cluster:
        os.environ.update(cluster.env())
    reason = H.cluster_unavailable_reason(cluster) or H.postgres_unavailable_reason()
    if reason:
        sys.exit(f"cannot run: {reason}")
    results = {}
    version = subprocess.run(["sinfo", "-V"], capture_output=True, text=True, timeout=20).stdout.strip()
    print(json.dumps({"slurm_version": version, "slurm_conf": H.slurm_conf()}), flush=True)
    for v in a.only or VARIANTS:
        results[v] = run_backfill(v, a.partitions, a.max_runs, a.throttle)
        results[v]["slurm_version"] = version
        print(json.dumps(results[v]), flush=True)
    if "multiprocess" in results:
        base = results["multiprocess"]["makespan_s"]
        print(json.dumps({f"makespan_ratio_{v}_over_multiprocess": round(r["makespan_s"] / base, 2) for v, r in results.items() if v != "multiprocess"}))


if __name__ == "__main__":
    main()
