"""Benchmark: a trickle of small corpus files under the real Dagster daemon, the freshness knob off and on.

    .venv/bin/python bench/trickle.py [--every 5] [--minutes 10] [--max-delay 120] [--variants off,held,held_cold]

Variants one after the other on this host (never side by side: on 2 cores two daemons slow each other's
start-ups), each with its own DAGSTER_HOME (SQLite, two concurrent runs), corpus, outputs and LanceDB index, and
its own ``dagster-daemon run``: the code location ``tests/locations/sensor_location.py`` (the corpus sensor every
5 s, the index's ``AutomationCondition.eager()`` evaluated by ``index_automation_sensor``; local backend, CPU,
runs of at most ``--per-run`` partitions, embedding_asset's default):

- ``off``: ``max_delay_seconds`` unset, workers from the local backend's fork server (``forkserver_idle_seconds``);
- ``held``: ``max_delay_seconds=--max-delay``, the fork server too: the knob as a user sets it;
- ``held_cold``: the knob, every worker a fresh interpreter (what the fork server saves).

One small fortune file (5 records) is written into the variant's corpus every ``--every`` seconds for
``--minutes`` minutes; then the bench waits until every file's rows are in its index.

Figures per variant, from the instance's event log:
- useful fraction: Σ ``embedding/seconds`` ÷ Σ ``billing/wall_seconds`` over the embeddings' materializations
  (:func:`dagster_gpu.billing.metering.useful_fraction`: the start-up of each unit counts against it);
- freshness: from the file's write to the first materialization of its index partition after it (its rows are
  in the table then), p50 and p95 in seconds;
- runs (work units), their count of partitions, the median seconds a unit paid beyond its partitions' own
  (start-up) and a partition's median embedding seconds.

Writes ``trickle.useful_fraction`` and ``trickle.freshness_p95_s`` (``held``), ``trickle.off_*`` and
``trickle.cold_*`` to bench/results/summary.json (full length only, and only when every file reached the index
within ``--drain-timeout``), and every figure to bench/results/trickle.json.
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
sys.path[:0] = [str(REPO / "bench"), str(REPO)]

from summary import merge_summary  # noqa: E402

LOCATION = REPO / "tests" / "locations" / "sensor_location.py"
EMBEDDINGS, INDEX = "sd_embeddings", "sd_embeddings_index"
RECORDS_PER_FILE = 5


def start_variant(work: Path, max_delay: float | None, per_run: int, forkserver: float | None) -> tuple[dict, subprocess.Popen]:
    """A home, corpus and daemon for one variant; its environment and the daemon process."""
    from pipelines.instance_yaml import dagster_yaml

    home = work / "home"
    home.mkdir(parents=True)
    (work / "corpus").mkdir()
    (home / "dagster.yaml").write_text(dagster_yaml(None, max_runs=2))
    ws = work / "workspace.yaml"
    ws.write_text(f"load_from:\n  - python_file:\n      relative_path: {LOCATION}\n      working_directory: {REPO}\n"
                  "      location_name: trickle\n")
    env = {**os.environ, "DAGSTER_HOME": str(home), "DAGSTER_GPU_SD_DIR": str(work), "DAGSTER_GPU_SD_INTERVAL": "5",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), "TOKENIZERS_PARALLELISM": "false",
           "DAGSTER_GPU_SD_PER_RUN": str(per_run)}
    env.pop("DAGSTER_GPU_SD_MAX_DELAY", None)
    env.pop("DAGSTER_GPU_SD_FORKSERVER", None)
    if forkserver is not None:
        env["DAGSTER_GPU_SD_FORKSERVER"] = str(forkserver)
    if max_delay is not None:
        env["DAGSTER_GPU_SD_MAX_DELAY"] = str(max_delay)
    with open(work / "daemon.log", "w") as log:  # the daemon keeps its own copy of the descriptor
        daemon = subprocess.Popen([sys.executable, "-m", "dagster._daemon", "run", "-w", str(ws)], cwd=REPO, env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return env, daemon


def materialization_times(home: Path, asset: str) -> dict[str, list[tuple[float, dict]]]:
    """Partition -> [(timestamp, metadata)] of every materialization of ``asset`` in ``home``'s instance."""
    import dagster as dg

    from dagster_gpu.instance.events import metadata_values

    out: dict[str, list[tuple[float, dict]]] = {}
    with dg.DagsterInstance.from_config(str(home)) as instance:
        cursor = None
        while True:
            res = instance.fetch_materializations(dg.AssetKey(asset), limit=1000, cursor=cursor, ascending=True)
            for rec in res.records:
                m = rec.asset_materialization
                out.setdefault(m.partition, []).append((rec.timestamp, metadata_values(m.metadata)))
            if not res.has_more:
                return out
            cursor = res.cursor


def figures(work: Path, written: dict[str, float]) -> dict:
    from dagster_gpu.billing.metering import useful_fraction

    emb = materialization_times(work / "home", EMBEDDINGS)
    idx = materialization_times(work / "home", INDEX)
    fresh = []
    for pk, t_written in written.items():
        after = [t for t, _ in idx.get(pk, []) if t >= t_written]
        if after:
            fresh.append(min(after) - t_written)
    mds = [md for mats in emb.values() for _, md in mats]
    units: dict = {}
    for md in mds:  # per unit: [billed s, embedding s]
        u = units.setdefault(md.get("local/unit"), [0.0, 0.0])
        u[0] += float(md.get("billing/wall_seconds") or 0.0)
        u[1] += float(md.get("embedding/seconds") or 0.0)
    q = statistics.quantiles(fresh, n=20, method="inclusive") if len(fresh) >= 2 else [float("nan")] * 19
    return {
        "files": len(written), "embedded": len(emb), "indexed": len(fresh),
        "useful_fraction": round(useful_fraction((md.get("embedding/seconds"), md.get("billing/wall_seconds")) for md in mds) or 0.0, 3),
        "freshness_p50_s": round(statistics.median(fresh), 1) if fresh else None,
        "freshness_p95_s": round(q[18], 1) if fresh else None,
        "freshness_max_s": round(max(fresh), 1) if fresh else None,
        "units": len(units), "partitions_per_unit": round(len(mds) / max(1, len(units)), 2),
        "unit_not_useful_s_median": round(statistics.median(b - e for b, e in units.values()), 2) if units else None,
        "partition_embedding_s_median": round(statistics.median(float(md.get("embedding/seconds") or 0) for md in mds), 3) if mds else None,
    }


def run_variant(work: Path, max_delay: float | None, per_run: int, forkserver: float | None, texts: list[str],
                every: float, drain_timeout: float) -> dict:
    """One variant from start to drain: its daemon, the files written every ``every`` s, the wait until every
    file's rows are in its index (at most ``drain_timeout`` s); its figures."""
    env, daemon = start_variant(work, max_delay, per_run, forkserver)
    written: dict[str, float] = {}
    try:
        time.sleep(20)  # the daemon loads the code location before the first file arrives
        t0 = time.monotonic()
        for i, text in enumerate(texts):
            time.sleep(max(0.0, t0 + i * every - time.monotonic()))
            name = f"t{i:04d}.txt"
            (work / "corpus" / name).write_text(text)
            written[name] = time.time()
        deadline = time.monotonic() + drain_timeout
        while time.monotonic() < deadline:
            done = figures(work, written)
            print(json.dumps({"waiting": {work.name: f"{done['indexed']}/{done['files']} indexed"}}), flush=True)
            if done["indexed"] == len(written):
                break
            time.sleep(15)
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
    return figures(work, written)


def main() -> None:
    from dagster_gpu.definitions.assets import DEFAULT_PARTITIONS_PER_RUN

    ap = argparse.ArgumentParser()
    ap.add_argument("--every", type=float, default=5.0, help="seconds between two files")
    ap.add_argument("--minutes", type=float, default=10.0, help="how long files arrive")
    ap.add_argument("--max-delay", type=float, default=120.0, help="the held variant's max_delay_seconds")
    ap.add_argument("--per-run", type=int, default=DEFAULT_PARTITIONS_PER_RUN,
                    help=f"the asset's max_partitions_per_run (default {DEFAULT_PARTITIONS_PER_RUN}, embedding_asset's)")
    ap.add_argument("--forkserver", type=float, default=600.0, metavar="S",
                    help="the local backend's forkserver_idle_seconds in 'off' and 'held' (default 600)")
    ap.add_argument("--variants", default="off,held,held_cold",
                    help="which variants, one after the other: off, held, held_cold (held without the fork server)")
    ap.add_argument("--drain-timeout", type=float, default=900.0, help="seconds to wait for the last rows in the index")
    a = ap.parse_args()
    from tests.conftest import fortune_records

    root = Path(tempfile.mkdtemp(prefix="dagster-gpu-trickle-bench-"))
    delays = {"off": None, "held": a.max_delay, "held_cold": a.max_delay}
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    if not variants or any(v not in delays for v in variants):
        ap.error(f"--variants: a comma-separated subset of {sorted(delays)}, got {a.variants!r}")
    n_files = int(a.minutes * 60 / a.every)
    records = fortune_records("people", n_files * RECORDS_PER_FILE)
    texts = ["".join(r.rstrip("\n") + "\n%\n" for r in records[i * RECORDS_PER_FILE:(i + 1) * RECORDS_PER_FILE])
             for i in range(n_files)]
    result: dict = {}
    for v in variants:
        os.sync()
        load_before = os.getloadavg()[0]
        forkserver = None if v == "held_cold" else a.forkserver
        result[v] = run_variant(root / v, delays[v], a.per_run, forkserver, texts, a.every, a.drain_timeout)
        result[v]["loadavg_before"] = round(load_before, 2)
        print(json.dumps({v: result[v]}), flush=True)
    result["setup"] = {"every_s": a.every, "minutes": a.minutes, "max_delay_s": a.max_delay, "files": n_files,
                       "records_per_file": RECORDS_PER_FILE, "sensor_interval_s": 5, "max_partitions_per_run": a.per_run,
                       "forkserver_idle_seconds": a.forkserver,
                       "variants": "one after the other", "cpus": os.cpu_count(), "work": str(root)}
    print(json.dumps(result, indent=1))
    (REPO / "bench" / "results" / "trickle.json").write_text(json.dumps(result, indent=1) + "\n")
    complete = all(v in result and result[v]["indexed"] == n_files for v in ("off", "held"))
    if a.minutes >= 10 and a.every <= 5 and complete:  # a freshness over only the files indexed so far would flatter
        held, off = result["held"], result["off"]
        merge_summary({"trickle.useful_fraction": held["useful_fraction"], "trickle.freshness_p95_s": held["freshness_p95_s"],
                       "trickle.off_useful_fraction": off["useful_fraction"], "trickle.off_freshness_p95_s": off["freshness_p95_s"],
                       **({"trickle.cold_useful_fraction": result["held_cold"]["useful_fraction"],
                           "trickle.cold_freshness_p95_s": result["held_cold"]["freshness_p95_s"]}
                          if result.get("held_cold", {}).get("indexed") == n_files else {})})


if __name__ == "__main__":
    main()
