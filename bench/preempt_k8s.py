"""Benchmark: a step pod preempted by the real kube-scheduler is launched again and finishes (Kubernetes 1.34).

    resources/k8s/cluster.sh start; resources/postgres/postgres.sh start
    .venv/bin/python bench/preempt_k8s.py [--sleep 15] [--repeat 3]

Per repetition, on the same host one after the other (tests/test_k8s_preemption_e2e.py's scenario):
  1. baseline: one partition of ``k8s_preemptible`` (``--sleep`` s of work in a batch-priority pod asking 40
     of the node's 64 CPUs), not preempted;
  2. preempted: the same, and once its pod runs an online pod of a higher PriorityClass asks 40 CPUs for 8 s:
     kube-scheduler preempts the step pod, the executor launches the unit again (``-p1``) when the CPUs free.
Prints and records: whether each preempted run succeeded with the partition materialized once and both
pods billed (``preempt.k8s_requeued_ok``: all did), the relaunch delay (the first pod's container end ->
the launch event of ``-p1``, s, median), and the makespan ratio preempted ÷ baseline (median; the online
pod's 8 s hold the CPUs in between).

Writes ``bench/results/preempt_k8s.json`` and merges the ``preempt.k8s_*`` keys into bench/results/summary.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import dagster as dg  # noqa: E402
import pytest  # noqa: E402

from summary import merge_summary  # noqa: E402
from tests.conftest import pg_settings  # noqa: E402
from tests.k8s_helpers import k8s_dagster_instance  # noqa: E402
from tests.test_k8s_e2e import _backfill, _observation  # noqa: E402
from tests.test_k8s_preemption_e2e import _preempted_once  # noqa: E402

OUT = REPO / "bench" / "results" / "preempt_k8s.json"


def _one(key: str, sleep_s: float, preempt: bool) -> dict:
    from tests import k8s_pipeline as p

    mp = pytest.MonkeyPatch()
    tmp = Path(tempfile.mkdtemp(prefix="preempt-k8s-"))
    try:
        with k8s_dagster_instance(pg_settings(), tmp, mp) as instance:
            t0 = time.time()
            if preempt:
                final, run, _story, seen = _preempted_once(instance, tmp, mp, key, max_preemptions=3, sleep_s=sleep_s)
            else:
                for k, v in (("K8S_TEST_CPU_REQUEST", "40"), ("K8S_TEST_PRIORITY_CLASS", "dagster-gpu-batch")):
                    mp.setenv(k, v)
                _, final = _backfill(instance, p.k8s_preemptible, [key], tmp, sleep_s=sleep_s, timeout_s=400)
                run, seen = instance.get_runs(dg.RunsFilter(tags={"dagster/partition": key}))[0], {}
            rec = instance.get_run_record_by_id(run.run_id)
            run = rec.dagster_run
            makespan = (rec.end_time or time.time()) - t0
            mats = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=p.k8s_preemptible.key, asset_partitions=[key]), limit=5).records
            out = {"preempted": preempt, "succeeded": final.succeeded == 1 and run.status == dg.DagsterRunStatus.SUCCESS,
                   "materializations": len(mats), "makespan_s": round(makespan, 2)}
            if preempt:
                launches = [r for r in instance.get_records_for_run(
                    run.run_id, of_type=dg.DagsterEventType.STEP_WORKER_STARTING).records]
                for _ in range(60):  # both pods' bills (the settler writes them as the run ends)
                    bills = _observation(instance, p.k8s_preemptible.key, key)
                    if len(bills) >= 2:
                        break
                    time.sleep(1)
                first = next((b for b in bills if b["k8s/pod"] == seen.get("first")), None)
                out.update(launches=len(launches), bills=len(bills))
                if first is not None and len(launches) == 2:
                    out["relaunch_delay_s"] = round(launches[1].event_log_entry.timestamp - first["k8s/finished_at"], 2)
            return out
    finally:
        mp.undo()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sleep", type=float, default=15.0, help="seconds of work in the step (default 15)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-summary", action="store_true")
    args = ap.parse_args()
    rows = []
    for i in range(args.repeat):
        for preempt in (False, True):
            r = _one(f"k{40 + 2 * i + int(preempt):03d}", args.sleep, preempt)
            rows.append(r)
            print(json.dumps(r), flush=True)
    base = [r["makespan_s"] for r in rows if not r["preempted"] and r["succeeded"]]
    pre = [r for r in rows if r["preempted"]]
    ok = all(r["succeeded"] and r["materializations"] == 1 and r.get("launches") == 2 and r.get("bills") == 2 for r in pre)
    delays = [r["relaunch_delay_s"] for r in pre if "relaunch_delay_s" in r]
    ratio = statistics.median(r["makespan_s"] for r in pre) / statistics.median(base) if base and pre else None
    result = {"sleep_s": args.sleep, "repeat": args.repeat, "rows": rows, "k8s_requeued_ok": ok,
              "relaunch_delay_s_median": statistics.median(delays) if delays else None,
              "makespan_ratio_preempted_vs_not": round(ratio, 3) if ratio else None}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(f"preempted runs requeued and materialized once, every pod billed: {ok}; relaunch delay median "
          f"{result['relaunch_delay_s_median']} s; makespan preempted / not preempted: {result['makespan_ratio_preempted_vs_not']}")
    if not args.no_summary:
        merge_summary({"preempt.k8s_requeued_ok": ok, "preempt.k8s_relaunch_delay_s": result["relaunch_delay_s_median"],
                       "preempt.k8s_makespan_ratio_vs_not_preempted": result["makespan_ratio_preempted_vs_not"]})
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
