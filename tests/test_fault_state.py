"""The fault benchmark's per-run override file (bench/fault_state.py) read by bench/faults_pipeline.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from fault_state import clear_run_override, kubernetes_overrides, merged_kubernetes, read_state, set_run_override  # noqa: E402

IMAGE = "registry.example.com/ml/dagster-gpu:2026.12-does-not-exist"


def test_an_override_applies_to_its_run_only_and_is_gone_once_cleared(tmp_path):
    f = tmp_path / "state.json"
    assert read_state(f) == {"runs": {}} and read_state(None) == {"runs": {}}
    set_run_override(f, "run-a", {"image": IMAGE})
    set_run_override(f, "run-b", {"sharing_strategy": "TimeSlicing"})
    section = {"image": "dagster-gpu:dev", "namespace": "dagster-gpu", "sharing_strategy": None}
    state = read_state(f)
    assert merged_kubernetes(section, state, "run-a") == {**section, "image": IMAGE}
    assert merged_kubernetes(section, state, "run-b") == {**section, "sharing_strategy": "TimeSlicing"}
    assert merged_kubernetes(section, state, "run-c") == section
    assert clear_run_override(f, "run-a") is True and clear_run_override(f, "run-a") is False
    assert merged_kubernetes(section, read_state(f), "run-a") == section
    assert list(read_state(f)["runs"]) == ["run-b"]
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temp file left by the atomic writes


def test_only_the_fault_keys_can_be_overridden(tmp_path):
    with pytest.raises(ValueError, match="cannot override \\['restricted'\\]"):
        set_run_override(tmp_path / "s.json", "r", {"restricted": False})
    with pytest.raises(ValueError, match="cannot override"):
        kubernetes_overrides({"runs": {"r": {"kubernetes": {"postgres_password_secret": {}}}}}, "r")
    assert not (tmp_path / "s.json").exists()
    # the preemption fault's settings (a lower PriorityClass, a CPU request) are not security settings
    set_run_override(tmp_path / "p.json", "r", {"priority_class_name": "dagster-gpu-batch", "cpu_request": "40"})
    assert kubernetes_overrides(read_state(tmp_path / "p.json"), "r")["cpu_request"] == "40"


def test_a_malformed_file_is_named_in_the_error(tmp_path):
    f = tmp_path / "state.json"
    f.write_text("{not json")
    with pytest.raises(ValueError, match=str(f)):
        read_state(f)
    f.write_text('{"runs": []}')
    with pytest.raises(ValueError, match="'runs' object"):
        read_state(f)
    with pytest.raises(ValueError, match="must be an object"):
        kubernetes_overrides({"runs": {"r": "image"}}, "r")
