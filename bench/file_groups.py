"""File groups against one partition per file: many small JSON files embedded in process on a real Dagster
instance (SQLite, the packaged MiniLM), then one file changed and one deleted.

    .venv/bin/python bench/file_groups.py [--files 1000] [--buckets 16] [--device cpu] [--json]

Steps, every figure from the same process:
1. ``--files`` JSON Lines files of 1-3 records each (``doc-00042.json``);
2. grouped: ``CorpusSource(group_buckets=--buckets)``, every bucket materialized by one unit (one ranged run):
   seconds, partitions, event-log records;
3. one file changed (one record rewritten, one added) and another deleted: the stale buckets (versions changed)
   re-materialized, one run each: seconds, rows embedded and reused;
4. per file: ``CorpusSource()`` over the first corpus, every file one partition, one unit over all of them
   (``--per-file-limit`` files at most, the figure scaled to the whole corpus is reported apart);
5. the group reader alone over the whole corpus: files per second with 1 and with 8 files read at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq


def _texts(i: int) -> list[str]:
    return [f"document {i} paragraph {j}: notes on topic {i * 7 + j} and its neighbours" for j in range(1 + i % 3)]


def _write(d: Path, i: int, texts: list[str]) -> None:
    (d / f"doc-{i:05d}.json").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def _events(instance) -> int:
    """Event-log records of the instance's latest run."""
    return len(instance.all_logs(instance.get_runs()[0].run_id)) if instance.get_runs() else 0


def _materialize(instance, asset, keys) -> float:
    from dagster_gpu.partitions.run_ranges import range_run_tags

    t0 = time.perf_counter()
    how = {"partition_key": keys[0]} if len(keys) == 1 else {"tags": range_run_tags(keys)}
    assert dg.materialize([asset], instance=instance, **how).success
    return time.perf_counter() - t0


def _md(instance, asset_key, key) -> dict:
    rec = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[key]),
                                          limit=1).records[0]
    return {k: getattr(v, "value", v) for k, v in rec.asset_materialization.metadata.items()}


def main() -> None:
    from dagster_gpu import CorpusSource, embedding_asset
    from dagster_gpu.corpus.group_reads import read_group_batches
    from dagster_gpu.definitions.asset_options import ComputeSpec
    from dagster_gpu.corpus.readers import ReadStats, TextFormat
    from dagster_gpu.definitions.assets import output_uri_for

    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--buckets", type=int, default=16)
    ap.add_argument("--per-file-limit", type=int, default=200)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out: dict = {"files": a.files, "buckets": a.buckets}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus_dir = root / "corpus"
        corpus_dir.mkdir()
        for i in range(a.files):
            _write(corpus_dir, i, _texts(i))
        records = sum(len(_texts(i)) for i in range(a.files))
        out["records"] = records
        grouped = CorpusSource(url=str(corpus_dir), group_buckets=a.buckets)
        asset = embedding_asset("emb", corpus=grouped, output=str(root / "out"),
                                compute=ComputeSpec(device=a.device, max_partitions_per_run=a.buckets))
        with dg.instance_for_test() as instance:
            groups = grouped.list_files()
            keys = [g.key for g in groups]
            instance.add_dynamic_partitions("emb_files", keys)
            out["grouped_partitions"] = len(keys)
            out["grouped_seconds"] = round(_materialize(instance, asset, keys), 2)
            out["grouped_event_records"] = _events(instance)
            home = {m.key: g.key for g in groups for m in g.members}
            changed, deleted = "doc-00004.json", "doc-00011.json"
            _write(corpus_dir, 4, [_texts(4)[0], "document 4, rewritten", "document 4, a new paragraph"])
            later = os.path.getmtime(corpus_dir / changed) + 5
            os.utime(corpus_dir / changed, (later, later))
            (corpus_dir / deleted).unlink()
            before = {g.key: g.version for g in groups}
            after = grouped.list_files()
            stale = sorted(g.key for g in after if before.get(g.key) != g.version)
            t = 0.0
            rows = reused = 0
            for k in stale:
                t += _materialize(instance, asset, [k])
                md = _md(instance, asset.key, k)
                rows += md["embedding/rows"]
                reused += md["embedding/reused_rows"]
            out["change"] = {"stale_buckets": stale, "changed_file_bucket": home[changed],
                             "deleted_file_bucket": home[deleted], "seconds": round(t, 2), "rows": rows,
                             "reused_rows": reused, "embedded_rows": rows - reused,
                             "deleted_rows_left": sum(
                                 1 for k in stale for x in pq.read_table(output_uri_for(str(root / "out"), "emb", k),
                                                                         columns=["doc_id"]).column(0).to_pylist()
                                 if x.startswith(deleted))}
        # per file, on a fresh corpus of the first --per-file-limit files
        n = min(a.files, a.per_file_limit)
        per_dir = root / "per_file"
        per_dir.mkdir()
        for i in range(n):
            _write(per_dir, i, _texts(i))
        per_file = CorpusSource(url=str(per_dir))
        asset2 = embedding_asset("emb_files", corpus=per_file, output=str(root / "out2"),
                                 compute=ComputeSpec(device=a.device, max_partitions_per_run=n))
        with dg.instance_for_test() as instance:
            keys = [f.key for f in per_file.list_files()]
            instance.add_dynamic_partitions("emb_files_files", keys)
            s = _materialize(instance, asset2, keys)
            out["per_file"] = {"files": n, "partitions": len(keys), "seconds": round(s, 2),
                               "event_records": _events(instance),
                               "seconds_scaled_to_all_files": round(s * a.files / n, 1)}
        members = grouped.list_files()
        files = [m for g in members for m in g.members]
        for parallel in (1, 8):
            t0 = time.perf_counter()
            for g in members:
                for _ in read_group_batches(g.members, TextFormat(), 4096, ReadStats(), parallel_files=parallel):
                    pass
            s = time.perf_counter() - t0
            out[f"group_read_files_per_second_parallel_{parallel}"] = round(len(files) / s, 1)
    print(json.dumps(out, indent=None if a.json else 2))


if __name__ == "__main__":
    main()
