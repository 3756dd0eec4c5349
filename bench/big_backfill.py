"""Benchmark: very large ranges on the local Slurm cluster — a 10,000-partition backfill of tiny files, and how
long Dagster takes to create one run over 3,000 partitions (it writes one planned event per partition).

    eval "$(bash resources/slurm/cluster.sh env)"; bash resources/postgres/postgres.sh start
    .venv/bin/python bench/big_backfill.py [--files 10000] [--per-run 500] [--single-run 3000]

Prints JSON lines; writes ``big_10000.completed`` (partitions materialized) and
``big_10000.orchestrator_peak_rss_mib`` (peak RSS of the daemon, its code server and the run workers) to
bench/results/summary.json and the figures to bench/results/big_backfill.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

import dagster as dg  # noqa: E402

import slurm_helpers as H  # noqa: E402
from make_corpus import make_corpus  # noqa: E402
from ranged_backfill import run_backfill  # noqa: E402
from summary import merge_summary  # noqa: E402


def single_run_creation(keys: list[str], n: int, pooled: bool = False) -> dict:
    """Seconds to create one run over the first ``n`` partitions (planned events included), on a fresh instance.

    ``pooled``: the instance holds pooled connections, as in ``dagster-webserver`` (its defaults: 15 s statement
    timeout, 3,600 s recycle, 20 overflow), where a UI launch of one ranged run is created; else one new
    PostgreSQL connection per query, as in the daemon's backfill loop and the CLI.
    """
    home, env = H.make_dagster_home()
    os.environ.update(env)
    import importlib

    import ranged_pipeline

    importlib.reload(ranged_pipeline)
    from dagster_gpu.partitions.run_ranges import range_run_tags

    asset = ranged_pipeline.ranged_embeddings
    with dg.DagsterInstance.get() as instance:
        if pooled:
            instance.optimize_for_webserver(15000, 3600, 20)
        instance.add_dynamic_partitions(asset.partitions_def.name, keys)
        job = ranged_pipeline.defs.resolve_job_def(ranged_pipeline.ranged_job.name)
        t0 = time.perf_counter()
        run = instance.create_run_for_job(job, tags=range_run_tags(keys[:n]), asset_selection=frozenset({asset.key}))
        created = time.perf_counter() - t0
        planned = instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED).records
    return {"variant": f"create_one_run_over_{n}" + ("_pooled" if pooled else ""), "seconds": round(created, 2), "planned_events": len(planned)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--records", type=int, default=1)
    ap.add_argument("--per-run", type=int, default=500)
    ap.add_argument("--max-runs", type=int, default=8)
    ap.add_argument("--single-run", type=int, default=3000)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/dagster-gpu-bench-big"))
    ap.add_argument("--only-single-run", action="store_true", help="measure run creation only, no backfill")
    a = ap.parse_args()
    reason = H.cluster_unavailable_reason() or H.postgres_unavailable_reason()
    if reason:
        sys.exit(f"cannot run: {reason}")
    corpus = a.workdir / "corpus"
    make_corpus(corpus, a.files, a.records)
    keys = sorted(p.name for p in corpus.iterdir())
    one = single_run_creation(keys, min(a.single_run, len(keys)))
    print(json.dumps(one), flush=True)
    one_pooled = single_run_creation(keys, min(a.single_run, len(keys)), pooled=True)
    print(json.dumps(one_pooled), flush=True)
    if a.only_single_run:
        return
    big = run_backfill("big", corpus, keys, a.per_run, a.max_runs, a.workdir)
    print(json.dumps(big), flush=True)
    figures = {"big_10000.completed": big["succeeded"], "big_10000.orchestrator_peak_rss_mib": big["orchestrator_peak_rss_mib"]}
    (REPO / "bench" / "results" / "big_backfill.json").write_text(json.dumps({"single_run": one, "single_run_pooled": one_pooled, "backfill": big}, indent=1) + "\n")
    if a.files == 10000:
        merge_summary(figures)


if __name__ == "__main__":
    main()
