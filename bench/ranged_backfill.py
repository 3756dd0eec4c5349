"""Benchmark: ranged runs on the local Slurm cluster against a plain loop and one run per partition.

    eval "$(bash resources/slurm/cluster.sh env)"; bash resources/postgres/postgres.sh start
    .venv/bin/python bench/ranged_backfill.py [--files 1000] [--per-run 50] [--per-partition-sample 40]

Side by side, in one command, on the same generated corpus (bench/make_corpus.py: fortune records, ~20 a file):
  1. ``loop``: one plain Python process that imports sentence-transformers, loads the model once and embeds
     every file in a loop (read, ``SentenceTransformer.encode``, write parquet): the limit of this box;
  2. ``ranged``: an asset backfill of every file through gpu_executor's slurm backend, in runs of
     ``--per-run`` partitions (``BackfillPolicy.multi_run``), each run's step one array task that embeds its
     whole range;
  3. ``per_partition``: today's path, one run per partition (``max_partitions_per_run=1``), on the first
     ``--per-partition-sample`` files; its makespan for all files is extrapolated from its throughput
     (partitions per second over the sample), which is stated in the output.
A backfill's makespan is from its submission to the end of its last run (``backfill_marked_done_s``: to the
daemon's next tick, which marks it done). Prints JSON lines and the ratios; writes the ``ranged_1000.*`` keys of bench/results/summary.json and the run's
figures to bench/results/ranged_backfill.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

import dagster as dg  # noqa: E402

import slurm_helpers as H  # noqa: E402
from make_corpus import make_corpus  # noqa: E402

from dagster_gpu.billing.keys import GPU_SECONDS, bill_value  # noqa: E402
from dagster_gpu.instance.connections import hold_storage_connections  # noqa: E402
from slurm_backfill import tree_rss  # noqa: E402
from summary import merge_summary  # noqa: E402

LOOP = r"""
import sys, time, hashlib
from pathlib import Path
import pyarrow as pa, pyarrow.parquet as pq
from sentence_transformers import SentenceTransformer
from dagster_gpu.embedding.model import resolve_model_path
corpus, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
model = SentenceTransformer(str(resolve_model_path("all-MiniLM-L6-v2")), device="cpu")
t0 = time.perf_counter()
rows = 0
for f in sorted(corpus.iterdir()):
    texts = [r for r in f.read_text().split("\n%\n") if r.strip()]
    v = model.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
    flat = pa.array(v.reshape(-1), pa.float32())
    pq.write_table(pa.table({"record_id": list(range(len(texts))),
                             "text_sha256": [hashlib.sha256(t.encode()).hexdigest() for t in texts],
                             "vector": pa.FixedSizeListArray.from_arrays(flat, v.shape[1])}), out / (f.name + ".parquet"))
    rows += len(texts)
print(rows, time.perf_counter() - t0)
"""


class RssSampler(threading.Thread):
    """Peak RSS (bytes) of the daemon's process tree: the daemon, its code server and every run worker
    (step workers run as Slurm array tasks, outside this tree), sampled every second."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            self.peak = max(self.peak, tree_rss(self.pid))


def run_loop(corpus: Path, out: Path) -> dict:
    t0 = time.time()
    cp = subprocess.run([sys.executable, "-c", LOOP, str(corpus), str(out)], capture_output=True, text=True,
                        env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=True)
    wall = time.time() - t0
    rows, encode_s = cp.stdout.split()[-2:]
    return {"variant": "loop", "makespan_s": round(wall, 1), "rows": int(rows), "loop_embed_s": round(float(encode_s), 1)}


def all_records(fetch, records_filter) -> list:
    """Every record ``fetch`` (``instance.fetch_materializations`` / ``fetch_observations``) returns for
    ``records_filter``, in pages (Dagster refuses more than 10,000 records per call)."""
    out, cursor = [], None
    while True:
        page = fetch(records_filter, limit=5000, cursor=cursor)
        out.extend(page.records)
        if not page.has_more:
            return out
        cursor = page.cursor


def run_backfill(variant: str, corpus: Path, keys: list[str], per_run: int, max_runs: int, workdir: Path,
                 extra_env: dict[str, str] | None = None, on_progress=None, extra_yaml: str = "") -> dict:
    """One backfill of ``keys`` through the slurm backend in runs of ``per_run``; ``extra_env`` on top of the
    bench's settings (e.g. tests/slurm_pipeline.py's ``DGPU_TEST_SLURM_TRANSPORT`` and its ssh variables);
    ``on_progress(instance, backfill_id, progress)`` at each poll of the backfill (bench/remote_faults.py fires its
    faults from there); ``extra_yaml`` appended to the instance's dagster.yaml."""
    home, env = H.make_dagster_home(max_concurrent_runs=max_runs, extra_yaml=extra_yaml)
    # a fresh output directory: an earlier run's outputs would let the units reuse every vector (embedding nothing)
    shutil.rmtree(workdir / variant, ignore_errors=True)
    env = {**env, **(extra_env or {}), "RANGED_TEST_BACKEND": "slurm", "RANGED_TEST_CORPUS": str(corpus), "RANGED_TEST_OUTPUT": str(workdir / variant),
           "RANGED_TEST_PER_RUN": str(per_run), "RANGED_TEST_RETRIES": "0", "SLURM_TEST_THROTTLE": "4",
           "SLURM_TEST_WINDOW": "3", "SLURM_TEST_MAX_WINDOW": "30", "SLURM_TEST_POLL": "2",
           "DAGSTER_GRPC_TIMEOUT_SECONDS": "300", "HF_HUB_OFFLINE": "1"}  # fmt: skip
    os.environ.update(env)
    ws = home / "workspace.yaml"
    ws.write_text(f"load_from:\n  - python_file:\n      relative_path: {REPO / 'tests' / 'ranged_pipeline.py'}\n"
                  f"      working_directory: {REPO}\n      location_name: ranged\n")
    import importlib

    import ranged_pipeline

    importlib.reload(ranged_pipeline)
    from dagster_gpu.commands.backfill import DaemonProcess, submit_asset_backfill, wait_for_backfill

    asset = ranged_pipeline.ranged_embeddings
    pdef = asset.partitions_def.name
    with dg.DagsterInstance.get() as instance:
        hold_storage_connections(instance, len(keys))  # this poller, like the UI, on a pool
        instance.add_dynamic_partitions(pdef, keys)
        with DaemonProcess(ws, env=env, log_file=home / "daemon.log") as d:
            sampler = RssSampler(d.proc.pid)
            sampler.start()
            t0 = time.time()
            bid = submit_asset_backfill(instance, ranged_pipeline.defs, asset.key, keys, title=f"bench-{variant}")
            prog = wait_for_backfill(instance, bid, len(keys), timeout_s=7200, poll_s=5, daemon=d, partitions_def_name=pdef,
                                     on_progress=on_progress and (lambda p: on_progress(instance, bid, p)))
            marked_done = time.time() - t0
            sampler.stop.set()
            # sacct lags the array task's end: wait for the bills (not a speed limit) while the run workers
            # and the daemon that write them still run
            deadline = time.time() + 300
            while True:
                obs = all_records(instance.fetch_observations, dg.AssetRecordsFilter(asset_key=asset.key))
                if len(obs) >= len(keys) or time.time() > deadline:
                    break
                time.sleep(5)
        # the work's makespan: submission -> the last run's end (the daemon marks the backfill done on its next
        # 30 s tick, dagster._daemon.controller.DEFAULT_DAEMON_INTERVAL_SECONDS; both are reported)
        ends = [r.end_time for r in instance.get_run_records(dg.RunsFilter.for_backfill(bid)) if r.end_time]
        makespan = max(ends) - t0 if ends else marked_done
        recs = all_records(instance.fetch_materializations, dg.AssetRecordsFilter(asset_key=asset.key))
        mds = [{k: v.value for k, v in r.asset_materialization.metadata.items()} for r in recs]
        sched = [bill_value(r.asset_observation.metadata, GPU_SECONDS) for r in obs]
    # what the scheduler billed (sacct, split over each unit's partitions by the observation writer)
    sacct_billed = sum(float(v.value) for v in sched if v is not None)
    embed = sum(m["embedding/seconds"] for m in mds)
    billed = sum(m["billing/wall_seconds"] for m in mds)
    batches = H.spool_batches(Path(env["DAGSTER_GPU_SLURM_SPOOL"]))  # submitted.json: the run worker's side, for any transport
    return {"variant": variant, "partitions": len(keys), "succeeded": prog.succeeded, "failed": prog.failed,
            "runs": prog.runs, "sbatch_calls": len(batches), "makespan_s": round(makespan, 1),
            "backfill_marked_done_s": round(marked_done, 1),
            "embedding_s": round(embed, 1), "billed_s": round(billed, 1),
            "useful_fraction": round(embed / billed, 3) if billed else None,
            "sacct_billed_s": round(sacct_billed, 1), "observations": len(sched),
            "useful_fraction_vs_sacct": round(embed / sacct_billed, 3) if sacct_billed else None,
            "orchestrator_peak_rss_mib": round(sampler.peak / 2**20, 1), "home": str(home)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--records", type=int, default=20)
    ap.add_argument("--per-run", type=int, default=50)
    ap.add_argument("--max-runs", type=int, default=8)
    ap.add_argument("--per-partition-sample", type=int, default=40)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/dagster-gpu-bench-ranged"))
    ap.add_argument("--reuse", type=Path, default=None,
                    help="a bench/results/ranged_backfill.json whose loop and ranged figures to keep (runs only the sample)")
    a = ap.parse_args()
    reason = H.cluster_unavailable_reason() or H.postgres_unavailable_reason()
    if reason:
        sys.exit(f"cannot run: {reason}")
    corpus = a.workdir / "corpus"
    make_corpus(corpus, a.files, a.records)
    keys = sorted(p.name for p in corpus.iterdir())
    if a.reuse:
        res = {k: v for k, v in json.loads(a.reuse.read_text()).items() if k in ("loop", "ranged")}
    else:
        res = {"loop": run_loop(corpus, a.workdir / "loop")}
        print(json.dumps(res["loop"]), flush=True)
        res["ranged"] = run_backfill("ranged", corpus, keys, a.per_run, a.max_runs, a.workdir)
        print(json.dumps(res["ranged"]), flush=True)
        (REPO / "bench" / "results" / "ranged_backfill.json").write_text(json.dumps(res, indent=1) + "\n")
    sample = keys[: a.per_partition_sample]
    pp = run_backfill("per_partition", corpus, sample, 1, a.max_runs, a.workdir)
    pp["extrapolated_makespan_s"] = round(pp["makespan_s"] * len(keys) / len(sample), 1)
    res["per_partition"] = pp
    print(json.dumps(pp), flush=True)
    ratios = {
        "ranged_1000.runs": res["ranged"]["runs"],
        "ranged_1000.sbatch_calls": res["ranged"]["sbatch_calls"],
        "ranged_1000.useful_fraction": res["ranged"]["useful_fraction"],
        "ranged_1000.makespan_ratio_vs_loop": round(res["ranged"]["makespan_s"] / res["loop"]["makespan_s"], 2),
        "ranged_1000.speedup_vs_per_partition": round(pp["extrapolated_makespan_s"] / res["ranged"]["makespan_s"], 1),
    }
    print(json.dumps(ratios), flush=True)
    (REPO / "bench" / "results" / "ranged_backfill.json").write_text(json.dumps({**res, "summary": ratios}, indent=1) + "\n")
    if a.files == 1000:
        merge_summary(ratios)


if __name__ == "__main__":
    main()
