"""The one atomic writer (``core/jsonfile.write_atomic``) and every file written through it: the new content
or the old one, never a part, and no temp file left behind when the write fails."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from dagster_gpu.core.jsonfile import read_json, write_atomic, write_json
from dagster_gpu.k8s.sharing_failures import SharingFailures
from dagster_gpu.slurm.script import JOB_SCRIPT, write_job_script, write_manifest


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_write_atomic_replaces_the_content_with_the_mode_asked(tmp_path):
    p = tmp_path / "sub" / "f.json"
    assert write_atomic(p, "one") == p and p.read_text() == "one" and _mode(p) == 0o600
    write_atomic(p, b"two", mode=0o644)
    assert p.read_bytes() == b"two"
    assert _mode(p) == 0o644 & ~_umask()
    assert sorted(x.name for x in p.parent.iterdir()) == ["f.json"]


def _umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


def test_a_failed_rename_leaves_the_old_file_and_no_temp_file(tmp_path):
    target = tmp_path / "d"
    target.mkdir()
    (target / "x").write_text("keep")  # a non-empty directory: os.replace cannot put a file there
    with pytest.raises(OSError):
        write_atomic(target, "new")
    assert (target / "x").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_write_json_refuses_what_json_cannot_hold_before_touching_a_file(tmp_path):
    p = tmp_path / "f.json"
    write_json(p, {"a": 1})
    with pytest.raises(TypeError):
        write_json(p, {"a": object()})
    assert read_json(p) == {"a": 1}
    assert sorted(x.name for x in tmp_path.iterdir()) == ["f.json"]


def test_the_job_script_and_the_manifest_leave_no_temp_file_when_their_write_fails(tmp_path):
    (tmp_path / "job.sh").mkdir()
    (tmp_path / "job.sh" / "x").write_text("")
    with pytest.raises(OSError):
        write_job_script(tmp_path, "job.sh")
    (tmp_path / "manifest.json").mkdir()
    (tmp_path / "manifest.json" / "x").write_text("")
    with pytest.raises(OSError):
        write_manifest(tmp_path / "manifest.json", "b1", [{"argv": ["true"], "env": {}}])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sh", "manifest.json"]
    ok = write_job_script(tmp_path / "ok")
    assert ok.read_text() == JOB_SCRIPT and _mode(ok) == 0o700
    m = write_manifest(tmp_path / "ok" / "manifest.json", "b1", [{"argv": ["true"], "env": {}}])
    assert json.loads(m.read_text())["batch"] == "b1" and _mode(m) == 0o600


def test_sharing_failures_leave_no_temp_file_when_their_write_fails(tmp_path):
    path = tmp_path / "sharing-failures.json"
    path.mkdir()
    (path / "x").write_text("")
    with pytest.raises(OSError):
        SharingFailures(path).record("pool-a", "MPS control daemon failed", now=100.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sharing-failures.json"]
    good = tmp_path / "ok.json"
    SharingFailures(good).record("pool-a", "MPS control daemon failed", now=100.0)
    assert json.loads(good.read_text()) == {"pool-a": {"reason": "MPS control daemon failed", "at": 100.0}}
    assert _mode(good) == 0o600
