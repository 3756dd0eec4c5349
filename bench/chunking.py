"""Chunking on a long-document corpus: token coverage (truncation vs chunking) and the overhead of cutting windows.

Corpus: the license texts Debian's base-files ships (``pipelines.make_licenses.license_records``: 14 documents,
225-5,644 words). Model: the packaged all-MiniLM-L6-v2 (max_seq_length 256).

- ``chunking.token_coverage``: tokens of the records that reached the model ÷ tokens in the records, with
  ``TokenChunks(max_tokens=256)`` (``chunking.token_coverage_truncated``: the same without chunking).
- ``chunking.overhead_ratio``: seconds of ``Encoder(chunking=…).encode(texts)`` ÷ seconds of
  ``Encoder().encode(windows)``, where ``windows`` are the chunked run's own chunk texts
  (``text[char_start:char_end]``) given as plain texts: the same forward passes, without the cutting. Both in
  this process, alternated, best of ``--repeats`` each (the baseline measured in the same run).
- ``chunking.min_cosine_vs_st_encode_own_text``: the smallest cosine, over every chunk, between the chunk's
  vector and ``SentenceTransformer.encode(text[char_start:char_end])`` (windows start and end on word
  boundaries, so the chunk's text re-tokenizes to the window's ids; ``rows_same_ids_as_own_text`` in the JSON: the
  share of chunks whose text re-tokenizes to exactly the ids the model was fed).

    python bench/chunking.py [--device cpu] [--repeats 3] [--summary]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--summary", action="store_true", help="merge the figures into bench/results/summary.json")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "chunking_cpu.json"))
    a = ap.parse_args()

    import numpy as np

    from dagster_gpu.embedding.chunking import TokenChunks
    from dagster_gpu.embedding.encoder import Encoder
    from dagster_gpu.embedding.model import load_model
    from pipelines.make_licenses import license_records

    texts = [r["text"] for r in license_records()]
    m = load_model("all-MiniLM-L6-v2", device=a.device)
    chunks = TokenChunks(max_tokens=a.max_tokens)
    with Encoder(m.model, a.batch_size) as plain, Encoder(m.model, a.batch_size, chunking=chunks) as chunked:
        trunc = plain.encode(texts)
        cut = chunked.encode(texts)
        windows = [texts[i][s:e] for i, s, e in zip(cut.record_index.tolist(), cut.char_start.tolist(), cut.char_end.tolist())]
        times = {"chunked": [], "windows_as_texts": []}
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            chunked.encode(texts)
            times["chunked"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            plain.encode(windows)
            times["windows_as_texts"].append(time.perf_counter() - t0)
        ids_same = same_ids(chunked, m, texts, windows)
    same = plain_check(m, windows, cut)
    res = {
        "device": m.device, "records": len(texts), "record_tokens": int(cut.record_tokens.sum()),
        "chunks": int(len(cut.vectors)), "max_tokens": a.max_tokens,
        "token_coverage_truncated": float(trunc.token_coverage), "token_coverage_chunked": float(cut.token_coverage),
        "records_truncated": int(trunc.truncated_rows),
        "seconds_chunked_best": min(times["chunked"]), "seconds_windows_best": min(times["windows_as_texts"]),
        "seconds": times, "min_cosine_chunk_vs_window_text": same, "rows_same_ids_as_own_text": ids_same,
    }
    res["overhead_ratio"] = res["seconds_chunked_best"] / res["seconds_windows_best"]
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "seconds"}, indent=2))
    if a.summary:
        from summary import merge_summary

        merge_summary({"chunking.token_coverage": round(res["token_coverage_chunked"], 4),
                       "chunking.token_coverage_truncated": round(res["token_coverage_truncated"], 4),
                       "chunking.overhead_ratio": round(res["overhead_ratio"], 3),
                       "chunking.min_cosine_vs_st_encode_own_text": round(res["min_cosine_chunk_vs_window_text"], 6)})
    _ = np
    return 0


def same_ids(enc, m, texts, windows) -> float:
    """Share of chunks whose text's ``SentenceTransformer.preprocess`` ids equal the ids the chunked run fed
    for that window (``Encoder._tokenize``: the rows in output order)."""
    import numpy as np

    tok, _ = enc._tokenize(texts)
    fed = np.split(tok.flat, np.cumsum(tok.lengths)[:-1])
    feats = m.model.preprocess(windows)
    ids, mask = feats["input_ids"].numpy(), feats["attention_mask"].numpy().astype(bool)
    return float(np.mean([row[msk].tolist() == f.tolist() for row, msk, f in zip(ids, mask, fed)]))


def plain_check(m, windows, cut) -> float:
    """Smallest cosine between a chunk's vector and SentenceTransformer.encode of its text (a sanity check that
    the windows timed as plain texts are the same inputs)."""
    import numpy as np

    ref = m.model.encode(windows, normalize_embeddings=True, convert_to_numpy=True, batch_size=32)
    v = np.asarray(cut.vectors, np.float32)
    cos = (v * ref).sum(1) / (np.linalg.norm(v, axis=1) * np.linalg.norm(ref, axis=1))
    return float(cos.min())


if __name__ == "__main__":
    raise SystemExit(main())
