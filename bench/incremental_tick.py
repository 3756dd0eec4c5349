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

Then the corpus sensor's whole evaluation (unless ``--no-ticks``; listing, the instance's recorded version of every
bucket, the run requests) on a SQLite test instance (``dagster.instance_for_test``, its own ``DAGSTER_HOME``), by one
sensor on the incremental corpus and one on the full corpus, every bucket first recorded as materialized at its
listed version (a runless ``AssetMaterialization`` carrying ``corpus/source_version``):

7. ``tick1_first_sight``: the incremental sensor's first tick (full: no snapshot in that home yet);
8. ``tick_unchanged_incremental`` / ``tick_unchanged_full``: nothing changed (no run requested);
9. ``tick_changed_incremental`` / ``tick_changed_full``: after another new file and renamed-over file in one
   directory: both must request the same buckets (``ticks_request_the_same_keys``).

Each step: seconds, and this process's RSS before it and at its peak (sampled every 20 ms); a listing's ratio is
against ``full`` of the same run, a tick's against the full sensor's tick of the same state. Writes
bench/results/incremental_tick.json (``--out``) and, at 300,000 files with the ticks, ``scale.sensor_tick_incremental_s``
(step 9, incremental) and ``scale.sensor_tick_incremental_ratio`` (step 9, incremental ÷ full) to
bench/results/summary.json. Plans and the listings' snapshot go under a fresh ``DAGSTER_HOME`` in ``--root``.
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


def change_one_directory(root: Path, dirs: int, name: str) -> None:
    """One new file (``name``) and one file replaced by rename (written to a temporary name, then ``os.replace``) in
    the middle directory of the corpus."""
    d = root / f"d{dirs // 2:04d}"
    (d / name).write_text(json.dumps({"text": "a new document"}) + "\n")
    victim = sorted(p for p in d.iterdir() if p.name.startswith("doc-"))[3]
    (d / ".replace.tmp").write_text(json.dumps({"text": f"a rewritten document, {name}"}) + "\n")
    os.replace(d / ".replace.tmp", victim)


def ticks(a, full: CorpusSource, incr: CorpusSource, res: dict, step) -> None:
    """The corpus sensor's whole evaluation (listing, the instance's recorded versions of every bucket, the run
    requests) on a SQLite test instance, with the incremental corpus and with the full one, every bucket first
    recorded as materialized at its listed version: nothing changed, then one new and one renamed-over file."""
    import dagster as dg

    from dagster_gpu import corpus_sensor, embedding_asset
    from dagster_gpu.definitions.asset_options import ComputeSpec
    from sensor_scale import requested_keys

    asset = embedding_asset("incr_emb", corpus=incr, output=str(a.root / "out"), compute=ComputeSpec(device="cpu"))
    sensors = {"incremental": corpus_sensor(asset, incr, bridge=False),
               "full": corpus_sensor(asset, full, bridge=False, name="incr_emb_full_sensor")}
    defs = {kind: dg.Definitions(assets=[asset], sensors=[sensor]) for kind, sensor in sensors.items()}  # one job each
    with dg.instance_for_test() as instance:  # its own DAGSTER_HOME: the incremental sensor's first tick is full
        def tick(kind: str):
            return lambda: sensors[kind](dg.build_sensor_context(instance=instance, definitions=defs[kind]))

        t1 = step("tick1_first_sight", tick("incremental"))
        added = [k for req in t1.dynamic_partitions_requests for k in req.partition_keys]
        instance.add_dynamic_partitions(asset.partitions_def.name, added)
        for g in incr.list_buckets()[0]:
            instance.report_runless_asset_event(dg.AssetMaterialization(
                asset_key=asset.key, partition=g.key, metadata={"corpus/source_version": g.version}))
        order = list(instance.get_dynamic_partitions(asset.partitions_def.name))
        got = {}
        for kind in ("incremental", "full"):
            got[f"tick_unchanged_{kind}"] = requested_keys(step(f"tick_unchanged_{kind}", tick(kind)), order)
        change_one_directory(a.root / "corpus", a.dirs, "doc-new-2.json")
        for kind in ("incremental", "full"):
            got[f"tick_changed_{kind}"] = requested_keys(step(f"tick_changed_{kind}", tick(kind)), order)
    res["tick_changed_keys"] = got["tick_changed_full"]
    res["ticks_request_the_same_keys"] = (got["tick_changed_incremental"] == got["tick_changed_full"]
                                          and got["tick_unchanged_incremental"] == got["tick_unchanged_full"] == [])
    for what in ("unchanged", "changed"):
        res[f"tick_{what}_ratio"] = round(res[f"tick_{what}_incremental_s"] / res[f"tick_{what}_full_s"], 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=300_000)
    ap.add_argument("--dirs", type=int, default=300)
    ap.add_argument("--buckets", type=int, default=1024)
    ap.add_argument("--root", type=Path, default=Path("/dev/shm/dagster-gpu-incremental-tick"))
    ap.add_argument("--out", default="incremental_tick.json", help="the run's figures, under bench/results/")
    ap.add_argument("--no-ticks", dest="ticks", action="store_false", help="the listings only, no sensor ticks")
    a = ap.parse_args()
    shutil.rmtree(a.root, ignore_errors=True)
    os.environ["DAGSTER_HOME"] = str(a.root / "home")
    res: dict = {"files": a.files, "dirs": a.dirs, "buckets": a.buckets, "load_average_before": os.getloadavg()}

    def step(name: str, fn):
        out, res[f"{name}_s"], res[f"{name}_rss_mib"] = timed(fn)
        said = out[1].describe() if isinstance(out, tuple) and hasattr(out[-1], "describe") else ""
        if said:
            res[f"{name}_report"] = said
        print(f"{name}: {res[f'{name}_s']} s {said}", flush=True)
        return out

    step("generate", lambda: make_corpus(a.root / "corpus", a.files, a.dirs))
    full = CorpusSource(url=str(a.root / "corpus"), recursive=True, group_buckets=a.buckets)
    incr = CorpusSource(url=str(a.root / "corpus"), recursive=True, group_buckets=a.buckets,
                        full_listing_interval_seconds=3600)
    step("full", full.list_buckets)
    assert step("first", incr.list_buckets)[1].kind == "full"
    assert step("unchanged", incr.list_buckets)[1].dirs_read == 0
    change_one_directory(a.root / "corpus", a.dirs, "doc-new.json")
    changed, report = step("changed", incr.list_buckets)
    assert (report.dirs_read, report.added, report.changed, report.removed) == (1, 1, 1, 0), report
    step("settled", incr.list_buckets)
    after = step("full_after", full.list_buckets)[0]
    res["changed_equals_full"] = summaries(changed) == summaries(after)
    for name in ("first", "unchanged", "changed", "settled", "full_after"):
        res[f"{name}_ratio_vs_full"] = round(res[f"{name}_s"] / res["full_s"], 4)
    res["state_bytes"] = sum(p.stat().st_size for p in (a.root / "home").rglob("*.sqlite"))
    if a.ticks:
        ticks(a, full, incr, res, step)
    res["load_average_after"] = os.getloadavg()
    print(json.dumps(res), flush=True)
    (REPO / "bench" / "results" / a.out).write_text(json.dumps(res, indent=1) + "\n")
    if a.files == 300_000 and a.ticks and res["changed_equals_full"] and res["ticks_request_the_same_keys"]:
        merge_summary({"scale.sensor_tick_incremental_s": res["tick_changed_incremental_s"],
                       "scale.sensor_tick_incremental_ratio": res["tick_changed_ratio"]})
    shutil.rmtree(a.root, ignore_errors=True)


if __name__ == "__main__":
    main()
