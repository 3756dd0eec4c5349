"""What a work unit pays once and what each partition adds: the simulator's calibration (issue 8).

    .venv/bin/python bench/unit_startup.py [--n 3] [--files 20] [--records 20] [--device auto]
                                           [--json bench/results/unit_startup.json]

Measures, on this machine:

1. ``python_start_s``: ``python -c pass`` (interpreter start), median of N runs.
2. ``unit_startup_s``: the step worker's fixed cost — a fresh ``python -c`` that imports what the step
   worker imports (dagster, the demo code location ``pipelines.definitions`` and through it
   ``dagster_gpu``; torch and sentence-transformers) and calls ``dagster_gpu.embedding.model.load_model``
   on the packaged all-MiniLM-L6-v2; wall seconds from spawn to exit, median of N runs (each phase's
   median is printed too). It does not include ``dagster api execute_step``'s own step setup.
3. ``per_partition_s``: what one small partition adds inside a unit whose model is loaded — for each of
   ``--files`` files of ``--records`` fortune records: ``embed_partition`` (open, read, encode, write the
   parquet atomically) wall seconds minus the file's rows at the throughput of one large file
   (``--big-records``) in the same process, median over the files; plus the median seconds to record one
   partition's materialization (``report_runless_asset_event`` on a SQLite instance in a temp dir). The
   worker of issue 8 reads the next file while the current one encodes, so this is an upper bound.

Each figure is taken as wall seconds and as CPU seconds (user + sys of the worker processes; of this
process for the per-partition part). ``--estimate cpu`` (the default) makes the CPU figures the headline:
on this shared 2-core box other work keeps the load average far above the core count, and the wall time
then measures the contention; the start-up is single-threaded import and load work, whose wall time on
an idle core is its CPU time. Both are recorded, with the load average before and after.

Writes the figures as JSON (``--json``; ``unit_startup_s`` and ``per_partition_s`` are what
``dagster_gpu.sim.calibration`` reads) and prints a summary. Records come from Debian's fortunes
(``/usr/share/games/fortunes``) or ``--corpus DIR`` (files of ``%``-separated records).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WORKER = r"""
import json, time
t0 = time.perf_counter()
import dagster  # noqa: F401
import pipelines.definitions  # noqa: F401  (the code location a step worker loads; imports dagster_gpu)
t1 = time.perf_counter()
import torch  # noqa: F401
import sentence_transformers  # noqa: F401
t2 = time.perf_counter()
from dagster_gpu.embedding.model import load_model
m = load_model("all-MiniLM-L6-v2", device=DEVICE)
t3 = time.perf_counter()
print(json.dumps({"import_dagster_s": t1 - t0, "import_torch_s": t2 - t1, "load_model_s": t3 - t2,
                  "device": m.device}))
"""


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def _wall(cmd: list[str], env: dict) -> tuple[float, float, str]:
    """(wall s, CPU s = user + sys of the child, stdout) of one run of ``cmd``."""
    t = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=err)
        _pid, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        out.seek(0)
        err.seek(0)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            raise SystemExit(f"unit_startup: {' '.join(cmd[:2])} failed (exit {code}):\n{err.read()[-2000:].decode()}")
        return wall, ru.ru_utime + ru.ru_stime, out.read().decode()


def measure_startup(n: int, device: str) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(REPO))
    env.setdefault("DAGSTER_HOME", tempfile.mkdtemp(prefix="unit-startup-home-"))
    bare = [_wall([sys.executable, "-c", "pass"], env)[0] for _ in range(n)]
    runs = []
    for _ in range(n):
        wall, cpu, out = _wall([sys.executable, "-c", WORKER.replace("DEVICE", repr(device))], env)
        d = json.loads(out.strip().splitlines()[-1])
        d["wall_s"], d["cpu_s"] = wall, cpu
        runs.append(d)
    phases = {k: _median([r[k] for r in runs]) for k in ("import_dagster_s", "import_torch_s", "load_model_s")}
    return {
        "python_start_s": {"samples": bare, "median": _median(bare)},
        "worker_start_s": {"samples": [r["wall_s"] for r in runs], "median": _median([r["wall_s"] for r in runs]),
                           "phase_medians": phases, "device": runs[0]["device"]},
        "worker_start_cpu_s": {"samples": [r["cpu_s"] for r in runs], "median": _median([r["cpu_s"] for r in runs])},
    }


def _records(corpus: Path, need: int) -> list[str]:
    out: list[str] = []
    for f in sorted(corpus.iterdir()):
        if f.suffix in (".dat", ".u8") or not f.is_file():
            continue
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        out.extend(r.strip() for r in text.split("\n%\n") if r.strip())
        if len(out) >= need:
            return out[:need]
    if len(out) < need:
        raise SystemExit(f"unit_startup: {corpus} has {len(out)} usable records, {need} needed")
    return out


def measure_per_partition(files: int, records: int, big_records: int, device: str, corpus: Path) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from dagster import AssetKey, AssetMaterialization, DagsterInstance

    from dagster_gpu.corpus.readers import TextFormat
    from dagster_gpu.embedding.model import load_model
    from dagster_gpu.embedding.pipeline import embed_partition

    fmt = TextFormat(format="text", record_separator_line="%")
    recs = _records(corpus, files * records + big_records)
    model = load_model("all-MiniLM-L6-v2", device=device)
    with tempfile.TemporaryDirectory(prefix="unit-startup-") as tmp:
        d = Path(tmp)
        (d / "in").mkdir()
        (d / "out").mkdir()

        def write(name: str, rs: list[str]) -> str:
            p = d / "in" / name
            p.write_text("\n%\n".join(rs) + "\n%\n", encoding="utf-8")
            return str(p)

        big = write("big.txt", recs[files * records:])
        small = [write(f"f{i:03d}.txt", recs[i * records:(i + 1) * records]) for i in range(files)]
        embed_partition(small[0], str(d / "out" / "warm.parquet"), model, fmt)  # first call warms up
        c = time.process_time()
        rb = embed_partition(big, str(d / "out" / "big.parquet"), model, fmt)
        tps, tps_cpu = rb.rows / rb.seconds, rb.rows / (time.process_time() - c)
        walls, cpus, rows, over, over_cpu = [], [], [], [], []
        for i, f in enumerate(small):
            t, c = time.perf_counter(), time.process_time()
            r = embed_partition(f, str(d / "out" / f"f{i:03d}.parquet"), model, fmt)
            w, cp = time.perf_counter() - t, time.process_time() - c
            walls.append(w)
            cpus.append(cp)
            rows.append(r.rows)
            over.append(max(0.0, w - r.rows / tps))
            over_cpu.append(max(0.0, cp - r.rows / tps_cpu))
        (d / "home").mkdir()
        inst = DagsterInstance.local_temp(str(d / "home"))
        ev, ev_cpu = [], []
        key = AssetKey("unit_startup_probe")
        for i in range(files):
            md = {"embedding/rows": rows[i], "embedding/seconds": walls[i], "billing/gpu_seconds": walls[i],
                  "billing/cost_usd": 0.0, "dagster_gpu/backend": "local"}
            t, c = time.perf_counter(), time.process_time()
            inst.report_runless_asset_event(AssetMaterialization(key, partition=f"f{i:03d}", metadata=md))
            ev.append(time.perf_counter() - t)
            ev_cpu.append(time.process_time() - c)
        inst.dispose()
    return {
        "files": files, "records_per_file": records, "rows_per_file_median": _median(rows),
        "big_file_rows": rb.rows, "big_file_texts_per_s": tps,
        "big_file_texts_per_cpu_s": tps_cpu,
        "small_file_wall_s": {"samples": walls, "median": _median(walls)},
        "small_file_cpu_s": {"samples": cpus, "median": _median(cpus)},
        "small_file_overhead_s": {"median": _median(over)},
        "small_file_overhead_cpu_s": {"median": _median(over_cpu)},
        "event_write_s": {"samples": ev, "median": _median(ev)},
        "event_write_cpu_s": {"samples": ev_cpu, "median": _median(ev_cpu)},
        "device": model.device,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=3, help="fresh worker starts to take the median of (3)")
    ap.add_argument("--files", type=int, default=20, help="small files for the per-partition figure (20)")
    ap.add_argument("--records", type=int, default=20, help="records per small file (20)")
    ap.add_argument("--big-records", type=int, default=2000, help="records of the throughput file (2000)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda (auto)")
    ap.add_argument("--corpus", type=Path, default=Path("/usr/share/games/fortunes"))
    ap.add_argument("--estimate", choices=("cpu", "wall"), default="cpu",
                    help="headline figures from CPU seconds (default: on a shared, loaded host wall time "
                         "measures the contention; the start-up is single-threaded work whose wall time on "
                         "an idle core is its CPU time) or from wall seconds")
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "unit_startup.json")
    a = ap.parse_args(argv)
    if a.n < 1 or a.files < 1 or a.records < 1 or a.big_records < 1:
        ap.error("--n, --files, --records and --big-records must be >= 1")
    if not a.corpus.is_dir():
        ap.error(f"--corpus {a.corpus}: not a directory (install the Debian 'fortunes' package or pass a directory)")
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    st = measure_startup(a.n, a.device)
    pp = measure_per_partition(a.files, a.records, a.big_records, a.device, a.corpus)
    per_partition_wall = pp["small_file_overhead_s"]["median"] + pp["event_write_s"]["median"]
    per_partition_cpu = pp["small_file_overhead_cpu_s"]["median"] + pp["event_write_cpu_s"]["median"]
    use_cpu = a.estimate == "cpu"
    startup = st["worker_start_cpu_s"]["median"] if use_cpu else st["worker_start_s"]["median"]
    per_partition = per_partition_cpu if use_cpu else per_partition_wall
    import torch

    out = {
        "unit_startup_s": round(startup, 3),
        "per_partition_s": round(per_partition, 4),
        "estimate": a.estimate,
        "unit_startup_wall_s": round(st["worker_start_s"]["median"], 3),
        "per_partition_wall_s": round(per_partition_wall, 4),
        "what": "unit_startup_s: python start + import dagster, the code location (dagster_gpu), torch, "
                "sentence-transformers + load_model, median of n fresh processes; per_partition_s: a small "
                "file's embed_partition minus its rows at the large-file throughput (median) + one "
                "materialization event write (median); estimate 'cpu' = the processes' CPU seconds (user + "
                "sys), 'wall' = wall seconds (both recorded)",
        "command": "bench/unit_startup.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                 "torch": torch.__version__, "loadavg_before": round(load0, 2),
                 "loadavg_after": round(os.getloadavg()[0], 2)},
        "n": a.n, **st, "per_partition": pp,
        "bench_seconds": round(time.perf_counter() - t0, 1),
    }
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(out, indent=2) + "\n")
    ph = st["worker_start_s"]["phase_medians"]
    print(f"python start          {st['python_start_s']['median']:.3f} s (median of {a.n})")
    print(f"worker start (unit)   wall {out['unit_startup_wall_s']:.3f} s, CPU "
          f"{st['worker_start_cpu_s']['median']:.3f} s (median of {a.n}; wall: import dagster + code location "
          f"{ph['import_dagster_s']:.2f}, torch + sentence-transformers {ph['import_torch_s']:.2f}, load_model "
          f"{ph['load_model_s']:.2f}; device {st['worker_start_s']['device']})")
    print(f"small file ({a.records} records) wall {pp['small_file_wall_s']['median']:.4f} s; overhead beyond "
          f"encoding {pp['small_file_overhead_s']['median']:.4f} s (large file {pp['big_file_texts_per_s']:.0f} "
          f"texts/s); event write {pp['event_write_s']['median']:.4f} s")
    print(f"per partition         wall {per_partition_wall:.4f} s, CPU {per_partition_cpu:.4f} s "
          f"(small file CPU {pp['small_file_cpu_s']['median']:.4f} s, event CPU {pp['event_write_cpu_s']['median']:.4f} s)")
    print(f"headline ({a.estimate}): unit_startup_s {out['unit_startup_s']}, per_partition_s {out['per_partition_s']}")
    print(f"wrote {a.json} ({out['bench_seconds']} s, load average {load0:.1f} -> {out['host']['loadavg_after']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
