"""The processes a test's Dagster instance left running (daemons, run workers, step workers, webservers), found by
the instance they use and ended before its database is dropped.

A process uses the instance under ``home`` when its environment's ``DAGSTER_HOME`` is that directory or its command
line names a path in it (``dagster api execute_run`` reads its instance from the daemon's environment; a step
worker's log is under it). Only this user's processes are readable (``/proc/<pid>/environ``), and only those are
ended; the calling process and its ancestors never are.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil


def processes_using(home: Path) -> list[psutil.Process]:
    """This user's processes, other than this one and its ancestors, whose DAGSTER_HOME is ``home`` or whose
    command line names a path under it."""
    keys = {str(home), str(Path(home).resolve())}
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = []
    for p in psutil.process_iter(["environ", "cmdline"]):  # others' environ: AccessDenied -> None
        if p.pid in mine:
            continue
        env, argv = p.info.get("environ") or {}, p.info.get("cmdline") or []
        if env.get("DAGSTER_HOME") in keys or any(k in arg for k in keys for arg in argv):
            found.append(p)
    return found


def end_processes_using(home: Path, grace_s: float = 10.0) -> list[str]:
    """SIGTERM every process :func:`processes_using` finds, SIGKILL those still there after ``grace_s`` seconds, and
    wait for them; returns ``"pid command"`` of each one ended (empty when the test left none)."""
    procs = processes_using(home)
    ended = []
    for p in procs:
        try:
            ended.append(f"{p.pid} {' '.join(p.info.get('cmdline') or [])[:200]}")
            p.terminate()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    psutil.wait_procs(alive, timeout=5)
    return ended
