"""Vector index benchmark: ANN recall@10 against exact search, load speed against parquet alone, query latency.

    .venv/bin/python bench/index_bench.py [--records N] [--queries 200] [--work DIR] [--no-summary]

The corpus is the demo's: the Debian fortunes (``/usr/share/games/fortunes``, one partition per data file,
records separated by ``%`` lines; as ``pipelines/demo.py`` reads them). Steps, all in this process on CPU:

1. embed every record (all-MiniLM-L6-v2, :class:`dagster_gpu.embedding.encoder.Encoder`, normalised float32);
   the first 200 (``--queries``) records' first lines, embedded the same way, are the queries;
2. **baseline**: write each file's rows as the embedding asset's parquet output (the real writer) — rows/s;
3. **index**: load each output into LanceDB as the index asset does (:func:`dagster_gpu.definitions.vector_index.load_partition`:
   read the parquet, one ``merge_insert`` commit per partition) — rows/s and the ratio to the baseline
   (``index.load_rows_per_s_ratio_vs_parquet``: the index is an extra pass over the data, so < 1);
4. build the ANN index (``IVF_HNSW_SQ``, cosine, ``sqrt(rows)`` IVF lists), then for each query the top 10 by
   exact (flat) search and by the ANN index: ``index.recall_at_10`` (mean overlap), ``index.query_p50_ms``
   (ANN, median over the queries, one query at a time, table opened once) and the exact search's p50.

Writes bench/results/index_bench.json and merges the ``index.*`` keys into bench/results/summary.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
FORTUNES = Path("/usr/share/games/fortunes")

from dagster_gpu.index.lance import DEFAULT_EF  # noqa: E402


def fortune_files(directory: Path = FORTUNES) -> dict[str, list[str]]:
    """File name -> its non-empty records (``%``-separated), for every data file (not ``.dat``/``.u8``)."""
    out: dict[str, list[str]] = {}
    for p in sorted(directory.iterdir()):
        if not p.is_file() or p.is_symlink() or p.suffix in (".dat", ".u8"):
            continue
        text = p.read_bytes().decode("utf-8", errors="replace").replace("\r\n", "\n")
        recs = [r.strip("\n") for r in text.split("\n%\n")]
        out[p.name] = [r for r in recs if r.strip() and r.strip() != "%"]
    return {k: v for k, v in out.items() if v}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=None, help="at most N records in all (default: every record)")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--ef", type=int, default=DEFAULT_EF, help=f"HNSW ef at query time (default: VectorIndex.search's, {DEFAULT_EF})")
    ap.add_argument("--nprobes", type=int, default=None, help="IVF lists searched per query (default: LanceDB's, 20)")
    ap.add_argument("--refine", type=int, default=None, help="refine_factor: re-rank refine*k candidates with the full vectors")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--ivf-lists", type=int, default=None, help="IVF lists of the ANN index (default: ivf_partitions(rows))")
    ap.add_argument("--no-summary", action="store_true")
    ap.add_argument("--reuse-vectors", action="store_true",
                    help="take the records' vectors from the outputs a previous run left in --work (skips step 1's corpus embedding)")
    args = ap.parse_args(argv)

    import numpy as np
    import pyarrow.parquet as pq

    from dagster_gpu.embedding.encoder import Encoder
    from dagster_gpu.embedding.model import load_model
    from dagster_gpu.embedding.writer import AtomicParquetWriter, lineage_metadata, output_schema, output_table
    from dagster_gpu.definitions.vector_index import load_partition
    from dagster_gpu.index.lance import VectorIndex
    from dagster_gpu.index.rows import ivf_partitions, recall_at_k
    import hashlib

    files = fortune_files()
    if args.records:
        left, kept = args.records, {}
        for k, v in files.items():
            if left <= 0:
                break
            kept[k], left = v[:left], left - len(v[:left])
        files = kept
    work = args.work or Path(tempfile.mkdtemp(prefix="index_bench-"))
    model = load_model("all-MiniLM-L6-v2", device="cpu")
    enc = Encoder(model.model, 64)
    t0 = time.perf_counter()
    if args.reuse_vectors:
        vectors = {k: np.asarray(pq.read_table(work / "out" / f"{k}.parquet").column("vector").combine_chunks()
                                 .flatten().to_numpy(zero_copy_only=False)).reshape(len(v), model.dim)
                   for k, v in files.items()}
    else:
        vectors = {k: enc.encode(v).vectors for k, v in files.items()}
    embed_s = time.perf_counter() - t0
    shutil.rmtree(work / "out", ignore_errors=True)
    shutil.rmtree(work / "lance", ignore_errors=True)
    all_recs = [r for v in files.values() for r in v]
    queries = [r.splitlines()[0][:200] for r in all_recs[: args.queries]]
    qvec = enc.encode(queries).vectors
    rows = sum(len(v) for v in files.values())
    print(json.dumps({"phase": "embed", "files": len(files), "rows": rows, "seconds": round(embed_s, 1)}), flush=True)

    kv = lineage_metadata(fingerprint="fp1-bench", model="all-MiniLM-L6-v2", model_revision="bench",
                          lineage={"normalize": True, "output_dtype": "float32"})
    schema = output_schema(model.dim, metadata=kv)
    tables = {}
    for k, recs in files.items():
        n = len(recs)
        tables[k] = output_table(schema, doc_ids=[f"{k}/{i}" for i in range(n)], record_ids=list(range(n)),
                                 chunk_index=[0] * n, char_start=[0] * n, char_end=[len(r) for r in recs], token_count=[0] * n,
                                 hashes=[hashlib.sha256(r.encode()).hexdigest() for r in recs], vectors=vectors[k])
    t0 = time.perf_counter()
    uris = {}
    for k, t in tables.items():
        uris[k] = str(work / "out" / f"{k}.parquet")
        with AtomicParquetWriter(uris[k], schema) as w:
            w.write(t)
    parquet_s = time.perf_counter() - t0
    ix = VectorIndex(str(work / "lance"), "fortunes")
    t0 = time.perf_counter()
    for k in tables:
        facts = load_partition(ix, k, uris[k])
        assert facts["index_rows"] == facts["output_rows"], (k, facts)
    index_s = time.perf_counter() - t0
    print(json.dumps({"phase": "load", "parquet_rows_per_s": round(rows / parquet_s), "index_rows_per_s": round(rows / index_s)}), flush=True)

    t0 = time.perf_counter()
    state = ix.ensure_ann_index(min_rows=1000, num_partitions=args.ivf_lists)
    build_s = time.perf_counter() - t0
    tbl = ix.open()
    key = lambda t: list(zip(t.column("partition_key").to_pylist(), t.column("index_row").to_pylist()))

    def run(exact: bool):
        out, ms = [], []
        for v in qvec:
            t1 = time.perf_counter()
            q = tbl.search(v.tolist(), vector_column_name="vector").distance_type("cosine").limit(10).select(["partition_key", "index_row", "_distance"])
            if exact:
                q = q.bypass_vector_index()
            else:
                q = q.ef(args.ef) if args.ef else q
                q = q.nprobes(args.nprobes) if args.nprobes else q
                q = q.refine_factor(args.refine) if args.refine else q
            res = q.to_arrow()
            ms.append((time.perf_counter() - t1) * 1000)
            out.append(key(res))
        return out, ms

    run(False)  # warm the index cache once
    exact, exact_ms = run(True)
    approx, ann_ms = run(False)
    recall = recall_at_k(exact, approx, 10)
    res = {
        "rows": rows, "files": len(files), "queries": len(queries), "ann": state, "ef": args.ef, "nprobes": args.nprobes, "refine_factor": args.refine, "ivf_lists": args.ivf_lists or ivf_partitions(rows), "ann_build_s": round(build_s, 2),
        "index.recall_at_10": round(recall, 4),
        "index.load_rows_per_s": round(rows / index_s),
        "index.parquet_rows_per_s": round(rows / parquet_s),
        "index.load_rows_per_s_ratio_vs_parquet": round(parquet_s / index_s, 3),
        "index.query_p50_ms": round(statistics.median(ann_ms), 2),
        "index.exact_query_p50_ms": round(statistics.median(exact_ms), 2),
    }
    print(json.dumps(res), flush=True)
    (REPO / "bench" / "results" / "index_bench.json").write_text(json.dumps(res, indent=1) + "\n")
    if not args.no_summary and args.records is None:
        from summary import merge_summary

        merge_summary({k: v for k, v in res.items() if k.startswith("index.")})
    print(f"recall@10 {recall:.3f} (ANN vs exact, {len(queries)} queries); load {rows / index_s:.0f} rows/s into "
          f"LanceDB vs {rows / parquet_s:.0f} rows/s to parquet alone (ratio {parquet_s / index_s:.2f}); "
          f"query p50 {res['index.query_p50_ms']} ms ANN, {res['index.exact_query_p50_ms']} ms exact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
