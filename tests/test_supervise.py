"""The supervise wrapper: runs the worker and records its exit code in a status file."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dagster_gpu.local.supervise import describe_exit, main, read_status

PY = sys.executable


def supervise(tmp_path: Path, *cmd: str, timeout: float = 30) -> tuple[int, dict]:
    status = tmp_path / "status.json"
    proc = subprocess.run(
        [PY, "-m", "dagster_gpu.local.supervise", "--status-file", str(status), "--", *cmd],
        capture_output=True, text=True, timeout=timeout,
    )
    return proc.returncode, read_status(status)


def test_exit_zero(tmp_path):
    t0 = time.time()
    rc, st = supervise(tmp_path, PY, "-c", "pass")
    assert rc == 0
    assert st["exit_code"] == 0
    assert st["message"] == "worker exited with code 0"
    assert t0 - 1 <= st["started"] <= st["finished"] <= time.time() + 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]  # no .tmp left behind


def test_exit_three(tmp_path):
    rc, st = supervise(tmp_path, PY, "-c", "import sys; sys.exit(3)")
    assert rc == 3
    assert (st["exit_code"], st["message"]) == (3, "worker exited with code 3")


def test_child_killed_by_sigterm(tmp_path):
    rc, st = supervise(tmp_path, PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert st["exit_code"] == -signal.SIGTERM == -15
    assert st["message"] == "worker killed by SIGTERM"
    assert rc == 128 + 15


def test_sigterm_to_supervisor_is_forwarded(tmp_path):
    status = tmp_path / "status.json"
    ready = tmp_path / "ready"
    child = f"import pathlib, time; pathlib.Path({str(ready)!r}).write_text('x'); time.sleep(60)"
    proc = subprocess.Popen([PY, "-m", "dagster_gpu.local.supervise", "--status-file", str(status), "--", PY, "-c", child])
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert time.monotonic() < deadline, "child never started"
            assert proc.poll() is None
            time.sleep(0.02)
        assert read_status(status) is None  # still running
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    st = read_status(status)
    assert st["exit_code"] == -15 and "SIGTERM" in st["message"]
    assert rc == 143


def test_missing_executable(tmp_path):
    missing = str(tmp_path / "no such worker")
    rc, st = supervise(tmp_path, missing, "--flag")
    assert rc == 127
    assert st["exit_code"] == 127
    assert repr(missing) in st["message"] and st["message"].startswith("cannot start worker")


def test_usage_errors(tmp_path, capsys):
    assert main(["--status-file", str(tmp_path / "s")]) == 2
    assert main(["--status", str(tmp_path / "s"), "--", "true"]) == 2
    assert main(["--status-file", str(tmp_path / "s"), "true"]) == 2
    assert "usage:" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    "code,msg",
    [(0, "worker exited with code 0"), (1, "worker exited with code 1"), (-9, "worker killed by SIGKILL"),
     (-2, "worker killed by SIGINT"), (-200, "worker killed by signal 200")],
)
def test_describe_exit(code, msg):
    assert describe_exit(code) == msg


def test_read_status_of_missing_or_partial_file(tmp_path):
    assert read_status(tmp_path / "absent") is None
    (tmp_path / "partial").write_text('{"exit_code": ')
    assert read_status(tmp_path / "partial") is None
