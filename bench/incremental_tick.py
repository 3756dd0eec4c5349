"""Benchmark: the corpus sensor's listing of a file-grouped local corpus, full against incremental.

    .venv/bin/python bench/incremental_tick.py [--files 300000] [--dirs 300] [--buckets 1024]

One process, every figure from the same run, on one generated corpus (``--files`` JSON documents of one record in
``--dirs`` directories under ``--root``, default on /dev/shm, a tmpfs; the directories' mtimes then set a minute
back, as for a corpus written before the sensor started), ``CorpusSource(recursive=True, group_buckets=--buckets)``:

1. ``full``: the streamed full listing the tick makes without the option (``list_buckets()``,
   ``full_listing_interval_seconds`` None): the baseline;
2. ``first``: the first listing with ``full_listing_interval_seconds=3600``: full, and it builds the snapshot;
3. ``unchanged``: the next one, nothing changed (incremental: every directory stat'ed, none read);
4. ``changed``: after one new file and one file replaced by rename (written to a temporary name, then ``os.replace``)
   in one directory: incremental, that directory read, the buckets of the two files assembled;
5. ``settled``: the next one (the changed directory was modified within ``RACY_S`` of its read, so it is read once
   more), nothing else changed;
6. ``full_after``: the full listing again, whose buckets the incremental ``changed`` listing must equal.

Each step: seconds, and this process's RSS before it and at its peak (sampled every 20 ms); ratios are against
``full`` of the same run. Writes bench/results/incremental_tick.json (``--out``) and, at 300,000 files,
``scale.sensor_tick_incremental_s`` (step 4) and ``scale.sensor_tick_incremental_ratio`` (step 4 ÷ step 1) to
bench/results/summary.json. Plans and the snapshot go under a fresh ``DAGSTER_HOME`` in ``--root``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

from sensor_scale import timed  # noqa: E402
from summary import merge_summary  # noqa: E402

from dagster_gpu import CorpusSource  # noqa: E402


def make_corpus(root: Path, files: int, dirs: int) -> None:
    """``files`` one-record JSON documents spread over ``dirs`` directories; every directory's mtime a minute back."""
    shutil.rmtree(root, ignore_errors=True)
    per = -(-files // dirs)
    for i in range(files):
        d = root / f"d{i // per:04d}"
        if i % per == 0:
            d.mkdir(parents=True)
        with open(d / f"doc-{i:07d}.json", "w") as fh:
            fh.write(json.dumps({"text": f"document {i}: notes on topic {i * 7 % 9973}"}) + "\n")
    then = time.time() - 60
    for d in root.iterdir():
        os.utime(d, (then, then))
    os.utime(root, (then, then))


def summaries(groups) -> list[tuple]:
    return [(g.key, g.version, g.size_bytes, g.mtime, g.file_count) for g in groups]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=300_000)
    ap.add_argument("--dirs", type=int, default=300)
    ap.add_argument("--buckets", type=int, default=1024)
    ap.add_argument("--root", type=Path, default=Path("/dev/shm/dagster-gpu-incremental-tick"))
    ap.add_argument("--out", default="incremental_tick.json", help="the run's figures, under bench/results/")
    a = ap.parse_args()
    shutil.rmtree(a.root, ignore_errors=True)
    os.environ["DAGSTER_HOME"] = str(a.root / "home")
    res: dict = {"files": a.files, "dirs": a.dirs, "buckets": a.buckets, "load_average_before": os.getloadavg()}

    def step(name: str, fn):
        out, res[f"{name}_s"], res[f"{name}_rss_mib"] = timed(fn)
        if isinstance(out, tuple):
            res[f"{name}_report"] = out[1].describe()
            print(f"{name}: {res[f'{name}_s']} s, {out[1].describe()}", flush=True)
        return out

    step("generate", lambda: make_corpus(a.root / "corpus", a.files, a.dirs))
    full = CorpusSource(url=str(a.root / "corpus"), recursive=True, group_buckets=a.buckets)
    incr = CorpusSource(url=str(a.root / "corpus"), recursive=True, group_buckets=a.buckets,
                        full_listing_interval_seconds=3600)
    step("full", full.list_buckets)
    assert step("first", incr.list_buckets)[1].kind == "full"
    assert step("unchanged", incr.list_buckets)[1].dirs_read == 0
    d = a.root / "corpus" / f"d{a.dirs // 2:04d}"
    (d / "doc-new.json").write_text(json.dumps({"text": "a new document"}) + "\n")
    victim = sorted(d.iterdir())[3]
    (d / ".replace.tmp").write_text(json.dumps({"text": "a rewritten document, longer"}) + "\n")
    os.replace(d / ".replace.tmp", victim)
    changed, report = step("changed", incr.list_buckets)
    assert (report.dirs_read, report.added, report.changed, report.removed) == (1, 1, 1, 0), report
    step("settled", incr.list_buckets)
    after = step("full_after", full.list_buckets)[0]
    res["changed_equals_full"] = summaries(changed) == summaries(after)
    for name in ("first", "unchanged", "changed", "settled", "full_after"):
        res[f"{name}_ratio_vs_full"] = round(res[f"{name}_s"] / res["full_s"], 4)
    res["state_bytes"] = sum(p.stat().st_size for p in (a.root / "home").rglob("*.sqlite"))
    res["load_average_after"] = os.getloadavg()
    print(json.dumps(res), flush=True)
    (REPO / "bench" / "results" / a.out).write_text(json.dumps(res, indent=1) + "\n")
    if a.files == 300_000 and res["changed_equals_full"]:
        merge_summary({"scale.sensor_tick_incremental_s": res["changed_s"],
                       "scale.sensor_tick_incremental_ratio": res["changed_ratio_vs_full"]})
    shutil.rmtree(a.root, ignore_errors=True)


if __name__ == "__main__":
    main()
