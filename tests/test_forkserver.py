"""The local backend's fork server (dagster_gpu/local/forkserver.py): what keys a server, who may reach it, and
real launches through it: a worker forked from the preloaded server runs like one started as a fresh
interpreter (argv, environment, working directory, log, status file, exit code, SIGTERM to its session), holds
no thread, CUDA context or tokenizer state of the server's, and the server exits when idle."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from dagster_gpu.contracts import StepLaunch, WorkerStatus
from dagster_gpu.core.request import GpuRequest
from dagster_gpu.local import forkserver
from dagster_gpu.local.backend import LocalBackend
from dagster_gpu.policy.placement import Placement

REPO = Path(__file__).resolve().parents[1]


def test_the_key_covers_interpreter_directory_package_and_import_time_environment(monkeypatch):
    env = {"PATH": "/usr/bin", "HF_HUB_OFFLINE": "1", "DAGSTER_HOME": "/h"}
    key = forkserver.server_key("/venv/bin/python", "/repo", env)
    assert len(key) == 24 and key == forkserver.server_key("/venv/bin/python", "/repo", dict(env))
    # read at import time: another server
    assert forkserver.server_key("/venv/bin/python", "/repo", {**env, "HF_HUB_OFFLINE": "0"}) != key
    assert forkserver.server_key("/venv/bin/python", "/repo", {**env, "PYTHONPATH": "/x"}) != key
    assert forkserver.server_key("/other/python", "/repo", env) != key
    assert forkserver.server_key("/venv/bin/python", "/elsewhere", env) != key
    # read when the worker runs (from the environment each launch brings): the same server
    assert forkserver.server_key("/venv/bin/python", "/repo", {**env, "DAGSTER_HOME": "/other"}) == key
    # an edited file of this package: another server (the preloaded modules would be stale)
    stamp = forkserver._package_stamp()
    edited = [(p, size + 1 if p.endswith("unit.py") else size, mtime) for p, size, mtime in stamp]
    monkeypatch.setattr(forkserver, "_package_stamp", lambda: edited)
    assert forkserver.server_key("/venv/bin/python", "/repo", env) != key


def test_the_socket_directory_is_this_users_alone(runtime_dir):
    d = forkserver.socket_dir()
    assert d == runtime_dir / "dagster-gpu" and (d.stat().st_mode & 0o777) == 0o700
    d.chmod(0o755)  # others could reach a socket in it
    with pytest.raises(PermissionError, match="mode 0700"):
        forkserver.socket_dir()


def test_a_launch_is_a_module_run_with_absolute_paths():
    ok = forkserver.Launch(("/py", "-m", "dagster", "api", "execute_step"), {"A": "1"}, "/w", "/w/l.log", "/w/s.json")
    assert forkserver.Launch.from_json(ok.to_json()) == ok
    with pytest.raises(ValueError, match="-m"):
        forkserver.Launch(("/py", "-c", "print(1)"), {}, "/w", "/w/l.log", "/w/s.json")
    with pytest.raises(ValueError, match="absolute"):
        forkserver.Launch(("/py", "-m", "x"), {}, "w", "/w/l.log", "/w/s.json")


def _launch(run: str, args: tuple[str, ...], env: dict[str, str] | None = None) -> StepLaunch:
    return StepLaunch(run_id=run, step_key="probe", partition_keys=(), attempt=0,
                      argv=(sys.executable, "-m", "tests.forkserver_probe", *args), env=env or {},
                      request=GpuRequest(), placement=Placement(backend="local", reason="test"))


def _wait_ended(backend: LocalBackend, handle, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s  # waiting for the process, not a speed assertion
    while (st := backend.state(handle)).status == WorkerStatus.RUNNING and time.monotonic() < deadline:
        time.sleep(0.05)
    return st


def test_workers_forked_from_the_server_run_as_fresh_interpreters_do(tmp_path, runtime_dir, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.chdir(REPO)
    backend = LocalBackend(tmp_path / "logs", forkserver_idle_s=60)
    # the first launch with a new key starts the server and waits for its imports (no device is held meanwhile)
    first = backend.launch(_launch("r0", ("exit", "0")))
    assert first["forked"] is True
    assert _wait_ended(backend, first).status == WorkerStatus.SUCCEEDED
    sockets = list((runtime_dir / "dagster-gpu").glob("*.sock"))
    assert len(sockets) == 1 and (sockets[0].stat().st_mode & 0o777) == 0o600
    server_log = "".join(p.read_text() for p in (tmp_path / "logs").glob("forkserver-*.log"))
    assert "module(s) imported" in server_log and f"serving {sockets[0]}" in server_log

    h = backend.launch(_launch("r1", ("exit", "3", "a b; $(touch x)"), env={"PROBE": "launch's"}))
    assert h["forked"] is True and backend.handle_metadata(h)["local/forked"] is True
    st = _wait_ended(backend, h)
    assert (st.status, st.exit_code) == (WorkerStatus.FAILED, 3)
    assert json.loads(Path(h["status_file"]).read_text())["message"] == "worker exited with code 3"
    report = json.loads(Path(h["log_file"]).read_text().splitlines()[-1])
    assert report["argv"] == ["exit", "3", "a b; $(touch x)"]  # passed as a list, never through a shell
    assert report["name"] == "__main__" and report["cwd"] == str(REPO) and report["probe"] == "launch's"
    assert report["supervisor"] == h["pid"] and report["session"] == h["pid"]  # killpg(pid) reaches it
    # nothing of the server's state: one OS thread (no OpenMP or tokenizer pool), no CUDA context
    assert report["threads"] == 1 and report["cuda_initialized"] is False
    assert report["preloaded"] is True  # the point: torch was imported before the fork
    assert not (REPO / "x").exists()

    # SIGTERM to the unit's session reaches the worker, and the status file says so
    sleeper = backend.launch(_launch("r2", ("sleep", "60")))
    assert sleeper["forked"] is True
    time.sleep(0.5)
    backend.terminate(sleeper)
    st = _wait_ended(backend, sleeper)
    assert st.status == WorkerStatus.FAILED and st.exit_code == -signal.SIGTERM
    assert "SIGTERM" in st.message


def test_the_server_exits_idle_and_a_second_server_for_the_same_socket_does_not_start(tmp_path, runtime_dir):
    sock = forkserver.socket_dir() / "k.sock"
    import subprocess

    cmd = [sys.executable, "-m", "dagster_gpu.local.forkserver", "--socket", str(sock), "--idle-seconds", "1",
           "--preload", "json"]
    first = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not sock.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    second = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0 and "another server holds" in second.stdout
    out, _ = first.communicate(timeout=60)
    assert first.returncode == 0 and "idle for 1 s; exiting" in out
    assert not sock.exists()
    # with no server, a request says so (the backend then launches cold)
    req = forkserver.Launch((sys.executable, "-m", "json.tool"), {}, str(tmp_path), str(tmp_path / "l"), str(tmp_path / "s"))
    assert forkserver.request_launch(sock, req) is None


def test_a_server_that_does_not_come_up_leaves_the_units_cold_and_says_so(tmp_path, runtime_dir, monkeypatch):
    from dagster_gpu.local import backend as local_backend

    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.chdir(REPO)
    started = []

    class NeverBinds:
        returncode = None

        def poll(self):
            return None

    monkeypatch.setattr(forkserver, "start_server", lambda *a, **k: started.append(a) or NeverBinds())
    monkeypatch.setattr(local_backend, "FORKSERVER_START_WAIT_S", 1.0)
    backend = LocalBackend(tmp_path / "logs", forkserver_idle_s=60)
    h = backend.launch(_launch("r0", ("exit", "0")))
    assert "forked" not in h and len(started) == 1
    assert _wait_ended(backend, h).status == WorkerStatus.SUCCEEDED
    log = Path(h["log_file"]).read_text()
    assert "no fork server answered on" in log and "this unit starts a fresh interpreter" in log
    assert json.loads(log.splitlines()[-1])["preloaded"] is False  # a fresh interpreter
    # that key is not asked (nor waited for) again by this process
    asked = []
    monkeypatch.setattr(forkserver, "request_launch", lambda *a, **k: asked.append(a))
    again = backend.launch(_launch("r1", ("exit", "0")))
    assert "forked" not in again and len(started) == 1 and asked == []
    assert _wait_ended(backend, again).status == WorkerStatus.SUCCEEDED


def test_a_server_whose_imports_fail_is_not_waited_for(tmp_path, runtime_dir, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.chdir(REPO)
    real = forkserver.start_server
    monkeypatch.setattr(forkserver, "start_server", lambda *a, **k: real(*a, preload=("no_such_module_xyz",)))
    backend = LocalBackend(tmp_path / "logs", forkserver_idle_s=60)
    h = backend.launch(_launch("r0", ("exit", "0")))
    assert "forked" not in h
    assert _wait_ended(backend, h).status == WorkerStatus.SUCCEEDED
    assert "exited with code 1" in Path(h["log_file"]).read_text()
    (server_log,) = (tmp_path / "logs").glob("forkserver-*.log")
    assert "importing 'no_such_module_xyz' failed" in server_log.read_text()
