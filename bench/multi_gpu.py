"""encoder.multi_gpu_*: the Encoder on every visible GPU (one model replica per device, batches spread) against
the same Encoder on one device, in one run, on the same texts.

Each side encodes the same read batches (``--read-batch-rows`` texts) through ``Encoder.encode_stream``, after a
warm-up; the sides alternate (``--reps`` each) and the median seconds count. Per device it prints the NVML busy
percent (``nvmlDeviceGetUtilizationRates().gpu``, sampled every ``--nvml-interval`` s, device found by the UUID
torch reports) and the share of model batches the device ran (``Encoder.device_batches``). The all-devices
vectors are compared with the one-device vectors row by row (min cosine; the target is >= 0.9999, the same
model batches on other devices).

``--devices auto`` = every CUDA device torch sees (``devices.unit_devices("cuda")``); on a machine with one GPU
that is one device, so it runs two replicas on that GPU instead (``cuda:0,cuda:0``: two threads and two
streams driving one device, the multi-device code path on real CUDA). ``--devices cpu,cpu`` runs on the CPU
(a smoke test of this script; no NVML).

    python bench/multi_gpu.py --model DIR --fortunes-dir DIR [--texts 100000] [--batch-size 512]
        [--dtype float16] [--devices auto] [--reps 2] [--json OUT.json]

Writes ``--json`` with ``devices``, ``device_names``, ``one`` / ``all`` (seconds, texts_per_s, busy_percent
per device, batch_share per device), ``ratio_vs_one_device`` (texts/s all ÷ one) and ``min_cosine``.
Imports no dagster.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embed_throughput import FORTUNES_DIR, corpus_records, import_dagster_gpu_without_dagster  # noqa: E402


class DeviceBusy:
    """NVML busy percent of each torch CUDA device, sampled on a thread while ``with`` runs."""

    def __init__(self, devices: list[str], interval_s: float):
        self.interval_s = interval_s
        self.samples: dict[str, list[int]] = {}
        self._handles = {}
        self._stop = threading.Event()
        self._thread = None
        try:
            import pynvml
            import torch

            pynvml.nvmlInit()
            self._nvml = pynvml
            for d in dict.fromkeys(devices):
                if not d.startswith("cuda"):
                    continue
                uuid = str(torch.cuda.get_device_properties(torch.device(d)).uuid)
                uuid = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
                self._handles[d] = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                self.samples[d] = []
        except Exception as e:  # noqa: BLE001 - the figures say "unavailable"
            self.error = f"{type(e).__name__}: {e}"
        else:
            self.error = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for d, h in self._handles.items():
                try:
                    self.samples[d].append(int(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu))
                except Exception:  # noqa: BLE001
                    pass

    def __enter__(self) -> "DeviceBusy":
        if self._handles:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def mean(self) -> dict[str, float | None]:
        return {d: (round(statistics.fmean(s), 1) if s else None) for d, s in self.samples.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="all-MiniLM-L6-v2")
    ap.add_argument("--fortunes-dir", default=str(FORTUNES_DIR))
    ap.add_argument("--texts", type=int, default=100_000)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--read-batch-rows", type=int, default=4096)
    ap.add_argument("--dtype", default="float16", help="weights on CUDA (float32 | float16 | bfloat16)")
    ap.add_argument("--devices", default="auto", help="auto (every CUDA device; two replicas on a single GPU) "
                                                      "or a comma list such as cuda:0,cuda:1 or cpu,cpu")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--nvml-interval", type=float, default=0.1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import_dagster_gpu_without_dagster()
    import numpy as np
    import torch

    from dagster_gpu.embedding.devices import device_labels, unit_devices
    from dagster_gpu.embedding.encoder import Encoder
    from dagster_gpu.embedding.model import load_model

    if args.devices == "auto":
        devices = unit_devices("cuda")
        if len(devices) == 1:
            devices = devices * 2  # one GPU: two replicas on it
    else:
        devices = unit_devices([d for d in args.devices.split(",") if d.strip()])
    first = devices[0]
    t0 = time.perf_counter()
    lm = load_model(args.model, device=first, dtype=args.dtype if first.startswith("cuda") else None)
    texts, source = corpus_records(args.texts, directory=args.fortunes_dir)
    batches = [texts[i : i + args.read_batch_rows] for i in range(0, len(texts), args.read_batch_rows)]
    labels = device_labels(devices)
    print(f"model {args.model} ({lm.dtype}) on {', '.join(labels)}; {len(texts)} texts ({source}), batch "
          f"{args.batch_size}, read batch {args.read_batch_rows}; load {time.perf_counter() - t0:.1f} s", flush=True)

    def sync() -> None:
        for d in dict.fromkeys(devices):
            if d.startswith("cuda"):
                torch.cuda.synchronize(torch.device(d))

    def run(enc: Encoder) -> tuple[float, np.ndarray]:
        """Seconds to encode every read batch, and the vectors (the results are read as they come)."""
        out = []
        sync()
        t = time.perf_counter()
        for _, pending in enc.encode_stream(batches, texts=lambda b: b):
            out.append(pending.result().vectors)
        sync()
        return time.perf_counter() - t, np.concatenate(out)

    sides = {"one": None, "all": devices}
    encs = {k: Encoder(lm.model, args.batch_size, devices=v) for k, v in sides.items()}
    results: dict[str, dict] = {}
    vectors: dict[str, np.ndarray] = {}
    try:
        for enc in encs.values():  # warm-up: kernels, allocator, replicas
            for _, pending in enc.encode_stream(batches[:2], texts=lambda b: b):
                pending.result()
        secs: dict[str, list[float]] = {k: [] for k in sides}
        busy: dict[str, list[dict]] = {k: [] for k in sides}
        base = {k: list(e.device_batches) for k, e in encs.items()}
        for rep in range(args.reps):
            for k, enc in encs.items():
                with DeviceBusy(devices, args.nvml_interval) as b:
                    s, v = run(enc)
                secs[k].append(s)
                busy[k].append(b.mean())
                vectors[k] = v
                print(f"rep {rep} {k:>3}: {s:.2f} s, {len(texts) / s:,.0f} texts/s, busy {b.mean() or b.error}",
                      flush=True)
        for k, enc in encs.items():
            med = statistics.median(secs[k])
            done = [a - b for a, b in zip(enc.device_batches, base[k])]
            total = sum(done)
            per_busy = {d: [m.get(d) for m in busy[k] if m.get(d) is not None] for d in dict.fromkeys(devices)}
            results[k] = {
                "devices": list(enc.devices),
                "seconds": round(med, 3),
                "texts_per_s": round(len(texts) / med, 1),
                "busy_percent": {d: (round(statistics.fmean(v), 1) if v else None) for d, v in per_busy.items()},
                "batch_share": [round(n / total, 3) for n in done] if total else [1.0],
            }
    finally:
        for enc in encs.values():
            enc.close()
    a, b = vectors["all"].astype(np.float32), vectors["one"].astype(np.float32)
    cos = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    report = {
        "devices": devices,
        "device_names": labels,
        "model_dtype": lm.dtype,
        "texts": len(texts),
        "batch_size": args.batch_size,
        "one": results["one"],
        "all": results["all"],
        "ratio_vs_one_device": round(results["all"]["texts_per_s"] / results["one"]["texts_per_s"], 3),
        "min_cosine": float(cos.min()),
        "rows_equal": bool(len(a) == len(b)),
    }
    print(json.dumps(report, indent=2))
    for i, (d, share) in enumerate(zip(devices, results["all"]["batch_share"])):
        print(f"device {i} {labels[i]}: {share:.1%} of the model batches, busy "
              f"{results['all']['busy_percent'].get(d)} % (one-device side: {results['one']['busy_percent'].get(d)} %)")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
