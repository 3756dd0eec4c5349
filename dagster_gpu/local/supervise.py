"""Run a command and write its exit code to a status file (JSON), for backends that outlive parents.

Usage: ``python -m dagster_gpu.local.supervise --status-file PATH -- CMD [ARGS...]``.

The status file is written atomically: ``{"exit_code": N, "message": "...", "started": t0, "finished": t1}``
(seconds since the epoch). SIGTERM/SIGINT are forwarded to the child so a graceful stop reaches the step.

With :data:`dagster_gpu.local.slots.ENV_VAR` set, the worker starts only once this process holds one of the
host's local unit slots (:mod:`dagster_gpu.local.slots`; a wait is one line on stdout, the unit's log); a
SIGTERM/SIGINT during the wait ends it without starting the worker (exit code 128 + N).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Protocol

from dagster_gpu.core.jsonfile import read_json, write_json
from dagster_gpu.local import slots


def read_status(path: Path) -> dict | None:
    """The status dict, or None while the command runs (or if the file is unreadable)."""
    return read_json(path)


def write_status(path: Path, status: dict) -> None:
    write_json(path, status, mode=0o644)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"worker killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"worker killed by signal {-code}"
    return f"worker exited with code {code}"


class Child(Protocol):
    """What :func:`supervise` needs of the worker: ``subprocess.Popen`` or a forked process."""

    def send_signal(self, signum: int) -> None: ...

    def wait(self) -> int: ...


def supervise(status_path: Path, start: Callable[[], Child], what: str) -> int:
    """Start the worker (``start``), forward SIGTERM/SIGINT to it (one that arrives before it exists is
    delivered right after it starts), wait for it and write the status file; this process's exit code
    (128 + N for a worker killed by signal N). ``what`` names the command in the message when it cannot start."""
    started = time.time()
    pending: list[int] = []
    holder: dict[str, Child] = {}

    def forward(signum, _frame):
        child = holder.get("child")
        if child is None:
            pending.append(signum)  # arrived before the child existed: delivered right after it starts
            return
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        wanted = slots.parse_env(os.environ.get(slots.ENV_VAR))
        if wanted is not None and slots.acquire(*wanted, say=lambda line: print(line, flush=True),
                                                stop=lambda: bool(pending)) is None:
            signum = pending[0]
            write_status(status_path, {"exit_code": -signum, "started": started, "finished": time.time(),
                                       "message": f"stopped by {signal.Signals(signum).name} while waiting for a local unit slot"})
            return 128 + signum
        child = start()
    except (OSError, ValueError) as e:  # ValueError: a malformed slots variable (named in the message)
        write_status(status_path, {"exit_code": 127, "message": f"cannot start worker {what!r}: {e}", "started": started, "finished": time.time()})
        return 127
    holder["child"] = child
    for signum in pending:
        child.send_signal(signum)
    code = child.wait()
    write_status(status_path, {"exit_code": code, "message": describe_exit(code), "started": started, "finished": time.time()})
    return code if code >= 0 else 128 - code


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 4 or args[0] != "--status-file" or args[2] != "--":
        print("usage: python -m dagster_gpu.local.supervise --status-file PATH -- CMD [ARGS...]", file=sys.stderr)
        return 2
    cmd = args[3:]
    return supervise(Path(args[1]), lambda: subprocess.Popen(cmd), what=cmd[0])


if __name__ == "__main__":
    sys.exit(main())
