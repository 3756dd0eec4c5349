"""End to end through the fork server: a backfill of fortune files in ranged runs through gpu_executor (local
backend, ``forkserver_idle_seconds``) under the real Dagster daemon on PostgreSQL; every unit is forked from the
server, and its rows, vectors, metadata and process bill are what a fresh interpreter's are."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import dagster as dg
import numpy as np
import psutil
import pyarrow.parquet as pq
import pytest

from tests.conftest import FORTUNES, expected_records, reimport

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

FILES = ["goedel", "magic", "paradoxum", "translate-me", "news"]


def test_a_backfill_through_forked_workers_embeds_what_sentence_transformers_does(pg_home, tmp_path, runtime_dir, monkeypatch):
    from sentence_transformers import SentenceTransformer

    from dagster_gpu.commands.backfill import DaemonProcess, submit_asset_backfill, wait_for_backfill
    from dagster_gpu.embedding.model import resolve_model_path
    from tests.test_e2e_local import _process_bills, _workspace

    if not FORTUNES.is_dir():
        pytest.fail("the Debian package 'fortunes' is required (.ci/run installs it)")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in FILES:
        shutil.copyfile(FORTUNES / name, corpus / name)
    for k, v in {"DAGSTER_GPU_TEST_CORPUS": str(corpus), "DAGSTER_GPU_TEST_OUTPUT": str(tmp_path / "out"),
                 "DAGSTER_GPU_TEST_PER_RUN": "3", "DAGSTER_GPU_TEST_FORKSERVER": "60",
                 "XDG_RUNTIME_DIR": str(runtime_dir)}.items():
        monkeypatch.setenv(k, v)
    loc = reimport("tests.locations.e2e_location")  # it reads $DAGSTER_GPU_TEST_CORPUS at import
    instance = dg.DagsterInstance.get()
    keys = [f.key for f in loc.corpus.list_files()]
    instance.add_dynamic_partitions(loc.embeddings.partitions_def.name, keys)
    backfill_id = submit_asset_backfill(instance, loc.defs, loc.embeddings.key, keys, title="forked")
    ws = _workspace(tmp_path)
    try:
        with DaemonProcess(ws, log_file=tmp_path / "daemon.log") as daemon:
            final = wait_for_backfill(instance, backfill_id, len(keys), timeout_s=900, daemon=daemon,
                                      partitions_def_name=loc.embeddings.partitions_def.name)
            deadline = time.monotonic() + 120  # waiting for the run workers' bills, not a speed assertion
            while len(bills := _process_bills(instance, loc.embeddings.key)) < 2 and time.monotonic() < deadline:
                time.sleep(0.5)
    finally:  # the server would exit after 60 idle seconds; a test leaves nothing behind
        for p in psutil.process_iter(["cmdline"]):
            if any(str(runtime_dir) in a for a in (p.info["cmdline"] or [])):
                p.kill()
    assert (final.runs, final.succeeded, final.failed) == (2, 5, 0)

    # both units forked from the server: their launches say so
    runs = instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
    for r in runs:
        (starting,) = instance.get_records_for_run(r.dagster_run.run_id, of_type=dg.DagsterEventType.STEP_WORKER_STARTING).records
        md = starting.event_log_entry.dagster_event.engine_event_data.metadata
        assert md["local/forked"].value is True, md
    server_logs = list((Path(pg_home) / "dagster_gpu" / "local-workers").glob("forkserver-*.log"))
    assert len(server_logs) == 1 and "module(s) imported" in server_logs[0].read_text()

    # the rows and vectors are sentence-transformers' own, and each unit is billed by its process
    model = SentenceTransformer(str(resolve_model_path("all-MiniLM-L6-v2")), device="cpu")
    units = set()
    for f in loc.corpus.list_files():
        (rec,) = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=loc.embeddings.key, asset_partitions=[f.key]), limit=5).records
        md = {k: v.value for k, v in rec.asset_materialization.metadata.items()}
        units.add(md["local/unit"])
        records = expected_records(Path(f.uri))
        table = pq.read_table(tmp_path / "out" / "e2e_embeddings" / f"{f.key}.parquet")
        assert md["embedding/rows"] == table.num_rows == len(records)
        ours = np.stack(table.column("vector").to_numpy(zero_copy_only=False))
        direct = model.encode([t for _, t in records], normalize_embeddings=True, convert_to_numpy=True)
        np.testing.assert_allclose(ours, direct, atol=1e-5)
        assert 0.0 < md["embedding/useful_fraction"] <= 1.0
    assert len(units) == 2 and set(bills) == units
