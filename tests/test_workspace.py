"""workspace.yaml loads as the webserver loads it (a code-server subprocess per location)."""

from __future__ import annotations

import dagster as dg
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget

from tests.conftest import REPO


def test_workspace_yaml_loads_like_the_webserver(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_GPU_CORPUS_URL", str(tmp_path))
    with dg.instance_for_test() as instance, WorkspaceProcessContext(
        instance, WorkspaceFileTarget(paths=[str(REPO / "workspace.yaml")])
    ) as ctx:
        request = ctx.create_request_context()
        entries = request.get_code_location_entries()
        assert list(entries) == ["dagster_gpu_demo"]
        entry = entries["dagster_gpu_demo"]
        assert entry.load_error is None, entry.load_error
        repo = next(iter(entry.code_location.get_repositories().values()))
        assert [j.name for j in repo.get_all_jobs() if j.name == "fortune_embeddings_job"] == ["fortune_embeddings_job"]
        job = repo.get_full_job("fortune_embeddings_job")
        # the job's run config schema is gpu_executor's (its backend enum), so the UI launches through it
        assert "GpuBackend" in job.job_snapshot.config_schema_snapshot.all_config_snaps_by_key
        # the corpus sensor, and the automation condition sensor keeping the index in step (running by default)
        assert {s.name for s in repo.get_sensors()} == {"fortune_embeddings_corpus_sensor", "index_automation_sensor"}
        assert repo.get_sensor("index_automation_sensor").default_status == dg.DefaultSensorStatus.RUNNING
        assert {s.name for s in repo.get_schedules()} == {"fortune_embeddings_missing_schedule"}
        keys = {n.asset_key for n in repo.get_asset_node_snaps()}
        assert dg.AssetKey("fortune_embeddings") in keys
        snap = next(n for n in repo.get_asset_node_snaps() if n.asset_key == dg.AssetKey("fortune_embeddings"))
        assert snap.partitions is not None
        assert snap.partitions.name == "fortune_embeddings_files"
