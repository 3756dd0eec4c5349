"""Benchmark: the corpus sensor's tick over a corpus of many small files in file groups, on a PostgreSQL instance.

    bash resources/postgres/postgres.sh start
    .venv/bin/python bench/sensor_scale.py [--files 300000] [--buckets 1024] [--changed 0.01]

One process, every figure from the same run (the orchestration side only: nothing is embedded):

1. ``--files`` JSON Lines files of one record each under ``--root`` (default on /dev/shm, a tmpfs), 100 per
   directory, ``CorpusSource(recursive=True, group_buckets=--buckets)``;
2. each full listing alone in a fresh process, to compare memory: ``list_files()`` (every file held, with its
   bucket's members) and ``list_files(members=False)`` (streamed, spilled to disk by bucket: what the sensor's tick
   lists), each storing its plans in a fresh directory: seconds, RSS before and peak during the listing, and the
   growth between them (``--memory-only`` stops here); then, in this process, the listing alone (``list_files``: the
   first one also stores every bucket's group plan), again (plans kept, pointers only read), and streamed;
3. tick 1, first sight: the corpus sensor's evaluation (``build_sensor_context`` on the real instance) and its
   dynamic partition request applied (``add_dynamic_partitions``), timed apart; run requests and keys;
4. every bucket recorded as materialized at its listed version: one runless ``AssetMaterialization`` per bucket
   carrying ``corpus/source_version`` (what the sensor reads back, ``partitions.source_versions.recorded_versions``);
   this stands in for the embedding, which is not what this bench measures;
5. tick 2, nothing changed: seconds (no run request expected);
6. ``--changed`` of the files rewritten (a new record, mtime moved): tick 3, seconds, buckets requested
   (every bucket holding a changed file, none other);
7. one bucket key resolved as a work unit resolves it (``files_for_keys``: from its group plan).

The baseline is the listing alone, measured in the same run: ``tick3_ratio_vs_listing`` is tick 3 ÷ the second
listing. Each step reports its seconds and this process's RSS before it and at its peak (sampled every 20 ms); the bench keeps
only the bucket versions and member names of the listing, so the ticks are measured without a listing held. Writes bench/results/sensor_scale.json (``--out``) and, at 300,000 files, ``scale.files``,
``scale.partitions``, ``scale.sensor_tick_s`` (tick 3: the listing of every file, the instance's versions of every
bucket, 1 % changed) and ``scale.sensor_first_tick_s`` to bench/results/summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import gc
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

import dagster as dg  # noqa: E402
import psutil  # noqa: E402
import slurm_helpers as H  # noqa: E402
from summary import merge_summary  # noqa: E402

from dagster_gpu import CorpusSource, corpus_sensor, embedding_asset  # noqa: E402
from dagster_gpu.definitions.asset_options import ComputeSpec  # noqa: E402
from dagster_gpu.partitions.run_ranges import keys_in_range, range_tags  # noqa: E402

PER_DIR = 100


def rss_mib() -> float:
    """This process's resident set now, MiB."""
    return round(psutil.Process().memory_info().rss / 2**20, 1)


def path_of(root: Path, i: int) -> Path:
    return root / f"d{i // PER_DIR:05d}" / f"doc-{i:07d}.json"


def make_corpus(root: Path, files: int) -> None:
    shutil.rmtree(root, ignore_errors=True)
    for i in range(files):
        p = path_of(root, i)
        if i % PER_DIR == 0:
            p.parent.mkdir(parents=True)
        p.write_text(json.dumps({"text": f"document {i}: notes on topic {i * 7 % 9973}"}) + "\n")


def change_files(root: Path, files: int, fraction: float, *, replace: bool = False, seed: int = 1) -> list[int]:
    """Change ``fraction`` of the corpus's files (a seeded sample; their indices returned, sorted): each gets a
    new record after its own (``replace`` False) or its one record replaced by a changed text (``replace``), and
    its mtime moved 5 s on (a version that differs however coarse the clock)."""
    changed = sorted(random.Random(seed).sample(range(files), int(files * fraction)))
    for i in changed:
        p = path_of(root, i)
        new = json.dumps({"text": f"document {i}: a new paragraph"}) + "\n"
        p.write_text(new if replace else p.read_text() + new)
        later = p.stat().st_mtime + 5
        os.utime(p, (later, later))
    return changed


def buckets_holding(members: dict[str, list[str]], changed: list[int]) -> set[str]:
    """The bucket keys of ``members`` (key -> its files' relative names) holding one of the files ``changed``."""
    names = {str(path_of(Path(""), i)) for i in changed}
    return {k for k, rels in members.items() if any(r in names for r in rels)}


def timed(fn):
    """``(fn(), seconds, (RSS before, peak RSS while it ran) in MiB)``; the peak sampled every 20 ms."""
    before, peak, stop = rss_mib(), [0.0], threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            peak[0] = max(peak[0], rss_mib())

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0 = time.perf_counter()
    try:
        out = fn()
    finally:
        seconds = round(time.perf_counter() - t0, 3)
        stop.set()
        t.join()
    return out, seconds, (before, max(peak[0], rss_mib()))


#: One listing in a fresh process: its resident set (MiB) right before the listing and its peak during it, sampled
#: every 10 ms.
_LISTER = """
import json, sys, threading, time
import psutil
from dagster_gpu import CorpusSource
url, buckets, plans, members = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
rss = lambda: psutil.Process().memory_info().rss / 2**20
before, peak, stop = rss(), [0.0], threading.Event()
def sample():
    while not stop.wait(0.01):
        peak[0] = max(peak[0], rss())
threading.Thread(target=sample, daemon=True).start()
t = time.perf_counter()
n = len(CorpusSource(url=url, recursive=True, group_buckets=buckets, group_plan_url=plans).list_files(members=members))
seconds = time.perf_counter() - t
stop.set()
print(json.dumps({"seconds": round(seconds, 3), "buckets": n, "before_mib": round(before, 1),
                  "peak_mib": round(max(peak[0], rss()), 1)}))
"""


def listing_process(corpus: Path, buckets: int, members: bool, plans: Path) -> dict:
    """A full listing of ``corpus`` (``list_files(members=...)``, plans stored in a fresh ``plans`` directory) alone in
    a new process: its seconds, buckets, its RSS before the listing and at its peak during it (MiB), and the growth
    (peak - before)."""
    shutil.rmtree(plans, ignore_errors=True)
    cp = subprocess.run([sys.executable, "-c", _LISTER, str(corpus), str(buckets), str(plans), "1" if members else "0"],
                        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    out = json.loads(cp.stdout.strip().splitlines()[-1])
    out["growth_mib"] = round(out["peak_mib"] - out["before_mib"], 1)
    shutil.rmtree(plans, ignore_errors=True)
    return out


def requested_keys(result: dg.SensorResult, order: list[str]) -> list[str]:
    """The partition keys ``result``'s run requests cover (one key, or a range by Dagster's range tags)."""
    out: list[str] = []
    for r in result.run_requests or []:
        rng = range_tags(r.tags)
        out.extend(keys_in_range(order, *rng) if rng else [r.partition_key])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=300_000)
    ap.add_argument("--buckets", type=int, default=1024)
    ap.add_argument("--changed", type=float, default=0.01, help="fraction of the files changed before tick 3")
    ap.add_argument("--root", type=Path, default=Path("/dev/shm/dagster-gpu-sensor-scale"))
    ap.add_argument("--out", default="sensor_scale.json", help="the run's figures, under bench/results/")
    ap.add_argument("--memory-only", action="store_true",
                    help="only the corpus and the two listings' processes (the full one and the streamed one)")
    a = ap.parse_args()
    reason = H.postgres_unavailable_reason()
    if reason:
        sys.exit(f"cannot run: {reason}")
    res: dict = {"files": a.files, "buckets": a.buckets}

    def step(name: str, fn):
        """``fn()``, its seconds as ``<name>_s`` and the RSS before / peak during it as ``<name>_rss_mib``."""
        out, res[f"{name}_s"], res[f"{name}_rss_mib"] = timed(fn)
        return out

    step("generate", lambda: make_corpus(a.root / "corpus", a.files))
    for kind, members in (("full", True), ("streamed", False)):  # each listing alone in its own process
        res[f"listing_{kind}_process"] = listing_process(a.root / "corpus", a.buckets, members, a.root / f"plans-{kind}")
        print(json.dumps({f"listing_{kind}_process": res[f"listing_{kind}_process"]}), flush=True)
    if a.memory_only:
        print(json.dumps(res), flush=True)
        (REPO / "bench" / "results" / a.out).write_text(json.dumps(res, indent=1) + "\n")
        shutil.rmtree(a.root, ignore_errors=True)
        return
    home, _env = H.make_dagster_home()
    os.environ["DAGSTER_HOME"] = str(home)
    os.environ.setdefault("DAGSTER_PG_PASSWORD", (H.PG_DIR / "password").read_text().strip())
    corpus = CorpusSource(url=str(a.root / "corpus"), recursive=True, group_buckets=a.buckets)
    asset = embedding_asset("scale_emb", corpus=corpus, output=str(a.root / "out"), compute=ComputeSpec(device="cpu"))
    sensor = corpus_sensor(asset, corpus, bridge=False)
    defs = dg.Definitions(assets=[asset], sensors=[sensor])
    pdef = asset.partitions_def.name

    groups = step("listing_first", corpus.list_files)
    step("listing_again", corpus.list_files)
    step("listing_streamed", lambda: corpus.list_files(members=False))  # what the sensor's tick lists
    res["partitions"] = len(groups)
    res["files_listed"] = sum(len(g.members) for g in groups)
    # what this bench needs of the listing later, kept small: the ticks are measured without it in memory
    versions = {g.key: g.version for g in groups}
    members = {g.key: [m.relative_name for m in g.members] for g in groups}
    one = groups[len(groups) // 2].key
    del groups
    gc.collect()
    with dg.DagsterInstance.get() as instance:
        tick = lambda: sensor(dg.build_sensor_context(instance=instance, definitions=defs))  # noqa: E731
        t1 = step("tick1", tick)
        added = [k for req in t1.dynamic_partitions_requests for k in req.partition_keys]
        step("tick1_add_partitions", lambda: instance.add_dynamic_partitions(pdef, added))
        order = list(instance.get_dynamic_partitions(pdef))
        res.update(tick1_partitions_added=len(added), tick1_keys_requested=len(requested_keys(t1, order)),
                   tick1_run_requests=len(t1.run_requests or []))
        del t1

        def record() -> None:
            for key, version in versions.items():
                instance.report_runless_asset_event(dg.AssetMaterialization(
                    asset_key=asset.key, partition=key, metadata={"corpus/source_version": version}))

        step("record_materializations", record)
        res["tick2_keys_requested"] = len(requested_keys(step("tick2", tick), order))
        changed = change_files(a.root / "corpus", a.files, a.changed)
        expected = buckets_holding(members, changed)
        t3 = step("tick3", tick)
        got = set(requested_keys(t3, order))
        res.update(tick3_ratio_vs_listing=round(res["tick3_s"] / res["listing_again_s"], 3),
                   tick3_files_changed=len(changed), tick3_keys_requested=len(got),
                   tick3_expected_buckets=len(expected), tick3_exactly_the_changed_buckets=got == expected,
                   tick3_run_requests=len(t3.run_requests or []))
        found = step("resolve_one_bucket", lambda: corpus.files_for_keys([one]))
        res["resolve_one_bucket_files"] = len(found[one].members)
    print(json.dumps(res), flush=True)
    (REPO / "bench" / "results" / a.out).write_text(json.dumps(res, indent=1) + "\n")
    if a.files == 300_000 and res["tick3_exactly_the_changed_buckets"]:
        merge_summary({"scale.files": a.files, "scale.partitions": res["partitions"],
                       "scale.sensor_tick_s": res["tick3_s"], "scale.sensor_first_tick_s": res["tick1_s"]})
    shutil.rmtree(a.root, ignore_errors=True)


if __name__ == "__main__":
    main()
