"""prompts.min_cosine_vs_st_encode: the smallest cosine, over every row, between ``Encoder(prompt=...)`` and
``SentenceTransformer.encode(texts, prompt_name=..., prompt=..., normalize_embeddings=True)`` on the prompt test
models (tests/prompt_models.py: the packaged MiniLM with e5-style prompts, default "document"; one with a
Pooling include_prompt=False), the cases of tests/test_prompts.py, over fortunes (or generated texts).

    python bench/prompt_cosine.py [--texts 512] [--json bench/results/prompt_cosine.json] [--summary]

``--summary`` merges ``prompts.min_cosine_vs_st_encode`` into bench/results/summary.json (bench/summary.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

CASES = [{}, {"prompt_name": "query"}, {"prompt_name": "document"}, {"prompt": "Represent this sentence: "},
         {"prompt": ""}]


def texts(n: int) -> tuple[list[str], str]:
    fortunes = Path("/usr/share/games/fortunes")
    out: list[str] = []
    if fortunes.is_dir():
        for f in sorted(fortunes.iterdir()):
            if f.is_file() and not f.suffix:
                out += [t.strip() for t in f.read_text(errors="replace").split("\n%\n") if t.strip()]
            if len(out) >= n:
                return out[:n], "fortunes"
    rng = np.random.default_rng(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda café 日本語 🙂".split()
    while len(out) < n:
        out.append(" ".join(rng.choice(words, int(rng.integers(1, 400)))))
    return out[:n], "generated"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=512)
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--summary", action="store_true")
    args = ap.parse_args()
    from sentence_transformers import SentenceTransformer

    from dagster_gpu.embedding.encoder import Encoder
    from dagster_gpu.embedding.prompts import resolve_prompt
    from prompt_models import make_prompt_model

    tx, source = texts(args.texts)
    t0 = time.perf_counter()
    rows, worst = [], 1.0
    with tempfile.TemporaryDirectory(prefix="prompt-cosine-") as d:
        for include in (True, False):
            st = SentenceTransformer(str(make_prompt_model(Path(d) / f"m{include}", include_prompt=include)), device="cpu")
            for case in CASES:
                prompt, name = resolve_prompt(st, **case)
                ref = st.encode(tx, batch_size=64, normalize_embeddings=True, **case)
                with Encoder(st, 64, prompt=prompt, cpu_share=False) as enc:
                    v = enc.encode(tx).vectors
                a, b = v.astype(np.float64), ref.astype(np.float64)
                cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
                rows.append({"include_prompt": include, "case": case, "prompt": prompt, "rows": len(tx),
                             "min_cosine": float(cos.min()), "mean_cosine": float(cos.mean())})
                worst = min(worst, float(cos.min()))
                print(f"include_prompt={include!s:5} {json.dumps(case):40} prompt={prompt!r:28} "
                      f"min cosine {cos.min():.7f} over {len(tx)} rows")
    result = {"benchmark": "prompt_cosine", "texts": len(tx), "corpus": source, "min_cosine": worst,
              "target": 0.9999, "seconds": time.perf_counter() - t0, "cases": rows}
    print(f"prompts.min_cosine_vs_st_encode = {worst:.7f} ({len(rows)} cases x {len(tx)} {source} rows; target >= 0.9999)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    if args.summary:
        from summary import merge_summary

        merge_summary({"prompts.min_cosine_vs_st_encode": round(worst, 7)})
    return 0 if worst >= 0.9999 else 1


if __name__ == "__main__":
    sys.exit(main())
