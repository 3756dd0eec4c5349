"""The vector index at a million rows: load rate against reading the parquet, ANN recall@10 and query p50,
and the incremental update after 1 % new rows against a full build (LanceDB 0.40.0, CPU only).

    nice -n 10 .venv/bin/python bench/index_scale.py [--rows 1000000] [--base 6000] [--per-partition 10000]
        [--queries 200] [--work DIR] [--no-summary]

**The vectors.** ``--base`` real texts are embedded: the fortune records of ``/usr/share/games/fortunes`` (the
demo's corpus, split on ``%`` lines as ``bench/index_bench.py`` does), each cut to its first 160 characters,
with all-MiniLM-L6-v2 (:class:`dagster_gpu.embedding.encoder.Encoder`, normalised float32, CPU). ``--queries``
further records' first lines (never in the base) are the queries. The million rows are derived from the base
by interpolating between real neighbours (SMOTE, Chawla et al. 2002, "SMOTE: Synthetic Minority Over-sampling
Technique", JAIR 16): for each row pick a base vector ``b_i`` uniformly, one of its 10 nearest base vectors
``b_j`` (exact cosine), ``lam ~ U(0, 1)``, and keep ``normalize(b_i + lam * (b_j - b_i))``. Every row lies on a
segment between two real embeddings that are neighbours, so a query's nearest rows are the mixtures of the
real texts nearest to it: the neighbour structure is the real corpus's, made denser (random vectors' neighbours
are meaningless). Seeded (``--seed``).

**Steps** (one process, one run; every ratio's two sides measured here):

1. the rows as ``--rows / --per-partition`` embedding outputs (the real writer, zstd parquet);
2. baseline: read every output with pyarrow (``pq.read_table``, page cache warm) — rows/s;
3. load every output into a new LanceDB table on disk as the index asset does
   (:func:`dagster_gpu.definitions.vector_index.load_partitions`: read, append since each partition is new, count
   back, the next output read on a thread during this one's commit) — rows/s, ``index.load_ratio_vs_parquet`` =
   load rate / read rate; the baseline, in the same run: the same outputs into a second table one after the other
   (:func:`~dagster_gpu.definitions.vector_index.load_partition`: read, then commit) —
   ``load_speedup_vs_sequential``; then 5 partitions loaded again with new vectors (the replace path, one
   ``merge_insert`` each) for their rate;
4. full build: :meth:`VectorIndex.ensure_ann_index` (compaction, ``partition_key`` BTREE, IVF_HNSW_SQ
   cosine) — seconds;
5. queries: exact top 10 by numpy over all rows (cosine = dot: normalised), ANN top 10 one query at a time
   (table opened once, ``ef`` 100): ``index.recall_at_10_1m``, ``index.query_p50_ms_1m``; a few queries'
   exact LanceDB search (``bypass_vector_index``) checked against numpy's;
6. 1 % new rows (one new partition, derived the same way), loaded, then ``ensure_ann_index`` again (since
   2026-12-05: ``"deferred"``, the new rows stay out of the index and are searched exactly beside it; never
   LanceDB's ``optimize``, which folded the IVF lists into one): ``index.update_1pct_deferred_ratio`` = its
   seconds / step 4's; recall measured again over all rows;
7. the rebuild that comes once the rows out of the index pass ``max_unindexed_fraction`` (forced here with 0):
   drop, compaction, both indices built again — seconds against step 4's (``index.rebuild_ratio_<size>``), recall
   after it; what 1 % of new rows costs on average, one rebuild per ``DEFAULT_MAX_UNINDEXED_FRACTION`` of new
   rows: ``index.update_1pct_ratio`` = rebuild ratio × 0.01 / 0.1 (``--skip-rebuild`` leaves both out);
8. the baseline of the old update path, in the same run: 1 % more rows, then LanceDB's ``optimize`` (what
   ``ensure_ann_index`` called before 2026-12-05) — seconds against step 4's, recall after it
   (``--skip-optimize-baseline`` leaves it out).

Recall and p50 are measured at each ``--nprobes`` with ``--refine`` (default: ``VectorIndex.search``'s).
Writes bench/results/index_scale.json (``index_scale_<rows>.json`` for other sizes) and merges the ``index.*``
keys into bench/results/summary.json: a million rows writes ``index.recall_at_10_1m``, ``index.query_p50_ms_1m``
and ``index.update_1pct_ratio`` / ``index.update_1pct_deferred_ratio``; another size writes the same figures under keys naming it (``..._100k``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def base_texts(n_base: int, n_queries: int) -> tuple[list[str], list[str]]:
    """``n_base`` fortune records (first 160 characters) and ``n_queries`` other records' first lines."""
    from index_bench import fortune_files

    recs = [r for v in fortune_files().values() for r in v]
    if len(recs) < n_base + n_queries:
        raise SystemExit(f"the fortunes hold {len(recs)} records, fewer than --base + --queries")
    import random

    random.Random(7).shuffle(recs)
    return [r[:160] for r in recs[:n_base]], [r.splitlines()[0][:160] for r in recs[n_base:n_base + n_queries]]


def smote(base, n: int, rng, k: int = 10):
    """``n`` rows, each ``normalize(b_i + lam (b_j - b_i))`` for a random base row i, one of its k nearest base
    rows j (cosine, itself excluded) and lam ~ U(0, 1); float32 [n, dim]."""
    import numpy as np

    sims = base @ base.T
    np.fill_diagonal(sims, -np.inf)
    nn = np.argpartition(-sims, k, axis=1)[:, :k]
    i = rng.integers(0, len(base), n)
    j = nn[i, rng.integers(0, k, n)]
    lam = rng.random(n, dtype=np.float32)[:, None]
    v = base[i] + lam * (base[j] - base[i])
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v.astype(np.float32)


def exact_top(qvec, vectors, k: int = 10):
    """Row numbers of each query's k nearest rows by cosine (vectors normalised), best first."""
    import numpy as np

    out = []
    for s in range(0, len(qvec), 50):
        sims = qvec[s:s + 50] @ vectors.T
        top = np.argpartition(-sims, k, axis=1)[:, :k]
        order = np.take_along_axis(sims, top, 1).argsort(axis=1)[:, ::-1]
        out.extend(np.take_along_axis(top, order, 1))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--per-partition", type=int, default=10_000)
    ap.add_argument("--base", type=int, default=6000, help="real texts embedded (default 6000)")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--ef", type=int, default=None, help="HNSW ef at query time (default: VectorIndex.search's)")
    ap.add_argument("--nprobes", type=int, nargs="+", default=[20, 50],
                    help="IVF lists searched per query, each measured (the first is the headline; LanceDB's default is 20)")
    ap.add_argument("--ef-construction", type=int, default=100, help="HNSW ef_construction of the build (default 100)")
    ap.add_argument("--rows-per-list", type=int, default=None,
                    help="rows per IVF list (default: dagster_gpu.index.rows.ROWS_PER_LIST, what ensure_ann_index uses)")
    ap.add_argument("--refine", type=int, default=None, help="refine_factor of the queries (default: VectorIndex.search's)")
    ap.add_argument("--skip-rebuild", action="store_true", help="leave out step 7 (the forced rebuild)")
    ap.add_argument("--skip-optimize-baseline", action="store_true",
                    help="leave out step 8 (1 %% more rows, then LanceDB's optimize: the update path before 2026-12-05)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tables-in", type=Path, default=None,
                    help="directory for the LanceDB tables (default: --work; /dev/shm keeps the disk's write-back out "
                         "of the load rate, as the page cache keeps it out of the read rate)")
    ap.add_argument("--load-only", action="store_true", help="stop after the load rates (step 3, before its replace path); use with --out")
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a new temp dir, removed)")
    ap.add_argument("--no-summary", action="store_true")
    ap.add_argument("--out", default=None, help="results file name under bench/results/ (default: index_scale[_<rows>].json)")
    args = ap.parse_args(argv)

    import numpy as np
    import pyarrow.parquet as pq

    from dagster_gpu.embedding.encoder import Encoder
    from dagster_gpu.embedding.model import load_model
    from dagster_gpu.embedding.writer import AtomicParquetWriter, lineage_metadata, output_schema, output_table
    from dagster_gpu.definitions.vector_index import load_partition, load_partitions
    from dagster_gpu.index.lance import DEFAULT_EF, DEFAULT_REFINE_FACTOR, VectorIndex
    from dagster_gpu.index.rows import DEFAULT_MAX_UNINDEXED_FRACTION, recall_at_k

    ef = args.ef or DEFAULT_EF
    refine = args.refine or DEFAULT_REFINE_FACTOR
    size = "1m" if args.rows == 1_000_000 else f"{args.rows // 1000}k"
    own_work = args.work is None
    work = args.work or Path(tempfile.mkdtemp(prefix="index_scale-"))
    shutil.rmtree(work / "out", ignore_errors=True)
    shutil.rmtree(work / "lance", ignore_errors=True)
    if args.tables_in:
        shutil.rmtree(args.tables_in / "lance", ignore_errors=True)
    res: dict = {"rows": args.rows, "per_partition": args.per_partition, "base": args.base, "queries": args.queries, "ef": ef,
                 "nprobes": args.nprobes, "ef_construction": args.ef_construction,
                 "refine_factor": refine}
    cpu0, t00 = cpu_s(), time.perf_counter()

    def phase(name, **kv):
        print(json.dumps({"phase": name, "cpu_s": round(cpu_s() - cpu0, 1), "wall_s": round(time.perf_counter() - t00, 1), **kv}), flush=True)

    # 1. real embeddings of a real corpus, densified
    texts, qtexts = base_texts(args.base, args.queries)
    cache = work / f"base-{args.base}-{args.queries}.npz"
    if cache.exists():
        z = np.load(cache)
        base, qvec = z["base"], z["q"]
    else:
        model = load_model("all-MiniLM-L6-v2", device="cpu")
        enc = Encoder(model.model, 64)
        base, qvec = enc.encode(texts).vectors, enc.encode(qtexts).vectors
        np.savez(cache, base=base, q=qvec)
    phase("embed", base=len(base))
    rng = np.random.default_rng(args.seed)
    n_parts = args.rows // args.per_partition
    vectors = smote(base, n_parts * args.per_partition, rng)
    extra = smote(base, args.rows // 100, rng)  # the 1 % update
    dim = vectors.shape[1]
    kv = lineage_metadata(fingerprint="fp1-scale", model="all-MiniLM-L6-v2", model_revision="bench",
                          lineage={"normalize": True, "output_dtype": "float32"})
    schema = output_schema(dim, metadata=kv)

    def write(name: str, vec) -> str:
        n = len(vec)
        t = output_table(schema, doc_ids=[f"{name}/{i}" for i in range(n)], record_ids=np.arange(n), chunk_index=np.zeros(n, np.int64),
                         char_start=np.zeros(n, np.int64), char_end=np.full(n, 100, np.int64), token_count=np.zeros(n, np.int64),
                         hashes=[f"{i:064x}" for i in range(n)], vectors=vec)
        uri = str(work / "out" / f"{name}.parquet")
        with AtomicParquetWriter(uri, schema) as w:
            w.write(t)
        return uri

    keys = [f"part-{p:04d}.jsonl" for p in range(n_parts)]
    uris = {k: write(k, vectors[p * args.per_partition:(p + 1) * args.per_partition]) for p, k in enumerate(keys)}
    phase("write", partitions=n_parts)

    # 2. baseline: read the parquet (twice: the first pass warms the page cache)
    for k in keys:
        pq.read_table(uris[k])
    t0 = time.perf_counter()
    for k in keys:
        pq.read_table(uris[k])
    read_s = time.perf_counter() - t0
    # 3. load (append path) as the index asset does (the next output read during this one's commit), then the
    #    same one partition after the other (read, then commit: the baseline) into a second table; then the replace
    #    path on 5 partitions
    rows = n_parts * args.per_partition
    tables = args.tables_in or work
    ix = VectorIndex(str(tables / "lance"), "scale")
    ix.db()  # import lancedb and connect (once per process, like importing pyarrow for the baseline): not timed
    t0 = time.perf_counter()
    for done in load_partitions(ix, keys, uris.__getitem__):
        f = done.facts
        assert f is not None and f["index_rows"] == f["output_rows"] and f["mode"] == "append", (done.partition_key, done)
    load_s = time.perf_counter() - t0
    seq = VectorIndex(str(tables / "lance_sequential"), "scale")
    seq.db()
    t0 = time.perf_counter()
    for k in keys:
        f = load_partition(seq, k, uris[k])
        assert f["index_rows"] == f["output_rows"] and f["mode"] == "append", (k, f)
    seq_s = time.perf_counter() - t0
    shutil.rmtree(tables / "lance_sequential", ignore_errors=True)
    res.update({"tables_in": str(tables), "parquet_read_rows_per_s": round(rows / read_s), "load_rows_per_s": round(rows / load_s),
                "index.load_ratio_vs_parquet": round(read_s / load_s, 3),
                "sequential_load_rows_per_s": round(rows / seq_s), "sequential_load_ratio_vs_parquet": round(read_s / seq_s, 3),
                "load_speedup_vs_sequential": round(seq_s / load_s, 3)})
    phase("load", **{k: res[k] for k in ("parquet_read_rows_per_s", "load_rows_per_s", "index.load_ratio_vs_parquet",
                                          "sequential_load_rows_per_s", "sequential_load_ratio_vs_parquet",
                                          "load_speedup_vs_sequential")})
    if args.load_only:
        return finish(args, res, size, work, own_work, cpu0, t00)
    changed = keys[:5]
    t0 = time.perf_counter()
    for p, k in enumerate(changed):
        vectors[p * args.per_partition:(p + 1) * args.per_partition] = smote(base, args.per_partition, rng)
        uris[k] = write(k, vectors[p * args.per_partition:(p + 1) * args.per_partition])
    rewrite_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for k in changed:
        f = load_partition(ix, k, uris[k])
        assert f["index_rows"] == f["output_rows"] and f["mode"] == "replace" and f["updated"] == args.per_partition, (k, f)
    replace_s = time.perf_counter() - t0
    res.update({"replace_rows_per_s": round(len(changed) * args.per_partition / replace_s), "rewrite_s": round(rewrite_s, 2)})
    phase("replace", replace_rows_per_s=res["replace_rows_per_s"])

    # 4. full build
    t0 = time.perf_counter()
    lists = -(-rows // args.rows_per_list) if args.rows_per_list else None
    res["lists"] = lists
    state = ix.ensure_ann_index(min_rows=1000, ef_construction=args.ef_construction, num_partitions=lists)
    build_s = time.perf_counter() - t0
    res.update({"ann_state": state, "ann_build_s": round(build_s, 2)})
    phase("build", state=state, seconds=round(build_s, 1))

    # 5. queries
    def query(all_vectors, all_ids):
        """{nprobes: (recall@10, p50 ms)} over the queries, and the recall of LanceDB's exact search on 5."""
        tbl = ix.open()
        exact = [[all_ids[r] for r in top] for top in exact_top(qvec, all_vectors)]
        cols = ["partition_key", "index_row", "_distance"]
        search = lambda q: tbl.search(q.tolist(), vector_column_name="vector").distance_type("cosine").limit(10)
        for q in qvec[:10]:  # warm the index cache
            search(q).ef(max(ef, 10 * refine)).refine_factor(refine).select(cols).to_arrow()
        out = {}
        for nprobes in args.nprobes:
            got, ms = [], []
            for q in qvec:
                t1 = time.perf_counter()
                r = search(q).ef(max(ef, 10 * refine)).refine_factor(refine).nprobes(nprobes).select(cols).to_arrow()
                ms.append((time.perf_counter() - t1) * 1000)
                got.append(list(zip(r.column("partition_key").to_pylist(), r.column("index_row").to_pylist())))
            out[nprobes] = (recall_at_k(exact, got, 10), statistics.median(ms))
        lance_exact = []
        for q in qvec[:5]:
            r = search(q).bypass_vector_index().select(cols).to_arrow()
            lance_exact.append(list(zip(r.column("partition_key").to_pylist(), r.column("index_row").to_pylist())))
        return out, recall_at_k(exact[:5], lance_exact, 10)

    ids = [(k, i) for k in keys for i in range(args.per_partition)]
    by_nprobes, exact_check = query(vectors, ids)
    recall, p50 = by_nprobes[args.nprobes[0]]
    res.update({f"index.recall_at_10_{size}": round(recall, 4), f"index.query_p50_ms_{size}": round(p50, 2),
                "by_nprobes": {str(k): {"recall_at_10": round(v[0], 4), "p50_ms": round(v[1], 2)} for k, v in by_nprobes.items()},
                "lance_exact_vs_numpy_recall": round(exact_check, 4)})
    phase("query", by_nprobes=res["by_nprobes"], lance_exact_check=exact_check)

    # 6. 1 % new rows, then the incremental update
    new_key = "part-new.jsonl"
    uri = write(new_key, extra)
    t0 = time.perf_counter()
    f = load_partition(ix, new_key, uri)
    add_s = time.perf_counter() - t0
    assert f["mode"] == "append", f
    t0 = time.perf_counter()
    state2 = ix.ensure_ann_index(min_rows=1000, ef_construction=args.ef_construction, num_partitions=lists)
    update_s = time.perf_counter() - t0
    res.update({"update_state": state2, "update_rows": len(extra), "update_load_s": round(add_s, 2), "update_s": round(update_s, 2),
                f"index.update_1pct_deferred_ratio_{size}": round(update_s / build_s, 4)})
    phase("update", state=state2, seconds=round(update_s, 2), ratio=round(update_s / build_s, 4))
    all_vectors, all_ids = np.concatenate([vectors, extra]), ids + [(new_key, i) for i in range(len(extra))]
    after, _ = query(all_vectors, all_ids)
    res["after_update_by_nprobes"] = {str(k): {"recall_at_10": round(v[0], 4), "p50_ms": round(v[1], 2)} for k, v in after.items()}
    res[f"index.recall_at_10_after_update_{size}"] = round(after[args.nprobes[0]][0], 4)
    phase("after_update", after_update=res["after_update_by_nprobes"])

    # 7. the rebuild that follows once too many rows are out of the index (forced: max_unindexed_fraction 0)
    if not args.skip_rebuild:
        t0 = time.perf_counter()
        state3 = ix.ensure_ann_index(min_rows=1000, ef_construction=args.ef_construction, max_unindexed_fraction=0.0,
                                     num_partitions=-(-len(all_ids) // args.rows_per_list) if args.rows_per_list else None)
        rebuild_s = time.perf_counter() - t0
        res.update({"rebuild_state": state3, "rebuild_s": round(rebuild_s, 2), "rebuild_ratio": round(rebuild_s / build_s, 4),
                    f"index.rebuild_ratio_{size}": round(rebuild_s / build_s, 4),
                    # what 1 % of new rows costs on average: one rebuild per max_unindexed_fraction of new rows
                    f"index.update_1pct_ratio_{size}": round(rebuild_s / build_s * 0.01 / DEFAULT_MAX_UNINDEXED_FRACTION, 4)})
        rebuilt, _ = query(all_vectors, all_ids)
        res["after_rebuild_by_nprobes"] = {str(k): {"recall_at_10": round(v[0], 4), "p50_ms": round(v[1], 2)} for k, v in rebuilt.items()}
        phase("rebuild", state=state3, rebuild_ratio=res["rebuild_ratio"], after_rebuild=res["after_rebuild_by_nprobes"])

    # 8. for comparison, the update path before 2026-12-05: 1 % more rows, then LanceDB's optimize
    if not args.skip_optimize_baseline:
        extra2 = smote(base, args.rows // 100, rng)
        f = load_partition(ix, "part-new2.jsonl", write("part-new2.jsonl", extra2))
        t0 = time.perf_counter()
        ix.open().optimize()
        opt_s = time.perf_counter() - t0
        res.update({"optimize_s": round(opt_s, 2), "optimize_ratio": round(opt_s / build_s, 4)})
        old_path, _ = query(np.concatenate([all_vectors, extra2]), all_ids + [("part-new2.jsonl", i) for i in range(len(extra2))])
        res["after_optimize_by_nprobes"] = {str(k): {"recall_at_10": round(v[0], 4), "p50_ms": round(v[1], 2)} for k, v in old_path.items()}
        phase("optimize_baseline", ratio=res["optimize_ratio"], after_optimize=res["after_optimize_by_nprobes"])
    return finish(args, res, size, work, own_work, cpu0, t00)


def finish(args, res: dict, size: str, work: Path, own_work: bool, cpu0: float, t00: float) -> int:
    """Print and keep the results (``bench/results/``, the summary's ``index.*`` keys), remove an own scratch dir."""
    res.update({"cpu_s": round(cpu_s() - cpu0, 1), "wall_s": round(time.perf_counter() - t00, 1)})
    print(json.dumps({"phase": "done", "cpu_s_total": res["cpu_s"]}), flush=True)
    print(json.dumps(res), flush=True)
    out = REPO / "bench" / "results" / (args.out or ("index_scale.json" if args.rows == 1_000_000 else f"index_scale_{args.rows}.json"))
    out.write_text(json.dumps(res, indent=1) + "\n")
    if not args.no_summary:
        from summary import merge_summary

        # another size than a million: every key names it (the load ratio too), the million-row keys stay as measured
        # (the million-row update keys drop the size: index.update_1pct_ratio, index.update_1pct_deferred_ratio)
        merge_summary({(k.removesuffix("_1m") if k.startswith("index.update_1pct") else
                        k if size == "1m" or k.endswith(f"_{size}") else f"{k}_{size}"): v
                       for k, v in res.items() if k.startswith("index.")})
    if own_work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
