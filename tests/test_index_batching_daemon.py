"""The eager index batches its partitions under the real Dagster daemon (``dagster-daemon run`` on a PostgreSQL
instance; code location tests/locations/index_batch_location.py): embeddings partitions materialized one after
another, each seen by its own tick of ``index_automation_sensor``, are requested together at the first tick after
the index's batch cron schedule, in one run (Dagster 1.13.27's ``AutomationConditionSensorDefinition`` emits a
request of several partitions as a backfill: ``emit_backfills=True`` in
dagster/_core/definitions/automation_condition_sensor_definition.py; the backfill runs the index's
``BackfillPolicy.multi_run`` ranges). Runs stay queued (``max_concurrent_runs: 0``): nothing is indexed."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.storage.tags import PARTITION_NAME_TAG

from dagster_gpu.commands.backfill import DaemonProcess
from dagster_gpu.partitions.run_ranges import range_tags
from tests.conftest import REPO, fresh_pg_home, reimport
from tests.test_sensor_daemon import _wait

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

LOCATION = REPO / "tests" / "locations" / "index_batch_location.py"
SENSOR = "index_automation_sensor"
KEYS = ["a.txt", "b.txt", "c.txt"]


def _ticks(log: Path) -> int:
    """The automation sensor's finished ticks, as the daemon logs them (a default-running sensor has no stored
    instigator state to find its ticks by: dagster 1.13.27 dagster/_daemon/asset_daemon.py)."""
    return log.read_text(errors="replace").count(f"Finished auto-materialization tick for {SENSOR} ") if log.exists() else 0


def _index_requests(instance: dg.DagsterInstance) -> list[tuple[str, ...]]:
    """Each index run's partitions: its range, or its one partition."""
    out = []
    for run in instance.get_runs():
        if dg.AssetKey("ib_embeddings_index") not in (run.asset_selection or set()):
            continue
        rng = range_tags(run.tags)
        out.append(tuple(KEYS[KEYS.index(rng[0]):KEYS.index(rng[1]) + 1]) if rng else (run.tags[PARTITION_NAME_TAG],))
    return sorted(out)


def test_partitions_materialized_across_ticks_are_indexed_in_one_run(pg, tmp_path, monkeypatch):
    # the gate opens once, at a minute 3 minutes ahead: every materialization below lands before it
    gate = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=3)).replace(second=0, microsecond=0)
    monkeypatch.setenv("DAGSTER_GPU_IB_DIR", str(tmp_path))
    monkeypatch.setenv("DAGSTER_GPU_IB_CRON", f"{gate.minute} {gate.hour} * * *")
    location = reimport("tests.locations.index_batch_location")
    (tmp_path / "corpus").mkdir()
    ws = tmp_path / "workspace.yaml"
    ws.write_text(f"load_from:\n  - python_file:\n      relative_path: {LOCATION}\n      working_directory: {REPO}\n"
                  "      location_name: index_batch\n")
    log = tmp_path / "daemon.log"
    emb = dg.AssetKey("ib_embeddings")
    with fresh_pg_home(pg, tmp_path, monkeypatch, max_runs=0):
        instance = dg.DagsterInstance.get()
        instance.add_dynamic_partitions(location.ib_embeddings.partitions_def.name, KEYS)
        with DaemonProcess(ws, log_file=log, instance=instance):
            # its first evaluation only starts the condition's cursor
            _wait(lambda: _ticks(log) >= 2, 300, "two ticks of the automation sensor", log)
            for key in KEYS:  # each materialization is seen by a tick of its own: eager alone requests each apart
                n = _ticks(log)
                instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=emb, partition=key))
                _wait(lambda: _ticks(log) >= n + 2, 120, f"two ticks after {key}", log)
            if dt.datetime.now(dt.timezone.utc) >= gate:
                pytest.fail(f"the three materializations took past {gate:%H:%M} UTC on this host: nothing to compare")
            assert _index_requests(instance) == []  # held until the schedule's tick
            _wait(lambda: _index_requests(instance), 300, "the index's run after the cron tick", log)
            time.sleep(15)  # two more ticks: nothing else is requested
            assert _index_requests(instance) == [tuple(KEYS)]
