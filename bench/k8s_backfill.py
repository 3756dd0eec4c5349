"""Benchmark: an N-partition backfill (default 50) of a trivial step on the local Kubernetes 1.34 control plane.

    resources/k8s/cluster.sh start; resources/postgres/postgres.sh start
    .venv/bin/python bench/k8s_backfill.py [--partitions 50] [--max-runs 7] [--sleep 2] [--asset k8s_mig]

Runs the same backfill twice, one after the other on the same host, through dagster-daemon with the run
queue limited to ``--max-runs`` concurrent runs (one run per partition, no BackfillPolicy):
  1. gpu_executor, kubernetes backend: each step is a pod with a DRA ResourceClaim (``k8s_mig``: one MIG
     1g.10gb slice, 7 on the fake node) run by the node agent as a local process;
  2. Dagster's multiprocess executor: each step is a local subprocess.
and prints, per step, the launch-to-running latency (STEP_WORKER_STARTING event -> the container's
``startedAt``, which includes claim creation, allocation by kube-scheduler and binding) and launch-to-
STEP_START (worker process up and reporting; comparable with the multiprocess baseline's
STEP_WORKER_STARTING/STEP_START gap) as p50/p95/max, and the makespan (backfill submitted -> every run
ended) of both, with their ratio (target: <= 1.3).

Writes a JSON summary to ``--out`` (default bench/k8s_backfill.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

import dagster as dg  # noqa: E402

from dagster_gpu.commands.backfill import DaemonProcess, submit_asset_backfill, wait_for_backfill  # noqa: E402
from pipelines.instance_yaml import dagster_yaml  # noqa: E402
from tests.conftest import pg_settings  # noqa: E402

PIPELINE = REPO / "tests" / "k8s_pipeline.py"
K8S_DIR = Path(os.environ.get("DAGSTER_GPU_K8S_DIR", "/tmp/dagster-gpu-k8s"))


def make_home(pg: dict, max_runs: int, *, name: str = "k8s", pipeline: Path = PIPELINE, extra_yaml: str = "") -> Path:
    """A fresh PostgreSQL database ``bench_<name>_<hex>`` and DAGSTER_HOME (run queue of ``max_runs``, the
    password an env reference, ``extra_yaml`` appended to dagster.yaml) with a workspace.yaml loading
    ``pipeline`` as location ``<name>_bench``."""
    import psycopg2

    db = f"bench_{name}_{uuid.uuid4().hex[:10]}"
    conn = psycopg2.connect(host=pg["DAGSTER_PG_HOST"], port=pg["DAGSTER_PG_PORT"], user=pg["DAGSTER_PG_USER"],
                            password=pg["DAGSTER_PG_PASSWORD"], dbname=pg["DAGSTER_PG_DB"])
    conn.autocommit = True
    conn.cursor().execute(f"CREATE DATABASE {db}")
    conn.close()
    home = Path(tempfile.mkdtemp(prefix=f"dagster-{name}-bench-"))
    (home / "dagster.yaml").write_text(dagster_yaml(db, max_runs=max_runs, noop_compute_logs=True, extra=extra_yaml))
    (home / "workspace.yaml").write_text(
        f"load_from:\n  - python_file:\n      relative_path: {pipeline}\n      working_directory: {REPO}\n"
        f"      location_name: {name}_bench\n")
    return home


def ensure_pg_secret(pg: dict) -> None:
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(config.new_client_from_config(config_file=str(K8S_DIR / "admin.kubeconfig")))
    body = client.V1Secret(metadata=client.V1ObjectMeta(name="dagster-postgresql-secret"),
                           string_data={"postgresql-password": pg["DAGSTER_PG_PASSWORD"]})
    try:
        core.create_namespaced_secret("dagster-gpu", body)
    except ApiException as e:
        if e.status != 409:
            raise
        core.replace_namespaced_secret("dagster-postgresql-secret", "dagster-gpu", body)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))] if xs else float("nan")


def summary(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0, "p50": None, "p95": None, "max": None, "mean": None}
    return {"n": len(xs), "p50": pct(xs, 0.5), "p95": pct(xs, 0.95), "max": max(xs), "mean": statistics.fmean(xs)}


def step_latencies(instance, run_ids: list[str], asset_key) -> dict:
    """Per run: launch (STEP_WORKER_STARTING) -> STEP_START, and -> container startedAt (kubernetes only)."""
    to_start, to_running = [], []
    for rid in run_ids:
        recs = instance.get_records_for_run(rid).records
        launch = next((r.event_log_entry.timestamp for r in recs if r.event_log_entry.dagster_event_type
                       == dg.DagsterEventType.STEP_WORKER_STARTING), None)
        start = next((r.event_log_entry.timestamp for r in recs if r.event_log_entry.dagster_event_type
                      == dg.DagsterEventType.STEP_START), None)
        if launch is None or start is None:
            continue
        to_start.append(start - launch)
        run = instance.get_run_by_id(rid)
        pk = run.tags.get("dagster/partition")
        obs = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[pk]), limit=5).records
        for o in obs:
            md = o.asset_observation.metadata
            if "k8s/started_at" in md:
                # startedAt has 1 s resolution (RFC 3339 seconds): this latency is +-1 s
                to_running.append(md["k8s/started_at"].value - launch)
                break
    return {"launch_to_step_start_s": summary(to_start), "launch_to_running_s": summary(to_running)}


def run_backfill(executor: str, pg: dict, n: int, max_runs: int, sleep_s: float, asset_name: str) -> dict:
    home = make_home(pg, max_runs)
    env = {**{k: v for k, v in pg.items() if k != "DAGSTER_PG_PASSWORD_FILE"},
           "DAGSTER_HOME": str(home), "K8S_TEST_EXECUTOR": executor,
           "DAGSTER_GPU_K8S_KUBECONFIG": str(K8S_DIR / "executor.kubeconfig"),
           "K8S_TEST_PENDING_TIMEOUT": "600", "K8S_TEST_SLEEP_SECONDS": "0.5",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    os.environ.update(env)
    import importlib

    from tests import k8s_pipeline

    importlib.reload(k8s_pipeline)
    asset = getattr(k8s_pipeline, asset_name)
    keys = k8s_pipeline.KEYS[:n]
    with dg.DagsterInstance.get() as instance:
        with DaemonProcess(home / "workspace.yaml", env=env, log_file=home / "daemon.log") as d:
            t0 = time.time()
            bid = submit_asset_backfill(instance, k8s_pipeline.defs, asset.key, keys, title=f"bench-{executor}",
                                        tags={"test/sleep": str(sleep_s)})
            final = wait_for_backfill(instance, bid, n, timeout_s=3600, poll_s=1.0, daemon=d)
            run_ids = [r.dagster_run.run_id for r in instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": bid}))]
            ends = [r.end_time for r in instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": bid})) if r.end_time]
            makespan = (max(ends) if ends else time.time()) - t0
            time.sleep(3 if executor == "kubernetes" else 0)  # let the last observations land
            lat = step_latencies(instance, run_ids, asset.key)
    return {"executor": executor, "partitions": n, "succeeded": final.succeeded, "failed": final.failed,
            "makespan_s": makespan, **lat, "home": str(home)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=50)
    ap.add_argument("--max-runs", type=int, default=7, help="concurrent runs (7 = the MIG slices on the node)")
    ap.add_argument("--sleep", type=float, default=2.0, help="seconds each step sleeps")
    ap.add_argument("--asset", default="k8s_mig", choices=["k8s_mig", "k8s_gpu"])
    ap.add_argument("--out", default=str(REPO / "bench" / "k8s_backfill.json"))
    a = ap.parse_args()
    pg = pg_settings()
    ensure_pg_secret(pg)
    load0 = os.getloadavg()[0]
    results = [run_backfill(ex, pg, a.partitions, a.max_runs, a.sleep, a.asset) for ex in ("kubernetes", "multiprocess")]
    k8s, mp = results
    ratio = k8s["makespan_s"] / mp["makespan_s"]
    out = {"partitions": a.partitions, "max_runs": a.max_runs, "sleep_s": a.sleep, "asset": a.asset,
           "cpus": os.cpu_count(), "loadavg_before": load0, "loadavg_after": os.getloadavg()[0],
           "results": results, "makespan_ratio": ratio}
    Path(a.out).write_text(json.dumps(out, indent=2))
    print(f"{a.partitions} partitions, max {a.max_runs} concurrent runs, step sleeps {a.sleep:g} s, "
          f"{os.cpu_count()} CPUs (load avg {load0:.1f} before, {os.getloadavg()[0]:.1f} after)")
    print("| executor | ok/failed | makespan s | launch->STEP_START p50 / p95 / max s | launch->container running p50 / p95 / max s |")
    print("|---|---|---|---|---|")
    for r in results:
        s, rr = r["launch_to_step_start_s"], r["launch_to_running_s"]
        running = f"{rr['p50']:.2f} / {rr['p95']:.2f} / {rr['max']:.2f}" if rr["n"] else "n/a (local subprocess)"
        print(f"| {r['executor']} | {r['succeeded']}/{r['failed']} | {r['makespan_s']:.1f} | "
              f"{s['p50']:.2f} / {s['p95']:.2f} / {s['max']:.2f} | {running} |")
    print(f"makespan ratio kubernetes / multiprocess: {ratio:.2f} (target <= 1.3)")


if __name__ == "__main__":
    main()
