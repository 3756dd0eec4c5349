"""Benchmark: recall@10 and query p50 of an existing million-row index at several (ef, nprobes) and at the product's
default nprobes, against exact search over the same rows in the same run (LanceDB 0.40.0, CPU).

    .venv/bin/python bench/index_scale.py --rows 1000000 --base 15000 --queries 100 --work /tmp/idx-work/scale15k ...
    .venv/bin/python bench/index_probes.py --work /tmp/idx-work/scale15k --base 15000 --queries 100 [--grid 100:60 200:40]

Reads the table ``scale`` and the query vectors (``base-<base>-<queries>.npz``) that ``bench/index_scale.py`` left in
``--work``; the baseline is numpy's exact top 10 over every row of the table (cosine = dot: normalised vectors).
Measured, one query at a time, each query set twice for the p50 (the first pass warms the caches):

- each ``ef:nprobes`` of ``--grid`` on the table opened once (as ``bench/index_scale.py`` measures);
- the product's default (:func:`dagster_gpu.index.rows.default_nprobes` of the rows the index covers, ef 100,
  refine 4) on the table opened once, and through :meth:`dagster_gpu.index.lance.VectorIndex.search`, which opens
  the table at every query (what ``dagster-gpu search`` does).

Writes bench/results/index_probes.json; with ``--summary``, ``index.recall_at_10_1m`` and ``index.query_p50_ms_1m``
(the default nprobes, the table opened once) to bench/results/summary.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--base", type=int, default=15000)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--grid", nargs="*", default=["100:20", "100:40", "100:60", "100:80", "200:40", "200:60", "300:40"],
                    help="ef:nprobes pairs measured on the table opened once")
    ap.add_argument("--summary", action="store_true")
    a = ap.parse_args(argv)

    import numpy as np

    from dagster_gpu.index.lance import DEFAULT_EF, DEFAULT_REFINE_FACTOR, VECTOR_COLUMN, VectorIndex
    from dagster_gpu.index.rows import recall_at_k
    from summary import merge_summary

    qvec = np.load(a.work / f"base-{a.base}-{a.queries}.npz")["q"]
    ix = VectorIndex(str(a.work / "lance"), "scale")
    tbl = ix.open()
    t = tbl.search().select(["partition_key", "index_row", VECTOR_COLUMN]).limit(None).to_arrow()
    ids = list(zip(t.column("partition_key").to_pylist(), t.column("index_row").to_pylist()))
    vec = np.stack(t.column(VECTOR_COLUMN).to_numpy(zero_copy_only=False)).astype(np.float32)
    exact = [[ids[i] for i in np.argsort(-s)[:10]] for s in qvec @ vec.T]
    del t, vec
    cols = ["partition_key", "index_row", "_distance"]

    def measure(run) -> dict:
        """recall@10 and p50/p95 ms of ``run(query) -> arrow table`` over the queries (the second of two passes)."""
        for _ in range(2):
            got, ms = [], []
            for q in qvec:
                t1 = time.perf_counter()
                r = run(q)
                ms.append((time.perf_counter() - t1) * 1000)
                got.append(list(zip(r.column("partition_key").to_pylist(), r.column("index_row").to_pylist())))
        ms.sort()
        return {"recall_at_10": round(recall_at_k(exact, got, 10), 3), "p50_ms": round(statistics.median(ms), 2),
                "p95_ms": round(ms[int(0.95 * len(ms)) - 1], 2)}

    def opened_once(ef: int, nprobes: int):
        return lambda q: (tbl.search(q.tolist(), vector_column_name=VECTOR_COLUMN).distance_type("cosine").limit(10)
                          .ef(ef).refine_factor(DEFAULT_REFINE_FACTOR).nprobes(nprobes).select(cols).to_arrow())

    res: dict = {"rows": len(ids), "queries": len(qvec), "refine_factor": DEFAULT_REFINE_FACTOR, "grid": {}}
    for pair in a.grid:
        ef, nprobes = (int(x) for x in pair.split(":"))
        res["grid"][pair] = measure(opened_once(ef, nprobes))
        print(json.dumps({pair: res["grid"][pair]}), flush=True)
    default = ix._default_nprobes(tbl)
    res["default_nprobes"] = default
    res["default_opened_once"] = measure(opened_once(DEFAULT_EF, default))
    res["default_vectorindex_search"] = measure(lambda q: ix.search(q, 10, columns=["partition_key", "index_row"]))
    print(json.dumps({k: res[k] for k in ("default_nprobes", "default_opened_once", "default_vectorindex_search")}))
    (REPO / "bench" / "results" / "index_probes.json").write_text(json.dumps(res, indent=1) + "\n")
    if a.summary and len(ids) >= 1_000_000:
        merge_summary({"index.recall_at_10_1m": res["default_opened_once"]["recall_at_10"],
                       "index.query_p50_ms_1m": res["default_opened_once"]["p50_ms"]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
