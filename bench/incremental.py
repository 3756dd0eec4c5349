"""Incremental re-embedding: change 5 % of the records over ~10 % of the files, re-embed those files with reuse,
against a full re-embed of the corpus measured in the same run.

    .venv/bin/python bench/incremental.py [--files 1000] [--records 10] [--device auto] [--json]

Steps (one model, one encoder, every figure from the same process):
1. a corpus from bench/make_corpus.py; every file embedded (the previous outputs, fingerprint F);
2. 10 % of the files changed: half their records edited, inserted or deleted in turn (5 % of the corpus's records);
3. incremental pass: the changed files only (what the corpus sensor requests: their source versions changed),
   ``embed_partition(reuse=True)`` into the previous outputs;
4. baseline: a full re-embed of the changed corpus, every file, ``reuse=False`` into another directory.

``incremental.gpu_seconds_ratio`` = the incremental pass's device-seconds ÷ the full re-embed's. A partition's
measured GPU-seconds are devices × its wall interval (dagster_gpu.billing.measured, billing.apportion), so with
one device the ratio of summed ``EmbeddingResult.seconds`` (read+embed+write, model load excluded) is the
ratio of measured GPU-seconds. ``incremental.min_cosine_changed``: the lowest cosine between a row the
incremental pass embedded and the same row of the full re-embed; reused rows are checked bit-identical to the
previous output (``incremental.reused_identical``).

Where the incremental pass's time goes: the seconds inside ``reuse.load_previous`` (reading and indexing the
previous output) are timed around that call, and a fifth pass re-embeds the same changed files again with reuse,
nothing changed since (every row reused but the records at the model's token limit): its seconds are the
per-file cost that reuse cannot remove (read, hash, plan, write, load the previous output). The rest of the
incremental pass is the embedding of its new or changed texts.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_corpus import make_corpus  # noqa: E402

from dagster_gpu.corpus.readers import TextFormat  # noqa: E402
import dagster_gpu.embedding.pipeline as pipeline_mod  # noqa: E402
from dagster_gpu.embedding.model import load_model  # noqa: E402
from dagster_gpu.embedding.pipeline import embed_partition, make_encoder  # noqa: E402

FORTUNE = TextFormat(format="text", record_separator_line="%")
FP = "fp1-bench0000incr00"


def records_of(p: Path) -> list[str]:
    return [r for r in p.read_text(encoding="utf-8").rstrip("\n").split("\n%\n")]


def mutate(files: list[Path], share_files: float = 0.10, share_records: float = 0.05) -> tuple[list[Path], int]:
    """Change ``share_records`` of all records, spread over ``share_files`` of the files (evenly spaced): edits,
    insertions and deletions in turn. Returns (changed files, records changed)."""
    total = sum(len(records_of(p)) for p in files)
    picked = files[:: max(1, round(1 / share_files))]
    per_file = max(1, round(total * share_records / len(picked)))
    changed = 0
    for n, p in enumerate(picked):
        recs = records_of(p)
        for k in range(min(per_file, len(recs) - 1)):
            i = (k * 7 + n) % len(recs)
            kind = (k + n) % 3  # in turn over the records of a file and across files (1 change a file: all kinds)
            if kind == 0:
                recs[i] = recs[i] + " (revised)"
            elif kind == 1:
                recs.insert(i, f"Inserted record {n}.{k}: the corpus changed here.")
            else:
                del recs[i]
            changed += 1
        p.write_text("\n%\n".join(recs) + "\n", encoding="utf-8")
    return picked, changed


def vectors(path: Path) -> np.ndarray:
    t = pq.read_table(path, columns=["vector"])
    return np.asarray(t.column("vector").combine_chunks().flatten().to_numpy(), np.float32).reshape(t.num_rows, -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--records", type=int, default=10)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--json", action="store_true", help="print the summary keys as JSON")
    ap.add_argument("--baseline-from-first-pass", action="store_true",
                    help="the full re-embed's unchanged files take their first pass's measured seconds (the same "
                         "reuse=False work on the same bytes) and only the changed files are re-embedded for it: one "
                         "full pass fewer on a slow host")
    a = ap.parse_args()
    model = load_model("all-MiniLM-L6-v2", device=a.device)
    enc = make_encoder(model.model, a.batch_size)
    lineage = {"fingerprint": FP, "model": model.name, "model_revision": model.revision}

    load_s = [0.0]
    _load_previous = pipeline_mod.load_previous

    def timed_load_previous(*args, **kw):
        t = time.perf_counter()
        try:
            return _load_previous(*args, **kw)
        finally:
            load_s[0] += time.perf_counter() - t

    pipeline_mod.load_previous = timed_load_previous

    def run(src: Path, out: Path, reuse: bool):
        return embed_partition(str(src), str(out), model, FORTUNE, encoder=enc, partition_key=src.name,
                               reuse=reuse, lineage=lineage)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus, prev, full = root / "corpus", root / "out", root / "full"
        make_corpus(corpus, a.files, a.records)
        files = sorted(corpus.iterdir())
        run(files[0], root / "warm.parquet", False)  # warm-up (allocator, threads)
        first = {p.name: run(p, prev / f"{p.name}.parquet", False) for p in files}
        before = {p.name: vectors(prev / f"{p.name}.parquet") for p in files}
        before_hash = {p.name: pq.read_table(prev / f"{p.name}.parquet", columns=["text_sha256"]).column(0).to_pylist()
                       for p in files}
        changed, n_changed = mutate(files)
        load_s[0] = 0.0
        inc = [run(p, prev / f"{p.name}.parquet", True) for p in changed]
        inc_load_s = load_s[0]
        changed_names = {p.name for p in changed}
        base = [run(p, full / f"{p.name}.parquet", False) if p.name in changed_names or not a.baseline_from_first_pass
                else first[p.name] for p in files]
        min_cos, identical, reused_checked = 1.0, True, 0
        for p in changed:
            t = pq.read_table(prev / f"{p.name}.parquet", columns=["text_sha256", "token_count"])
            v, vf = vectors(prev / f"{p.name}.parquet"), vectors(full / f"{p.name}.parquet")
            old = {h: i for i, h in enumerate(before_hash[p.name])}
            for i, (h, tok) in enumerate(zip(t.column(0).to_pylist(), t.column(1).to_pylist())):
                if h in old and tok < model.max_seq_length:  # reused (unchanged, untruncated): the previous bits
                    identical &= v[i].tobytes() == before[p.name][old[h]].tobytes()
                    reused_checked += 1
                else:
                    min_cos = min(min_cos, float(v[i] @ vf[i] / np.linalg.norm(v[i]) / np.linalg.norm(vf[i])))
        again_dir = root / "again"  # nothing changed since the incremental pass: the cost reuse cannot remove
        again_dir.mkdir()
        for p in changed:
            shutil.copyfile(prev / f"{p.name}.parquet", again_dir / f"{p.name}.parquet")
        load_s[0] = 0.0
        again = [run(p, again_dir / f"{p.name}.parquet", True) for p in changed]
        again_load_s = load_s[0]
    inc_s, base_s = sum(r.seconds for r in inc), sum(r.seconds for r in base)
    base_changed_s = sum(r.seconds for r in base if Path(r.output_uri).name[: -len(".parquet")] in {p.name for p in changed})
    reused = sum(r.reused_rows for r in inc)
    rows = sum(r.rows for r in base)
    summary = {
        "incremental.gpu_seconds_ratio": round(inc_s / base_s, 4),
        "incremental.min_cosine_changed": round(min_cos, 7),
        "incremental.reused_identical": bool(identical and reused_checked == reused),
        "incremental.files": len(files),
        "incremental.records": rows,
        "incremental.unchanged_pass_ratio": round(sum(r.seconds for r in again) / base_s, 4),
    }
    print(f"device {model.device}; {len(files)} files, {rows} records; {n_changed} records changed "
          f"({n_changed / rows:.1%}) in {len(changed)} files"
          + ("; full re-embed: the unchanged files' first-pass seconds" if a.baseline_from_first_pass else ""))
    print(f"{'pass':<36}{'files':>7}{'rows':>8}{'embedded':>10}{'seconds':>10}{'ratio':>8}")
    print(f"{'full re-embed (reuse=False)':<36}{len(files):>7}{rows:>8}{rows:>10}{base_s:>10.2f}{1.0:>8.3f}")
    print(f"{'changed files, reuse=False':<36}{len(changed):>7}{sum(r.rows for r in inc):>8}"
          f"{sum(r.rows for r in inc):>10}{base_changed_s:>10.2f}{base_changed_s / base_s:>8.3f}")
    print(f"{'incremental (changed files, reuse)':<36}{len(changed):>7}{sum(r.rows for r in inc):>8}"
          f"{sum(r.rows for r in inc) - reused:>10}{inc_s:>10.2f}{inc_s / base_s:>8.3f}")
    again_s = sum(r.seconds for r in again)
    print(f"{'same files again, nothing changed':<36}{len(changed):>7}{sum(r.rows for r in again):>8}"
          f"{sum(r.rows - r.reused_rows for r in again):>10}{again_s:>10.2f}{again_s / base_s:>8.3f}")
    print(f"incremental pass: {inc_s:.2f} s = {inc_s / len(changed) * 1000:.1f} ms/file, of which load_previous "
          f"{inc_load_s:.2f} s; nothing-changed pass {again_s:.2f} s ({again_s / len(changed) * 1000:.1f} ms/file, "
          f"load_previous {again_load_s:.2f} s): embedding the new or changed texts ~{inc_s - again_s:.2f} s; "
          f"full re-embed {base_s / len(files) * 1000:.1f} ms/file")
    print(f"reused rows {reused} ({reused_checked} checked, bit-identical to the previous output: {identical}); "
          f"min cosine of embedded rows vs the full re-embed {min_cos:.7f}")
    if a.json:
        print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
