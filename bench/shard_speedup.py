"""Benchmark: one large parquet file embedded by one work unit, then as shards by several units side by side.

    bash resources/postgres/postgres.sh start
    PYTHONPATH=$PWD nice -n 10 .venv/bin/python bench/shard_speedup.py [--records 24000] [--shards 4] [--sharded-first]

One generated parquet file (``--records`` short texts, 4 row groups per shard) under a fresh PostgreSQL-backed
DAGSTER_HOME with ``max_concurrent_runs`` = ``--shards``, the real Dagster daemon and gpu_executor's local backend
(bench/shard_location.py; model all-MiniLM-L6-v2 on the CPU, max_seq_length 64):

  1. ``whole``: an asset backfill of the file as one partition: one run, one unit (the baseline, measured in the
     same run of this script);
  2. ``sharded``: the same file with ``CorpusSource(shard_bytes=…)`` cut into ``--shards`` partitions, one run each
     (``max_partitions_per_run=1``), so ``--shards`` local workers embed it side by side.

Makespan: backfill submission -> the end of its last run (run records' end times). Identity: the shards' outputs
concatenated in shard order against the whole file's output: doc_id, record_id, text, text_sha256 equal; vectors'
largest absolute difference. Prints JSON lines and the ratio; writes bench/results/shard_speedup.json (this run; the file kept in the repository
holds the two runs of docs/benchmarks.md), and
``scale.shard_speedup`` (whole makespan ÷ sharded makespan) and ``scale.shard_makespan_ratio`` (sharded ÷ whole)
into bench/results/summary.json only with ``--write-summary`` after a complete, identical run.
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
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import slurm_helpers as H  # noqa: E402
from summary import merge_summary  # noqa: E402

WORDS = ("the a of to and in is it you that he was for on are with as his they be at one have this from or had by "
         "word but what some we can out other were all there when up use your how said an each she which do their "
         "time if will way about many then them write would like so these her long make thing see him two has look").split()


def make_file(path: Path, records: int, row_groups: int) -> int:
    """A parquet file of ``records`` short texts (6–25 words) in ``row_groups`` equal row groups; its size."""
    rng = np.random.default_rng(7)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(6, 26)))) for _ in range(records)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": texts}), path, row_group_size=-(-records // row_groups))
    return path.stat().st_size


def run(variant: str, instance, defs, asset, keys: list[str], ws: Path, env: dict, home: Path) -> dict:
    from dagster_gpu.commands.backfill import DaemonProcess, submit_asset_backfill, wait_for_backfill

    pdef = asset.partitions_def.name
    instance.add_dynamic_partitions(pdef, keys)
    with DaemonProcess(ws, env=env, log_file=home / f"daemon-{variant}.log", instance=instance) as d:
        t0 = time.time()
        bid = submit_asset_backfill(instance, defs, asset.key, keys, title=f"bench-shards-{variant}")
        prog = wait_for_backfill(instance, bid, len(keys), timeout_s=3600, poll_s=2, daemon=d, partitions_def_name=pdef)
    recs = instance.get_run_records(dg.RunsFilter.for_backfill(bid))
    starts = [r.start_time for r in recs if r.start_time]
    ends = [r.end_time for r in recs if r.end_time]
    mds = []
    for k in keys:
        rec = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=asset.key, asset_partitions=[k]), limit=1).records
        mds.append({m: getattr(v, "value", v) for m, v in rec[0].asset_materialization.metadata.items()} if rec else {})
    return {"variant": variant, "partitions": len(keys), "runs": prog.runs, "succeeded": prog.succeeded,
            "failed": prog.failed, "makespan_s": round(max(ends) - t0, 1) if ends else None,
            "first_run_start_s": round(min(starts) - t0, 1) if starts else None,
            "rows": sum(int(m.get("embedding/rows", 0)) for m in mds),
            "embedding_s": [round(float(m.get("embedding/seconds", 0.0)), 1) for m in mds],
            "texts_per_second": [round(float(m.get("embedding/texts_per_second", 0.0)), 1) for m in mds],
            "shards": [m.get("dagster_gpu/shard") for m in mds]}


def identity(out: Path, whole_key: str, shard_keys: list[str]) -> dict:
    from dagster_gpu.definitions.assets import output_uri_for

    full = pq.read_table(output_uri_for(str(out), "whole", whole_key))
    joined = pa.concat_tables([pq.read_table(output_uri_for(str(out), "sharded", k)) for k in shard_keys])
    cols = ["doc_id", "record_id", "text", "text_sha256"]
    same = joined.num_rows == full.num_rows and joined.select(cols).equals(full.select(cols))
    a = np.stack(joined.column("vector").to_numpy(zero_copy_only=False)) if same else None
    b = np.stack(full.column("vector").to_numpy(zero_copy_only=False)) if same else None
    return {"rows_whole": full.num_rows, "rows_sharded": joined.num_rows, "ids_texts_identical": bool(same),
            "vectors_max_abs_diff": float(np.abs(a - b).max()) if same else None,
            "vectors_bit_identical_fraction": round(float((a == b).all(axis=1).mean()), 4) if same else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=24000)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/dagster-gpu-bench-shards"))
    ap.add_argument("--write-summary", action="store_true")
    ap.add_argument("--sharded-first", action="store_true",
                    help="run the sharded backfill before the whole one (the other order of a shared host's load)")
    a = ap.parse_args()
    reason = H.postgres_unavailable_reason()
    if reason:
        sys.exit(f"cannot run: {reason}")
    corpus, out = a.workdir / "corpus", a.workdir / "out"
    size = make_file(corpus / "big.parquet", a.records, 4 * a.shards)
    # just under a quarter: a shard closes after its 4th row group (3 row groups are below it)
    shard_bytes = size // a.shards - size // (16 * a.shards)
    home, env = H.make_dagster_home(max_concurrent_runs=a.shards)
    env = {**env, "SHARD_BENCH_CORPUS": str(corpus), "SHARD_BENCH_OUTPUT": str(out),
           "SHARD_BENCH_SHARD_BYTES": str(shard_bytes), "HF_HUB_OFFLINE": "1", "DAGSTER_GRPC_TIMEOUT_SECONDS": "300"}
    os.environ.update(env)
    ws = home / "workspace.yaml"
    ws.write_text(f"load_from:\n  - python_file:\n      relative_path: {REPO / 'bench' / 'shard_location.py'}\n"
                  f"      working_directory: {REPO}\n      location_name: shards\n")
    import shard_location as loc

    whole_keys = [f.key for f in loc.whole_corpus.list_files()]
    shard_keys = [f.key for f in loc.sharded_corpus.list_files()]
    print(json.dumps({"file_bytes": size, "records": a.records, "shard_bytes": shard_bytes, "shard_keys": shard_keys}),
          flush=True)
    assert len(whole_keys) == 1 and len(shard_keys) == a.shards, (whole_keys, shard_keys)
    res = {"file_bytes": size, "records": a.records, "shards": a.shards, "cpus": os.cpu_count(),
           "order": "sharded, whole" if a.sharded_first else "whole, sharded", "load_average_before": os.getloadavg()[0]}
    with dg.DagsterInstance.get() as instance:
        order = [("whole", loc.whole, whole_keys), ("sharded", loc.sharded, shard_keys)]
        for variant, asset, keys in (order[::-1] if a.sharded_first else order):
            res[variant] = run(variant, instance, loc.defs, asset, keys, ws, env, home)
            print(json.dumps(res[variant]), flush=True)
    res["identity"] = identity(out, whole_keys[0], shard_keys)
    w, s = res["whole"]["makespan_s"], res["sharded"]["makespan_s"]
    res["makespan_ratio"] = round(s / w, 3) if w and s else None
    res["speedup"] = round(w / s, 3) if w and s else None
    print(json.dumps({"identity": res["identity"], "makespan_ratio_sharded_vs_whole": res["makespan_ratio"],
                      "speedup": res["speedup"]}), flush=True)
    (REPO / "bench" / "results" / "shard_speedup.json").write_text(json.dumps(res, indent=1) + "\n")
    complete = (res["whole"]["failed"] == res["sharded"]["failed"] == 0 and res["identity"]["ids_texts_identical"]
                and res["speedup"] is not None)
    if a.write_summary and complete:
        merge_summary({"scale.shard_speedup": res["speedup"], "scale.shard_makespan_ratio": res["makespan_ratio"]})


if __name__ == "__main__":
    main()
