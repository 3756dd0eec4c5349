"""``dagster-gpu backfill`` beside the real Dagster daemon (PostgreSQL instance, local backend on the CPU):
a missing workspace is one line before anything is stored; a daemon that dies is shown with its last log
lines and its backfill is canceled, not left for the next daemon; with a daemon already running on the
instance (as under ``dagster dev``) the backfill is submitted to it and followed, no second daemon started."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.execution.backfill import BulkActionStatus
from rich.console import Console

from dagster_gpu.commands.backfill import BackfillProgress, DaemonProcess, live_backfill_daemon
from dagster_gpu.commands.main import main
from tests.conftest import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

MODULE = "tests.locations.e2e_location"
ASSET = "e2e_embeddings"


@pytest.fixture
def corpus(tmp_path, monkeypatch, pg_home):
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "one").write_text("the first record\n%\nthe second record\n")
    (d / "two").write_text("a third record\n")
    monkeypatch.setenv("DAGSTER_GPU_TEST_CORPUS", str(d))
    monkeypatch.setenv("DAGSTER_GPU_TEST_OUTPUT", str(tmp_path / "out"))
    monkeypatch.chdir(tmp_path)  # outside the repository: no ./workspace.yaml
    sys.modules.pop(MODULE, None)  # the location reads the corpus from the environment at import
    yield d
    sys.modules.pop(MODULE, None)


def _workspace(path: Path, body: str | None = None) -> Path:
    path.write_text(body if body is not None else (
        f"load_from:\n  - python_file:\n      relative_path: {REPO / 'tests' / 'locations' / 'e2e_location.py'}\n"
        f"      working_directory: {REPO}\n      location_name: e2e\n"))
    return path


def test_missing_workspace_is_one_line_before_anything_is_stored(corpus):
    """As a user runs it (a process of its own, Python's default warning filters): stderr is one line."""
    import os
    import subprocess

    assert not Path("workspace.yaml").exists()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cp = subprocess.run([sys.executable, "-m", "dagster_gpu.commands.main", "backfill", "-m", MODULE, "-a", ASSET],
                        capture_output=True, text=True, env=env, timeout=600)
    assert cp.returncode == 2, cp.stderr
    err = cp.stderr
    assert err.count("\n") == 1 and "Traceback" not in err and "BetaWarning" not in err, err  # the location warns at import
    assert err.startswith("dagster-gpu backfill: workspace file workspace.yaml not found")
    instance = dg.DagsterInstance.get()
    assert instance.get_backfills() == []
    assert instance.get_dynamic_partitions(f"{ASSET}_files") == []  # not even the corpus files registered


def test_a_daemon_that_dies_shows_why_and_its_backfill_is_canceled(corpus, tmp_path, capsys):
    # a workspace the daemon cannot load: dagster-daemon exits (code 1: the YAML's schema is checked at start)
    ws = _workspace(tmp_path / "bad-workspace.yaml", "load_from:\n  - python_fiel: nowhere.py\n")
    assert main(["backfill", "-m", MODULE, "-a", ASSET, "-w", str(ws), "--bills-wait", "0"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" not in err.splitlines()[0]
    assert "dagster-daemon exited with code" in err and "the last lines of its log" in err
    assert "python_fiel" in err  # the daemon's own words about the workspace, from its log
    instance = dg.DagsterInstance.get()
    [backfill] = instance.get_backfills()
    assert backfill.status == BulkActionStatus.CANCELED  # no later daemon picks it up
    assert f"backfill {backfill.backfill_id} canceled" in err
    assert live_backfill_daemon(instance) is None


def test_backfill_is_submitted_to_the_daemon_already_running(corpus, tmp_path, capsys):
    instance = dg.DagsterInstance.get()
    log = tmp_path / "dev-daemon.log"
    with DaemonProcess(_workspace(tmp_path / "dev-workspace.yaml"), log_file=log, instance=instance) as dev:
        deadline = time.monotonic() + 120  # the daemon's first heartbeat, after loading the workspace
        while (beat := live_backfill_daemon(instance)) is None and time.monotonic() < deadline:
            assert dev.why_dead() is None, dev.why_dead()
            time.sleep(1)
        assert beat is not None, "the daemon wrote no heartbeat in 120 s"
        # no -w and no ./workspace.yaml: the running daemon loads the code, this command starts nothing
        assert main(["backfill", "-m", MODULE, "-a", ASSET, "--bills-wait", "30"]) == 0
        out = capsys.readouterr().out
        assert f"Submitted to the dagster-daemon already running on this instance (id {beat.daemon_id}" in out
        assert "Stopping the dagster-daemon" not in out
        assert dev.why_dead() is None  # still serving the instance
        ids = {b.daemon_id for b in instance.get_daemon_heartbeats().values()}
    assert ids == {beat.daemon_id}  # one daemon wrote every heartbeat
    assert "Another BACKFILL daemon is still sending heartbeats" not in log.read_text()
    for key in ("one", "two"):
        recs = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(ASSET), asset_partitions=[key]), limit=5).records
        assert len(recs) == 1
    [backfill] = instance.get_backfills()
    assert backfill.status == BulkActionStatus.COMPLETED_SUCCESS
    assert "2/2 ok" in out
    # the daemon stopped: its heartbeats are gone, so the next command does not take it for a running one
    assert instance.get_daemon_heartbeats() == {}
    assert live_backfill_daemon(instance) is None


def test_waiting_for_runs_to_settle_is_said_once_with_its_bound():
    from dagster_gpu.commands.progress import BackfillFollower

    console = Console(record=True, width=200)
    follow = BackfillFollower(console, total=2)
    with follow:
        follow(BackfillProgress(total=2, succeeded=1, running=1, runs=1, status="REQUESTED", runs_in_flight=1))
        follow(BackfillProgress(total=2, succeeded=2, runs=1, status="REQUESTED", runs_in_flight=1))
        follow(BackfillProgress(total=2, succeeded=2, runs=1, status="COMPLETED_SUCCESS", runs_in_flight=1))
    text = console.export_text()
    assert text.count("All 2 partitions done; waiting for 1 run(s) to end") == 1
    assert "settle_wait_seconds (default local 30 s, slurm 20 s, kubernetes 15 s)" in text
