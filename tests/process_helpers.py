"""Whether a process still runs, for tests that kill or terminate workers."""

from __future__ import annotations

import psutil


def alive(proc: int | psutil.Process) -> bool:
    """True while the process exists and is not a zombie.

    A process may end (and be reaped) between two reads of /proc, so any psutil read here can raise
    NoSuchProcess; that means "gone", as ``psutil.pid_exists`` followed by ``status()`` would not say.
    """
    try:
        p = proc if isinstance(proc, psutil.Process) else psutil.Process(proc)
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
