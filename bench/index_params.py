"""ANN index parameters against recall and query time: one table, one index, a grid of query settings
(LanceDB 0.40.0, CPU only).

    nice -n 10 .venv/bin/python bench/index_params.py --base-cache DIR/base-2000-100.npz [--rows 100000]
        [--kind IVF_HNSW_SQ] [--rows-per-list 4096] [--nprobes 5,10,20] [--refine 1,4] [--ef 100]
        [--ef-construction 100] [--sub-vectors N] [--tail 0.01,0.04] [--optimize]

The vectors are ``bench/index_scale.py``'s (SMOTE interpolation between real MiniLM embeddings, seeded; the base
and the queries from the ``.npz`` cache that ``index_scale.py --work DIR`` writes), loaded as partitions of
10,000 rows (a tenth of ``--rows`` below 100,000). The index is built with ``create_index`` alone (its seconds
printed; no compaction or BTREE, unlike ``VectorIndex.ensure_ann_index``). For every ``--nprobes`` x ``--refine``
it prints recall@10 against numpy's exact top 10 and the query p50, and the p50 of LanceDB's exact search of the
same table in the same run (the baseline: ``p50_ratio_vs_exact``). ``--tail``: fractions of new rows appended
one after the other and left unindexed (each measured again: what a deferred update costs a query).
``--optimize``: after 1 % new rows, LanceDB's ``optimize`` and the grid again (the update path before
2026-12-05). One JSON object per line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-cache", type=Path, required=True, help="the .npz of base vectors and queries (index_scale.py)")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--kind", default="IVF_HNSW_SQ", choices=["IVF_HNSW_SQ", "IVF_PQ"])
    ap.add_argument("--rows-per-list", type=int, default=4096)
    ap.add_argument("--nprobes", default="5,10,20")
    ap.add_argument("--refine", default="1,4")
    ap.add_argument("--ef", type=int, default=100)
    ap.add_argument("--ef-construction", type=int, default=100)
    ap.add_argument("--sub-vectors", type=int, default=None, help="IVF_PQ sub-vectors (default LanceDB's)")
    ap.add_argument("--tail", default="")
    ap.add_argument("--optimize", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)

    import numpy as np
    from lancedb.index import HnswSq, IvfPq

    from dagster_gpu.index.lance import VectorIndex
    from dagster_gpu.index.rows import index_rows, recall_at_k
    from index_scale import exact_top, smote
    from tests.index_helpers import output_rows

    z = np.load(args.base_cache)
    base, qvec = z["base"], z["q"]
    rng = np.random.default_rng(args.seed)
    per = 10_000 if args.rows >= 100_000 else max(1, args.rows // 10)
    vectors = smote(base, args.rows // per * per, rng)
    work = Path(tempfile.mkdtemp(prefix="index_params-"))
    ix = VectorIndex(str(work / "lance"), "t")
    ids: list = []

    def load(key, v):
        t, _ = output_rows(len(v), v.shape[1], pk=key, fingerprint="fp", vectors=v)
        ix.write_partition(key, index_rows(t, key, "fp"))
        ids.extend((key, i) for i in range(len(v)))

    for p in range(len(vectors) // per):
        load(f"p{p}", vectors[p * per:(p + 1) * per])
    tbl = ix.open()
    tbl.optimize()
    lists = max(1, -(-len(vectors) // args.rows_per_list))
    cfg = (HnswSq(distance_type="cosine", num_partitions=lists, ef_construction=args.ef_construction)
           if args.kind == "IVF_HNSW_SQ" else
           IvfPq(distance_type="cosine", num_partitions=lists, **({"num_sub_vectors": args.sub_vectors} if args.sub_vectors else {})))
    t0 = time.perf_counter()
    tbl.create_index("vector", config=cfg, replace=True, wait_timeout=timedelta(minutes=60))
    build_s = time.perf_counter() - t0
    print(json.dumps({"rows": len(vectors), "kind": args.kind, "lists": lists, "build_s": round(build_s, 2)}), flush=True)

    def grid(allv, tag):
        tbl = ix.open()
        exact = [[ids[r] for r in top] for top in exact_top(qvec, allv)]
        search = lambda q: tbl.search(q.tolist(), vector_column_name="vector").distance_type("cosine").limit(10)
        ms = []
        for q in qvec:
            t1 = time.perf_counter()
            search(q).bypass_vector_index().select(["index_row", "_distance"]).to_arrow()
            ms.append((time.perf_counter() - t1) * 1000)
        exact_p50 = statistics.median(ms)
        for nprobes in map(int, args.nprobes.split(",")):
            for refine in map(int, args.refine.split(",")):
                got, ms = [], []
                for q in qvec:
                    t1 = time.perf_counter()
                    s = search(q).nprobes(nprobes).refine_factor(refine)
                    if args.kind == "IVF_HNSW_SQ":
                        s = s.ef(max(args.ef, 10 * refine))
                    r = s.select(["partition_key", "index_row", "_distance"]).to_arrow()
                    ms.append((time.perf_counter() - t1) * 1000)
                    got.append(list(zip(r.column("partition_key").to_pylist(), r.column("index_row").to_pylist())))
                p50 = statistics.median(ms)
                print(json.dumps({"tag": tag, "nprobes": nprobes, "refine": refine, "recall_at_10": round(recall_at_k(exact, got, 10), 4),
                                  "p50_ms": round(p50, 2), "exact_p50_ms": round(exact_p50, 2),
                                  "p50_ratio_vs_exact": round(p50 / exact_p50, 3)}), flush=True)

    grid(vectors, "built")
    for frac in [float(x) for x in args.tail.split(",") if x]:
        extra = smote(base, int(args.rows * frac), rng)
        load(f"tail-{frac}", extra)
        vectors = np.concatenate([vectors, extra])
        grid(vectors, f"unindexed+{frac}")
    if args.optimize:
        extra = smote(base, args.rows // 100, rng)
        load("new", extra)
        vectors = np.concatenate([vectors, extra])
        t0 = time.perf_counter()
        ix.open().optimize()
        opt_s = time.perf_counter() - t0
        st = ix.open().index_stats("vector_idx")
        print(json.dumps({"optimize_s": round(opt_s, 2), "ratio_to_build": round(opt_s / build_s, 4),
                          "num_indices": st.num_indices, "unindexed": st.num_unindexed_rows}), flush=True)
        grid(vectors, "after_optimize")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
