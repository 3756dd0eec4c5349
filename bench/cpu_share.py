"""Two (or more) concurrent local workers on one host: torch threads shared vs each taking every CPU (issue 9).

Each worker is a fresh interpreter (as the local backend starts them) that loads the model, then
embeds the same fortune file with ``embed_partition`` on CPU; the workers start their timed part
together (a barrier file). Modes, alternating per repetition:

* ``share``: the default — ``cpus.CpuShare`` gives each of the k live workers ``cpus // k`` threads;
* ``all``: ``DAGSTER_GPU_CPU_SHARE=0`` — every worker sets torch to all the CPUs it was given (what
  ``os.cpu_count()``-sized thread pools do), k × cpus threads on cpus cores.

Reported per mode: each worker's wall seconds, torch threads, texts/s, and the aggregate texts/s
(all workers' texts ÷ the wall time until the last one ends); medians over the repetitions.

    .venv/bin/python bench/cpu_share.py --workers 2 --texts 300 --reps 2 --json /tmp/cpu_share.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

WORKER = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from dagster_gpu.corpus.readers import TextFormat
from dagster_gpu.embedding.model import load_model
from dagster_gpu.embedding.pipeline import embed_partition
from dagster_gpu.embedding.spec import EmbeddingSpec
corpus, out, barrier, batch = sys.argv[2], sys.argv[3], Path(sys.argv[4]), int(sys.argv[5])
lm = load_model("all-MiniLM-L6-v2", device="cpu")
(barrier.parent / f"ready-{os.getpid()}").touch()
while not barrier.exists():
    time.sleep(0.01)
t0 = time.time(); c0 = time.process_time()
res = embed_partition(corpus, out, lm, TextFormat(format="text", record_separator_line="%"), spec=EmbeddingSpec(batch_size=batch))
print(json.dumps({"rows": res.rows, "seconds": time.time() - t0, "cpu_seconds": time.process_time() - c0,
                  "start": t0, "end": time.time(), "torch_threads": res.torch_threads}))
"""


def run_mode(mode: str, workers: int, corpus: Path, work: Path, batch: int) -> dict:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "DAGSTER_GPU_CPU_SHARE_DIR": str(work / "share")}
    if mode == "all":
        env["DAGSTER_GPU_CPU_SHARE"] = "0"
    barrier_dir = Path(tempfile.mkdtemp(dir=work))
    barrier = barrier_dir / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(REPO), str(corpus), str(work / f"out-{mode}-{i}.parquet"),
                               str(barrier), str(batch)], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for i in range(workers)]
    while len(list(barrier_dir.glob("ready-*"))) < workers:
        if any(p.poll() is not None for p in procs):
            raise SystemExit(f"a {mode} worker died while loading the model")
        time.sleep(0.05)
    barrier.touch()
    results = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"{mode} worker failed with exit code {p.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    return {"mode": mode, "workers": results, "span_seconds": span,
            "aggregate_texts_per_s": sum(r["rows"] for r in results) / span}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--texts", type=int, default=300, help="texts per worker (fortune records, cycled)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO / "bench"))
    from embed_throughput import corpus_records, write_corpus

    from dagster_gpu.embedding.cpus import allotted_cpus

    work = Path(tempfile.mkdtemp(prefix="cpu-share-"))
    records, desc = corpus_records(args.texts)
    corpus = work / "corpus.txt"
    write_corpus(corpus, records)
    runs = []
    for rep in range(args.reps):
        for mode in (("share", "all") if rep % 2 == 0 else ("all", "share")):
            r = run_mode(mode, args.workers, corpus, work, args.batch_size)
            r["rep"] = rep + 1
            runs.append(r)
            w = r["workers"]
            print(f"rep {rep + 1} {mode:<5}: torch threads {[x['torch_threads'] for x in w]}, worker seconds "
                  f"{[round(x['seconds'], 1) for x in w]}, CPU seconds {[round(x['cpu_seconds'], 1) for x in w]}, "
                  f"aggregate {r['aggregate_texts_per_s']:.1f} texts/s over {r['span_seconds']:.1f} s", flush=True)
    med = {m: statistics.median(r["aggregate_texts_per_s"] for r in runs if r["mode"] == m) for m in ("share", "all")}
    a = allotted_cpus()
    print(f"{args.workers} workers x {args.texts} texts ({desc}) on {a.cpus} CPUs ({a.source}); load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"aggregate texts/s (median): shared threads {med['share']:.1f}, every worker all CPUs {med['all']:.1f}, "
          f"ratio {med['share'] / med['all']:.3f}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"benchmark": "cpu_share", "workers": args.workers, "texts": args.texts,
                                                   "cpus": a.cpus, "runs": runs, "median_aggregate_texts_per_s": med}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
