"""The run queue limit given to the dagster-daemon ``dagster-gpu backfill`` starts: read from the user's
``dagster.yaml`` as Dagster reads it, applied through an ``InstanceRef`` (``dagster-daemon run --instance-ref``,
``dagster/_daemon/cli/__init__.py``, dagster 1.13) without rewriting the file."""

from __future__ import annotations

import dagster as dg
import pytest
from dagster._core.instance.ref import InstanceRef
from dagster._serdes import deserialize_value

from dagster_gpu.commands.backfill import DaemonProcess
from dagster_gpu.instance.run_queue import (configured_run_limit, daemon_instance_ref, host_run_limit,
                                            run_queue_overrides)

QUEUED = ("run_coordinator:\n  module: dagster._core.run_coordinator\n  class: QueuedRunCoordinator\n  config:\n"
          "    max_concurrent_runs: 50\n    dequeue_interval_seconds: 1\n"
          "    tag_concurrency_limits:\n      - key: team\n        limit: 1\ntelemetry:\n  enabled: false\n")


def _limit(ref) -> int:
    with dg.DagsterInstance.from_ref(ref) as instance:
        return instance.get_concurrency_config().run_queue_config.max_concurrent_runs


def test_host_run_limit_is_the_cpu_count_at_least_one():
    assert host_run_limit(2) == 2
    assert host_run_limit(64) == 64
    assert host_run_limit(0) == 1


def test_the_limit_dagster_yaml_sets_is_read_from_either_section():
    assert configured_run_limit({}) is None
    assert configured_run_limit({"run_coordinator": {"class": "DefaultRunCoordinator"}}) is None
    assert configured_run_limit({"run_coordinator": {"class": "QueuedRunCoordinator",
                                                     "config": {"max_concurrent_runs": 7}}}) == 7
    assert configured_run_limit({"run_coordinator": {"class": "QueuedRunCoordinator", "config": {"max_concurrent_runs": 7}},
                                 "concurrency": {"runs": {"max_concurrent_runs": 3}}}) == 3


def test_overrides_keep_the_rest_of_the_queue_config_and_refuse_under_one():
    o = run_queue_overrides({"run_coordinator": {"class": "QueuedRunCoordinator",
                                                 "config": {"max_concurrent_runs": 50, "dequeue_interval_seconds": 1}},
                             "concurrency": {"runs": {"max_concurrent_runs": 9, "tag_concurrency_limits": []},
                                             "pools": {"default_limit": 2}}}, 2)
    assert o["run_coordinator"]["config"] == {"max_concurrent_runs": 2, "dequeue_interval_seconds": 1}
    assert o["concurrency"] == {"runs": {"max_concurrent_runs": 2, "tag_concurrency_limits": []},
                                "pools": {"default_limit": 2}}
    assert "concurrency" not in run_queue_overrides({}, 2)
    with pytest.raises(ValueError, match="max_concurrent_runs must be at least 1, got 0"):
        run_queue_overrides({}, 0)


def test_the_daemons_instance_gets_the_limit_and_the_users_file_is_left_as_it_is(tmp_path):
    (tmp_path / "dagster.yaml").write_text(QUEUED)
    ref, limit, why = daemon_instance_ref(str(tmp_path), 3)
    assert (limit, why) == (3, "--max-concurrent-runs")
    assert _limit(ref) == 3
    with dg.DagsterInstance.from_ref(ref) as instance:  # the same storage, the tag limits kept
        assert instance.root_directory == str(tmp_path)
        assert [t["key"] for t in instance.get_concurrency_config().run_queue_config.tag_concurrency_limits] == ["team"]
    assert (tmp_path / "dagster.yaml").read_text() == QUEUED
    assert _limit(InstanceRef.from_dir(str(tmp_path))) == 50
    # no flag: the file's own limit stands
    ref, limit, why = daemon_instance_ref(str(tmp_path), None)
    assert (limit, _limit(ref)) == (50, 50) and "dagster.yaml" in why
    # no flag, no limit in the file: the host's CPU count
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    ref, limit, why = daemon_instance_ref(str(tmp_path), None)
    assert (limit, _limit(ref)) == (host_run_limit(), host_run_limit()) and "CPU count" in why


def test_the_daemon_is_started_with_the_ref_dagster_daemon_accepts(tmp_path):
    from dagster._daemon.cli import run_command

    (tmp_path / "dagster.yaml").write_text(QUEUED)
    ref, _, _ = daemon_instance_ref(str(tmp_path), 4)
    cmd = DaemonProcess("ws.yaml", instance_ref=ref).command()
    assert cmd[2:4] == ["dagster._daemon", "run"] and cmd[-2:] == ["-w", "ws.yaml"]
    assert _limit(deserialize_value(cmd[cmd.index("--instance-ref") + 1], InstanceRef)) == 4
    assert "--instance-ref" in {o for p in run_command.params for o in p.opts}
    assert "--instance-ref" not in DaemonProcess("ws.yaml").command()
