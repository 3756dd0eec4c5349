"""End to end on a real PostgreSQL instance: an asset backfill through gpu_executor (local backend),
run by the real Dagster daemon in ranged runs of 4 partitions, each run's step in its own worker process
that embeds every partition of its range."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import psutil
import pytest

from dagster_gpu.billing.keys import billed
from tests.conftest import FORTUNES, REPO, expected_records, reimport
from tests.process_helpers import alive

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

GOOD = ["goedel", "magic", "news", "paradoxum", "translate-me"]
WEIRD_NAME = "mixed $(touch pwned) 'q' \"dq\" 日本語\nline"
LOCATION = REPO / "tests" / "locations" / "e2e_location.py"


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace.yaml"
    ws.write_text(
        f"load_from:\n  - python_file:\n      relative_path: {LOCATION}\n      working_directory: {REPO}\n"
        "      location_name: e2e\n"
    )
    return ws


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    if not FORTUNES.is_dir():
        pytest.fail("the Debian package 'fortunes' is required (.ci/run installs it)")
    d = tmp_path / "corpus"
    d.mkdir()
    for name in GOOD:
        shutil.copyfile(FORTUNES / name, d / name)
    (d / "empty").write_bytes(b"")
    (d / "blank records").write_text("   \n%\n\t\n%\n\n%\n")
    (d / WEIRD_NAME).write_text("first record\n%\n   \n%\nthird record\nwith two lines\n%\n%\nfifth\n")
    (d / "latin1").write_bytes("caf\xe9 au lait\n%\n".encode("latin-1"))
    out = tmp_path / "out"
    monkeypatch.setenv("DAGSTER_GPU_TEST_CORPUS", str(d))
    monkeypatch.setenv("DAGSTER_GPU_TEST_OUTPUT", str(out))
    monkeypatch.chdir(tmp_path)  # a `$(touch pwned)` that reached a shell would create tmp_path/pwned
    return d, out


def _process_bills(instance, asset_key) -> dict[str, list[dict]]:
    """The local backend's process-bill observations, by unit."""
    by_unit: dict[str, list[dict]] = {}
    for r in instance.fetch_observations(dg.AssetRecordsFilter(asset_key=asset_key), limit=1000).records:
        o = {k: v.value for k, v in r.asset_observation.metadata.items()}
        if o.get("bill/source") == "process":
            by_unit.setdefault(str(o["local/unit"]), []).append({**o, "_partition": r.asset_observation.partition})
    return by_unit


def test_backfill_through_gpu_executor_on_postgres(pg_home, corpus, tmp_path):
    from sentence_transformers import SentenceTransformer

    from dagster_gpu.commands.backfill import DaemonProcess, submit_asset_backfill, summarize_partitions, wait_for_backfill
    from dagster_gpu.embedding.model import resolve_model_path
    from dagster_gpu.core.partition_keys import partition_key_for
    loc = reimport("tests.locations.e2e_location")  # it reads $DAGSTER_GPU_TEST_CORPUS at import
    corpus_dir, out_dir = corpus
    instance = dg.DagsterInstance.get()
    assert "postgres" in type(instance.run_storage).__name__.lower()
    files = loc.corpus.list_files()
    keys = [f.key for f in files]
    assert len(keys) == 9
    instance.add_dynamic_partitions(loc.embeddings.partitions_def.name, keys)
    backfill_id = submit_asset_backfill(instance, loc.defs, loc.embeddings.key, keys, title="e2e")
    ws = _workspace(tmp_path)
    with DaemonProcess(ws, log_file=tmp_path / "daemon.log") as daemon:
        final = wait_for_backfill(instance, backfill_id, len(keys), timeout_s=900, daemon=daemon,
                                  partitions_def_name=loc.embeddings.partitions_def.name)
        started = psutil.Process(daemon.proc.pid).children(recursive=True)
        # each run worker bills its unit's process once the worker exited (at the latest at its own exit)
        deadline = time.monotonic() + 120  # waiting for the run workers, not a speed assertion
        while len(bills := _process_bills(instance, loc.embeddings.key)) < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
    assert final.running == 0
    # the daemon's code server runs in a session of its own: stopping the daemon stops it too
    assert started and not [p.pid for p in started if alive(p)]
    summary = {s.partition_key: s for s in summarize_partitions(
        instance, loc.embeddings.key, keys, backfill_id, loc.embeddings.partitions_def.name)}
    assert final.runs == 3 and final.failed == 1 and final.succeeded == 8

    # the undecodable file fails alone (its run's other partitions are materialized), with an error naming the file
    bad = summary[partition_key_for("latin1")]
    assert not bad.ok
    assert "latin1" in bad.error and "utf-8" in bad.error
    assert bad.run_id is not None
    assert not (out_dir / "e2e_embeddings" / f"{bad.partition_key}.parquet").exists()
    assert not (tmp_path / "pwned").exists()

    model = SentenceTransformer(str(resolve_model_path("all-MiniLM-L6-v2")), device="cpu")
    expected_rows = {f.key: len(expected_records(Path(f.uri))) for f in files if f.relative_name != "latin1"}
    assert expected_rows[partition_key_for("empty")] == 0
    assert expected_rows[partition_key_for("blank records")] == 0
    assert expected_rows[partition_key_for(WEIRD_NAME)] == 3
    units: dict[str, list[dict]] = {}
    for f in files:
        if f.relative_name == "latin1":
            continue
        s = summary[f.key]
        assert s.ok, f"{f.key}: {s.error}"
        rec = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=loc.embeddings.key, asset_partitions=[f.key]), limit=5
        ).records
        assert len(rec) == 1, f"{f.key} materialized {len(rec)} times"
        md = {k: v.value for k, v in rec[0].asset_materialization.metadata.items()}
        assert md["embedding/rows"] == expected_rows[f.key]
        assert md["embedding/dim"] == "384"  # a setting: text, not plotted
        assert md["dagster_gpu/backend"] == "local"
        assert md["billing/source"] == "measured"
        assert md["billing/device_type"] == "cpu"
        assert md["billing/rate_usd_per_gpu_hour"] == "0.05"
        assert 0.0 < md["embedding/useful_fraction"] <= 1.0
        assert md["embedding/useful_fraction"] == pytest.approx(md["embedding/seconds"] / md["billing/wall_seconds"], rel=2e-3)  # each rounded to 4 digits
        units.setdefault(rec[0].run_id, []).append(md)
        assert md["billing/cost_usd"] == pytest.approx(md["billing/gpu_seconds"] * 0.05 / 3600, rel=1e-3)
        assert "CPU-only" in md["gpu/unavailable_reason"]
        table = pq.read_table(out_dir / "e2e_embeddings" / f"{f.key}.parquet")
        assert table.num_rows == expected_rows[f.key]
        assert table.schema.field("vector").type == pa.list_(pa.float32(), 384)
        if table.num_rows:
            texts = [t for _, t in expected_records(Path(f.uri))]
            assert table.column("record_id").to_pylist() == [i for i, _ in expected_records(Path(f.uri))]
            ours = np.stack(table.column("vector").to_numpy(zero_copy_only=False))
            direct = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
            cos = np.sum(ours * direct, axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(direct, axis=1))
            assert cos.min() >= 0.999, f"{f.key}: min cosine {cos.min()}"
    # ranges of 4: three runs, each one work unit that loaded the model once for all its partitions
    runs = instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
    assert len(runs) == 3
    assert sorted(len(mds) for mds in units.values()) == [1, 3, 4]  # the range with latin1 materialized 3 of 4
    for mds in units.values():
        n = {m["dagster_gpu/unit_partitions"] for m in mds}
        assert n == {len(mds) + (1 if len(mds) == 3 else 0)}  # the latin1 unit set out to embed 4
        positions = [m["dagster_gpu/unit_position"] for m in mds]
        assert len(set(positions)) == len(mds) and max(positions) < n.pop()
        # the unit's start-up (a process cannot start, import torch and load the model in under 1 s) is
        # shared by its partitions, so their billed seconds add up to more than 1 s
        assert sum(m["billing/wall_seconds"] for m in mds) > 1.0
    # the process bills (billing/source: process): one per unit, covering every partition it set out to embed,
    # the latin1 one included; a unit's process ran longer than its partitions' measured shares (its tail)
    assert sorted(len(g) for g in bills.values()) == [1, 4, 4], bills
    # a local unit that ran on the CPU is billed in CPU-seconds (bill/cpu_seconds, …), on a GPU in GPU-seconds
    cpu = {m["billing/device_type"] for mds in units.values() for m in mds} == {"cpu"}
    key = {k: billed(f"billing/{k}", cpu) for k in ("gpu_seconds", "unit_gpu_seconds", "rate_usd_per_gpu_hour",
                                                     "measured_gpu_seconds")}
    for unit, group in bills.items():
        total = group[0][key["unit_gpu_seconds"]]
        assert sum(o[key["gpu_seconds"]] for o in group) == pytest.approx(total, rel=1e-3)  # each part rounded to 4 significant digits
        assert all(o["local/unit"] == unit and o["dagster_gpu/backend"] == "local" for o in group)
        if cpu:
            assert all(o[key["rate_usd_per_gpu_hour"]] == 0.05 for o in group)  # this host's CPU rate
        measured = sum(o.get(key["measured_gpu_seconds"], 0.0) for o in group)
        assert 0 < measured < total <= group[0]["local/unit_wall_seconds"] + 1e-9, (unit, measured, total)
    unbilled = [o for g in bills.values() for o in g if o["_partition"] == bad.partition_key]
    assert len(unbilled) == 1 and unbilled[0][key["gpu_seconds"]] > 0 and "not materialized" in unbilled[0]["bill/note"]
    assert {str(m["local/unit"]) for mds in units.values() for m in mds} == set(bills)  # matched by local/unit
    # the summary shows each partition's share of its unit's process bill, the failed partition's included
    for group in bills.values():
        for o in group:
            assert summary[o["_partition"]].billed_cost_usd == pytest.approx(o["bill/cost_usd"], abs=1e-15), o
            assert summary[o["_partition"]].bill_source == "process"
    assert bad.billed_cost_usd is not None and bad.billed_cost_usd > 0
    from dagster_gpu.instance.bills import billed_total

    assert billed_total(summary.values()) == f"{sum(o['bill/cost_usd'] for g in bills.values() for o in g):.6f}"
    starting = instance.get_records_for_run(runs[0].dagster_run.run_id, of_type=dg.DagsterEventType.STEP_WORKER_STARTING).records
    assert starting and "local/pid" in starting[0].event_log_entry.dagster_event.engine_event_data.metadata
    # the Runs page shows where each partition ran and, once its step measured it, what it cost
    from dagster_gpu.partitions.run_ranges import run_partition_keys

    for r in runs:
        run = r.dagster_run
        assert run.tags["dagster_gpu/ran_on"].split(" on ")[0] == "local", run.tags
        run_keys = run_partition_keys(instance, run.tags, loc.embeddings.partitions_def.name)
        cost = sum(summary[pk].cost_usd for pk in run_keys if summary[pk].ok)  # the run's partitions, added up
        assert float(run.tags["dagster_gpu/cost_usd"]) == pytest.approx(cost, abs=1e-5)
    # each good partition's materialization ran its five blocking output checks, all passed
    from dagster_gpu.instance.checks import CHECKS

    for name in CHECKS:
        recs = instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(loc.embeddings.key, name), limit=50)
        passed = sorted(x.partition for x in recs if x.status.value == "SUCCEEDED")
        assert passed == sorted(k for k in keys if summary[k].ok), name
        # the undecodable file's partition: each check recorded failed with the reason, none left PLANNED
        failed = {x.partition: x.evaluation for x in recs if x.status.value == "FAILED"}
        assert sorted(failed) == sorted(k for k in keys if not summary[k].ok), name
        assert all("partition" in e.metadata["dagster_gpu/partition_failure"].value for e in failed.values())
        assert not [x for x in recs if x.status.value == "PLANNED"], name
