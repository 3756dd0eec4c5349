"""A fork server for the local backend: one process per host, interpreter and code that has imported the
worker's heavy modules once (dagster, torch, sentence-transformers, this package) and forks each work unit
from that state, so a unit starts in tens of milliseconds instead of seconds of imports. The idea and the
name are Python's own (``multiprocessing``'s ``forkserver`` start method with ``set_forkserver_preload``).

What a unit gets is what ``python -m dagster_gpu.local.supervise --status-file S -- python -m MODULE ARGS``
gives it (:mod:`dagster_gpu.local.supervise`): a supervisor process in a session of its own (so the backend's
``killpg`` reaches the whole unit), its stdout/stderr appended to the log file, the exit code written to the
status file, SIGTERM/SIGINT forwarded; the worker is the supervisor's child, running ``MODULE`` as ``__main__``
with the launch's environment, working directory and argv. Only the imports are shared, and they are made
before any of them runs code that matters after a fork: the server never initialises CUDA, never runs a torch
operator (no OpenMP thread pool) and starts no thread, so the fork is safe (fork(2): only the calling thread
is copied). A unit's clock (its process creation, what the local bill counts from) starts at its fork.

A server serves only launches that would import the same modules: its key (:func:`server_key`) covers the
interpreter, working directory, the versions of the preloaded distributions, the size and mtime of every
file of this package, and the environment variables read at import time (:data:`IMPORT_ENV_PREFIXES`); a
launch with another key starts another server. It listens on a Unix socket in a directory only this user
can enter (mode 0700, checked), accepts only connections from this user (``SO_PEERCRED``), and exits after
``idle_s`` seconds without a launch. The first launch with a new key runs cold (a fresh interpreter, as
without the server) while the server starts in the background.
"""

from __future__ import annotations

import argparse
import atexit
import fcntl
import hashlib
import importlib
import importlib.metadata
import json
import os
import runpy
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from dagster_gpu.local.supervise import supervise

#: Modules the server imports before it forks (the worker's start-up: about 7 s of a fresh interpreter's;
#: the last one imports this package's ``__init__`` and so everything a code location imports from it).
PRELOAD = ("dagster", "dagster._cli", "torch", "sentence_transformers", "dagster_gpu.worker.unit")
#: Distributions whose version is part of the key.
PRELOAD_DISTRIBUTIONS = ("dagster", "torch", "sentence-transformers", "transformers", "tokenizers")
#: Environment variables read while those modules import (the rest are read when the worker runs): a
#: launch whose values differ gets a server of its own.
IMPORT_ENV_PREFIXES = ("PYTHON", "LD_", "HF_", "HUGGINGFACE", "TRANSFORMERS", "SENTENCE_TRANSFORMERS", "TORCH",
                       "PYTORCH", "OMP_", "MKL_", "KMP_", "OPENBLAS", "TOKENIZERS")
#: Largest launch request, bytes.
MAX_REQUEST = 1 << 20


def socket_dir() -> Path:
    """This user's directory for fork server sockets: ``$XDG_RUNTIME_DIR/dagster-gpu`` or
    ``/tmp/dagster-gpu-<uid>``, created with mode 0700. Raises PermissionError when it exists and is not a
    directory owned by this user with no access for others (another user could then reach the socket)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    d = Path(base) / "dagster-gpu" if base else Path(f"/tmp/dagster-gpu-{os.getuid()}")
    d.mkdir(mode=0o700, parents=bool(base), exist_ok=True)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{d}: the fork server's socket directory must be a directory of uid {os.getuid()} "
                              f"with mode 0700 (found uid {st.st_uid}, mode {oct(st.st_mode & 0o7777)})")
    return d


def _package_stamp() -> list[tuple[str, int, int]]:
    root = Path(__file__).resolve().parents[1]
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith(".py"):
                st = os.stat(os.path.join(dirpath, f))
                out.append((os.path.relpath(os.path.join(dirpath, f), root), st.st_size, st.st_mtime_ns))
    return out


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ""


def server_key(python: str, cwd: str, env: Mapping[str, str], preload: Sequence[str] = PRELOAD) -> str:
    """The key (24 hex digits) of the server a launch may use (module docstring)."""
    doc = {
        "python": python, "cwd": cwd, "preload": list(preload),
        "versions": {d: _version(d) for d in PRELOAD_DISTRIBUTIONS},
        "package": _package_stamp(),
        "env": sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_ENV_PREFIXES)),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Launch:
    """One launch request: ``argv`` (``[python, "-m", MODULE, *args]``), the worker's whole environment, its
    working directory, and the log and status files (absolute paths). Raises ValueError for another shape."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    log_file: str
    status_file: str

    def __post_init__(self) -> None:
        if len(self.argv) < 3 or self.argv[1] != "-m" or not all(isinstance(a, str) for a in self.argv):
            raise ValueError(f"fork server: argv must be [python, '-m', MODULE, ...], got {list(self.argv)!r}")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()):
            raise ValueError("fork server: the environment must map text to text")
        for name in ("cwd", "log_file", "status_file"):
            if not os.path.isabs(getattr(self, name)):
                raise ValueError(f"fork server: {name} must be an absolute path, got {getattr(self, name)!r}")

    def to_json(self) -> bytes:
        return json.dumps({"argv": list(self.argv), "env": dict(self.env), "cwd": self.cwd,
                           "log_file": self.log_file, "status_file": self.status_file}).encode() + b"\n"

    @classmethod
    def from_json(cls, raw: bytes) -> "Launch":
        d = json.loads(raw)
        return cls(tuple(d["argv"]), dict(d["env"]), str(d["cwd"]), str(d["log_file"]), str(d["status_file"]))


# ---------------------------------------------------------------------------------------------- client side

def request_launch(sock_path: Path, launch: Launch, timeout_s: float = 10.0) -> int | None:
    """Ask the server at ``sock_path`` to start ``launch``; the supervisor's pid, or None when no server
    answers there (none started yet, or it exited idle). Raises RuntimeError when a server refused it."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout_s)
    try:
        try:
            s.connect(str(sock_path))
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        s.sendall(launch.to_json())
        s.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    except (socket.timeout, ConnectionResetError, BrokenPipeError):
        return None  # it went idle while we connected: launch cold
    finally:
        s.close()
    if not reply:
        return None
    d = json.loads(reply)
    if "error" in d:
        raise RuntimeError(f"fork server {sock_path}: {d['error']}")
    return int(d["pid"])


def start_server(python: str, sock_path: Path, env: Mapping[str, str], cwd: str, log_file: Path, idle_s: float,
                 preload: Sequence[str] = PRELOAD) -> "subprocess.Popen":
    """Start a server for ``sock_path`` in the background (a session of its own; its output to ``log_file``);
    its process. A second server for the same socket exits at once with 0 (the lock file beside the socket);
    one whose imports or checks failed exits with 1 (the reason in ``log_file``)."""
    with open(log_file, "ab") as log:
        return subprocess.Popen([python, "-m", "dagster_gpu.local.forkserver", "--socket", str(sock_path),
                                 "--idle-seconds", str(idle_s), "--preload", ",".join(preload)],
                                env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)


# ---------------------------------------------------------------------------------------------- server side

class ForkedChild:
    """The worker as :func:`dagster_gpu.local.supervise.supervise` sees a child: ``send_signal`` and ``wait``
    (the exit code, negative for a signal, as ``subprocess.Popen.returncode``)."""

    def __init__(self, pid: int):
        self.pid = pid

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def wait(self) -> int:
        return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])  # retried on EINTR (PEP 475)


def _run_module(launch: Launch) -> None:
    """In the worker: run ``launch``'s module as ``__main__`` as ``python -m`` would, then exit with its code
    after what a normal interpreter exit does (non-daemon threads joined, atexit handlers, streams flushed)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    module, args = launch.argv[2], launch.argv[3:]
    code = 0
    try:
        sys.argv = [module, *args]  # runpy sets argv[0] to the module's file
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - a worker's crash is reported like the interpreter's
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx does first
        atexit._run_exitfuncs()
    finally:
        _exit(code)


def _supervisor(launch: Launch, keep_out: Sequence[int]) -> None:
    """In the forked supervisor: a new session, the launch's files, environment and directory; fork the
    worker and supervise it. Never returns."""
    code = 1
    try:
        os.setsid()
        for fd in keep_out:
            try:
                os.close(fd)
            except OSError:
                pass
        log = os.open(launch.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.chdir(launch.cwd)
        os.environ.clear()
        os.environ.update(launch.env)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)

        def start() -> ForkedChild:
            pid = os.fork()
            if pid == 0:
                _run_module(launch)
            return ForkedChild(pid)

        code = supervise(Path(launch.status_file), start, what=launch.argv[2])
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        _exit(code)


def _exit(code: int) -> None:
    """End a forked process with ``code`` after flushing its streams, never returning into the server's loop."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not keep the process alive
            pass
    os._exit(code & 0xFF)


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _fork_unsafe_state() -> str:
    """What would make a fork of this process unsafe, or "" (fork(2) copies only the calling thread): another
    Python thread, or a CUDA context (torch's "Cannot re-initialize CUDA in forked subprocess"). The native
    threads the imports start are pools with fork handlers of their own: OpenBLAS's (numpy's and scipy's
    wheels; ``pthread_atfork(blas_thread_shutdown, NULL, blas_memory_init)`` in its driver/others/memory.c)
    and jemalloc's background thread (pyarrow; ``jemalloc_prefork``/``jemalloc_postfork_child``); torch's
    OpenMP pool starts only with a first parallel operator, which the server never runs."""
    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads after the imports: {threading.enumerate()}"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA was initialised by the imports"
    return ""


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(sock_path: Path, idle_s: float, preload: Sequence[str]) -> int:
    """The server's loop (module docstring): 0 when it exits idle, or at once when another server holds the
    socket's lock."""
    lock = open(str(sock_path) + ".lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"fork server: another server holds {sock_path}; exiting", flush=True)
        return 0
    t0 = time.monotonic()
    try:
        for m in preload:
            importlib.import_module(m)
    except Exception:  # noqa: BLE001 - said in the log, and the launch waiting for it goes cold
        print(f"fork server: not serving: importing {m!r} failed:", flush=True)
        traceback.print_exc()
        return 1
    unsafe = _fork_unsafe_state()
    if unsafe:
        print(f"fork server: not serving: {unsafe}", flush=True)
        return 1
    sock_path.unlink(missing_ok=True)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(sock_path))
    os.chmod(sock_path, 0o600)
    srv.listen(64)
    srv.settimeout(1.0)
    print(f"fork server {os.getpid()}: {len(preload)} module(s) imported in {time.monotonic() - t0:.1f} s; "
          f"serving {sock_path} until {idle_s:g} s pass without a launch", flush=True)
    last = time.monotonic()
    try:
        while time.monotonic() - last < idle_s:
            _reap()
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                continue
            last = time.monotonic()
            with conn:
                conn.settimeout(10.0)
                try:
                    if _peer_uid(conn) != os.getuid():
                        raise PermissionError("connection from another user")
                    raw = b""
                    while len(raw) <= MAX_REQUEST and (chunk := conn.recv(65536)):
                        raw += chunk
                    launch = Launch.from_json(raw)
                except (OSError, ValueError, KeyError, TypeError) as e:
                    try:
                        conn.sendall(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
                    except OSError:
                        pass
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _supervisor(launch, keep_out=(srv.fileno(), conn.fileno(), lock.fileno()))
                try:
                    conn.sendall(json.dumps({"pid": pid}).encode())
                except OSError:
                    pass
    finally:  # still under the lock: no other server has bound this path
        sock_path.unlink(missing_ok=True)
        srv.close()
    print(f"fork server {os.getpid()}: idle for {idle_s:g} s; exiting", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dagster_gpu.local.forkserver")
    ap.add_argument("--socket", required=True, type=Path)
    ap.add_argument("--idle-seconds", type=float, default=600.0)
    ap.add_argument("--preload", default=",".join(PRELOAD))
    a = ap.parse_args(argv)
    return serve(a.socket, a.idle_seconds, [m for m in a.preload.split(",") if m])


if __name__ == "__main__":
    sys.exit(main())
