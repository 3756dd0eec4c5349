"""The work unit inside Dagster's op machinery, preempted: SIGTERM mid-partition commits the embedded batches,
records one engine event and no step outcome (no failure, no success, no materialization), and exits 143; the
rerun continues after the committed parts and materializes the uninterrupted run's rows and vectors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq

from dagster_gpu.worker.preemption import EXIT_PREEMPTED
from tests.checkpoint_child import PARTITION_KEY, embed, load_test_model, write_corpus

ROOT = Path(__file__).resolve().parents[1]


def _child(home: Path, corpus: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, "DAGSTER_HOME": str(home), "DAGSTER_GPU_CPU_SHARE": "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "tests.preempt_unit_child", str(corpus), str(out)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigterm_preempts_the_unit_without_a_step_outcome_and_the_rerun_resumes(tmp_path, monkeypatch):
    home, corpus, out = tmp_path / "home", tmp_path / "corpus", tmp_path / "out"
    home.mkdir()
    corpus.mkdir()
    src = write_corpus(corpus / PARTITION_KEY, 120, max_words=16)
    output = out / "emb" / f"{PARTITION_KEY}.parquet"

    first = _child(home, corpus, out)
    deadline = time.monotonic() + 900
    while not list(out.glob(f"emb/.{PARTITION_KEY}.parquet.parts/*/part-000001.parquet")):
        assert first.poll() is None, first.stdout.read()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    first.send_signal(signal.SIGTERM)
    log, _ = first.communicate(timeout=300)
    assert first.returncode == EXIT_PREEMPTED, log
    assert not output.exists()
    parts = sorted(out.glob(f"emb/.{PARTITION_KEY}.parquet.parts/*/part-*.parquet"))
    committed = sum(pq.read_metadata(p).num_rows for p in parts)
    assert committed >= 32

    with dg.DagsterInstance.from_config(str(home)) as instance:
        (run,) = instance.get_runs()
        types = [r.event_log_entry.dagster_event.event_type for r in instance.get_records_for_run(run.run_id).records
                 if r.event_log_entry.dagster_event is not None]
        assert dg.DagsterEventType.STEP_FAILURE not in types and dg.DagsterEventType.STEP_SUCCESS not in types
        assert dg.DagsterEventType.ASSET_MATERIALIZATION not in types
        engine = [r.event_log_entry for r in instance.get_records_for_run(
            run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT).records if "preempted" in r.event_log_entry.message]
        assert len(engine) == 1 and "SIGTERM" in engine[0].message
        md = engine[0].dagster_event.engine_event_data.metadata
        assert md["dagster_gpu/committed_rows"].value == committed
        assert md["dagster_gpu/preempted_partition"].text == PARTITION_KEY

    second = _child(home, corpus, out)
    log, _ = second.communicate(timeout=900)
    assert second.returncode == 0, log
    with dg.DagsterInstance.from_config(str(home)) as instance:
        mat = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey("emb"),
                                                                    asset_partitions=[PARTITION_KEY]), limit=1).records
        assert mat[0].asset_materialization.metadata["embedding/resumed_rows"].value == committed
    assert not (out / "emb" / f".{PARTITION_KEY}.parquet.parts").exists()
    monkeypatch.setenv("DAGSTER_GPU_CPU_SHARE", "0")
    clean = tmp_path / "clean.parquet"
    embed(str(src), str(clean), load_test_model(), checkpoint=False)
    assert pq.read_table(output).equals(pq.read_table(clean))  # rows and vectors bit for bit (metadata apart)
