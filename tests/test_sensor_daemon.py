"""The corpus sensor and the index's automation under the real Dagster daemon (``dagster-daemon run`` on a
PostgreSQL instance; code location tests/locations/sensor_location.py):

- files arriving across ticks are held by the freshness knob, then requested in one run; a daemon restarted
  while files are held requests them once, when the first held file has waited ``max_delay_seconds``
  (the cursor kept since when): runs stay queued (``max_concurrent_runs: 0``), nothing is embedded;
- a broken file fails its partition and is not requested again while unchanged; fixed, it is embedded at the
  next tick; the index catches up with every materialization of the embeddings (a changed file too) with no
  command: its ``AutomationCondition.eager()`` evaluated by ``index_automation_sensor`` (local backend, real
  worker processes).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable

import dagster as dg
import pytest
from dagster._core.scheduler.instigation import InstigatorType, TickStatus

from dagster_gpu.commands.backfill import DaemonProcess
from dagster_gpu.partitions.run_ranges import range_tags
from tests.conftest import REPO, fortune_records, fresh_pg_home, reimport
from tests.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

LOCATION = REPO / "tests" / "locations" / "sensor_location.py"
SENSOR = "sd_embeddings_corpus_sensor"


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace.yaml"
    ws.write_text(f"load_from:\n  - python_file:\n      relative_path: {LOCATION}\n      working_directory: {REPO}\n"
                  "      location_name: sensors\n")
    return ws


def _ticks(instance: dg.DagsterInstance, name: str) -> list:
    """The sensor's ticks, oldest first."""
    for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
        if state.instigator_name == name:
            return list(reversed(instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=500)))
    return []


def _wait(pred: Callable[[], object], timeout_s: float, what: str, log: Path):
    """:func:`tests.waiting.wait_for` once a second, failing with the daemon log's tail."""
    return wait_for(pred, timeout_s, what=what, why=lambda: "daemon log tail:\n" + (
        log.read_text(errors="replace")[-4000:] if log.exists() else "(no daemon log)"))


def _held_tick(instance, n_files: int):
    return next((t for t in _ticks(instance, SENSOR)
                 if t.status == TickStatus.SKIPPED and (t.skip_reason or "").startswith(f"held {n_files} file")), None)


def test_held_files_are_requested_once_in_one_run_across_a_daemon_restart(pg, tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    monkeypatch.setenv("DAGSTER_GPU_SD_DIR", str(tmp_path))
    monkeypatch.setenv("DAGSTER_GPU_SD_INTERVAL", "3")
    monkeypatch.setenv("DAGSTER_GPU_SD_MAX_DELAY", "45")
    log = tmp_path / "daemon.log"
    ws = _workspace(tmp_path)
    with fresh_pg_home(pg, tmp_path, monkeypatch, max_runs=0):  # runs stay queued: only what is requested counts
        instance = dg.DagsterInstance.get()
        (corpus / "a.txt").write_text("first record\n")
        with DaemonProcess(ws, log_file=log):
            first = _wait(lambda: _held_tick(instance, 1), 300, "a tick holding a.txt", log)
            (corpus / "b.txt").write_text("second record\n")
            _wait(lambda: _held_tick(instance, 2), 120, "a tick holding a.txt and b.txt", log)
            # stop 15 s or more after the first hold, so a clock restarted by the restart would show
            time.sleep(max(0.0, first.timestamp + 15 - time.time()))
        assert instance.get_runs() == []
        assert instance.get_dynamic_partitions("sd_embeddings_files") == []  # held files are not partitions yet
        (corpus / "c.txt").write_text("third record\n")
        restarted = time.time()
        with DaemonProcess(ws, log_file=log):
            _wait(lambda: instance.get_runs(), 300, "the held files' run", log)
            n = len(_ticks(instance, SENSOR))
            _wait(lambda: len(_ticks(instance, SENSOR)) >= n + 3, 120, "three more ticks", log)
        runs = instance.get_runs()
        parts = instance.get_dynamic_partitions("sd_embeddings_files")
        ticks = _ticks(instance, SENSOR)
    assert len(runs) == 1, [r.tags for r in runs]
    assert range_tags(runs[0].tags) == ("a.txt", "c.txt")
    assert runs[0].status == dg.DagsterRunStatus.QUEUED
    assert parts == ["a.txt", "b.txt", "c.txt"]
    (release,) = [t for t in ticks if t.status == TickStatus.SUCCESS]
    assert release.run_ids == [runs[0].run_id]
    # released once a.txt had waited 45 s since the first daemon's tick held it, whenever the restart came
    assert release.timestamp - first.timestamp >= 45 - 3
    # the restarted daemon's first tick released at once if a.txt had waited 45 s by then (a clock restarted
    # by the restart would have held); every tick of it that held counted a.txt's wait from the first daemon's tick
    first_after = next(t for t in ticks if t.timestamp > restarted)
    if first_after.timestamp - first.timestamp >= 45 + 3:
        assert first_after.tick_id == release.tick_id, first_after.skip_reason
    for t in ticks:
        if t.timestamp > restarted and t.status == TickStatus.SKIPPED and t.skip_reason.startswith("held"):
            waited = float(re.search(r"oldest waited (\d+) s of 45", t.skip_reason).group(1))
            assert abs(waited - (t.timestamp - first.timestamp)) < 8, (t.skip_reason, t.timestamp - first.timestamp)
            assert t.skip_reason.startswith("held 3 files")
    # the ticks after it find nothing due (the files are partitions of a queued run); a tick the daemon's stop
    # interrupted stays STARTED
    after = [t for t in ticks if t.timestamp > release.timestamp and t.status != TickStatus.STARTED]
    assert after and all(t.status == TickStatus.SKIPPED and "no new or changed files" in t.skip_reason for t in after)


def _index_rows(tmp_path: Path) -> dict[str, int]:
    from dagster_gpu.index.lance import VectorIndex

    t = VectorIndex(str(tmp_path / "lance"), "sd_embeddings").open().to_arrow()
    keys = t.column("partition_key").to_pylist()
    return {k: keys.count(k) for k in set(keys)}


def _output_rows(tmp_path: Path, key: str) -> int:
    import pyarrow.parquet as pq

    (path,) = (tmp_path / "out").rglob(f"{key}*.parquet")
    return pq.read_metadata(path).num_rows


def _latest_id(instance, key: dg.AssetKey, pk: str) -> int:
    recs = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, asset_partitions=[pk]), limit=1).records
    return recs[0].storage_id if recs else -1


def test_a_fixed_broken_file_is_embedded_and_the_index_follows_with_no_command(pg, tmp_path, monkeypatch):
    from dagster_gpu.partitions.status import partition_status
    from dagster_gpu.partitions.source_versions import failed_reads

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    good = fortune_records("cookie", 6)
    (corpus / "bad.txt").write_bytes("caf\xe9 au lait\n%\n".encode("latin-1"))  # not UTF-8: its partition fails
    (corpus / "good.txt").write_text("\n%\n".join(good) + "\n")
    monkeypatch.setenv("DAGSTER_GPU_SD_DIR", str(tmp_path))
    monkeypatch.setenv("DAGSTER_GPU_SD_INTERVAL", "5")
    monkeypatch.delenv("DAGSTER_GPU_SD_MAX_DELAY", raising=False)
    sensor_location = reimport("tests.locations.sensor_location")  # it reads $DAGSTER_GPU_SD_DIR at import
    log = tmp_path / "daemon.log"
    emb, ix = dg.AssetKey("sd_embeddings"), dg.AssetKey("sd_embeddings_index")
    with fresh_pg_home(pg, tmp_path, monkeypatch, max_runs=2) as home:
        # on a loaded 2-core host the code server can take over 60 s to answer the run coordinator, which then
        # fails the run it dequeues (DagsterUserCodeUnreachableError, seen here): retry it as Dagster allows
        yaml_path = home / "dagster.yaml"
        yaml_path.write_text(yaml_path.read_text().replace(
            "    dequeue_interval_seconds: 1\n",
            "    dequeue_interval_seconds: 1\n    max_user_code_failure_retries: 5\n    user_code_failure_retry_delay: 10\n"))
        instance = dg.DagsterInstance.get()
        asset = sensor_location.defs.get_assets_def(emb)
        with DaemonProcess(_workspace(tmp_path), log_file=log):
            _wait(lambda: partition_status(instance, asset)[:2] == ({"good.txt"}, {"bad.txt"}), 900,
                  "good.txt materialized and bad.txt failed", log)
            # the failed attempt recorded the version of bad.txt it read (on its failed checks)
            read = failed_reads(instance, emb, ["bad.txt"])["bad.txt"]
            assert read.source_version == sensor_location.corpus.file_for_key("bad.txt").version
            _wait(lambda: _latest_id(instance, ix, "good.txt") > _latest_id(instance, emb, "good.txt"), 600,
                  "the index of good.txt", log)
            assert _index_rows(tmp_path) == {"good.txt": _output_rows(tmp_path, "good.txt")}
            # bad.txt unchanged: the sensor's next ticks request nothing
            n = len(_ticks(instance, SENSOR))
            _wait(lambda: len(_ticks(instance, SENSOR)) >= n + 2, 120, "two more ticks", log)
            emb_runs = [r for r in instance.get_runs() if r.job_name == "sd_embeddings_job"]
            assert len(emb_runs) == 1
            # bad.txt fixed and good.txt changed (one record more): one run at the next tick, and the index follows
            (corpus / "bad.txt").write_text("café au lait\n%\n")
            (corpus / "good.txt").write_text("\n%\n".join(good + ["one record more"]) + "\n")
            before = _latest_id(instance, emb, "good.txt")
            _wait(lambda: partition_status(instance, asset)[:2] == ({"good.txt", "bad.txt"}, set())
                  and _latest_id(instance, emb, "good.txt") > before, 900, "bad.txt and good.txt embedded again", log)
            _wait(lambda: all(_latest_id(instance, ix, k) > _latest_id(instance, emb, k) for k in ("bad.txt", "good.txt")),
                  600, "the index of both", log)
            emb_runs = [r for r in instance.get_runs() if r.job_name == "sd_embeddings_job"]
        ix_runs = [r for r in instance.get_runs() if r.job_name != "sd_embeddings_job"]
    assert ix_runs  # the automation condition sensor's runs (no command, no backfill)
    assert len(emb_runs) == 2, [r.tags for r in emb_runs]
    assert range_tags(emb_runs[0].tags) == ("bad.txt", "good.txt")
    assert _index_rows(tmp_path) == {"bad.txt": 1, "good.txt": len(good) + 1}
    assert _output_rows(tmp_path, "good.txt") == len(good) + 1
