"""Processes for tests and benches: whether one still runs (tests that kill or terminate workers), a free local
port to start a server on."""

from __future__ import annotations

import socket

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


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now (the OS's pick; free until someone binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
