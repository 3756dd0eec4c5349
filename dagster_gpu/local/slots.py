"""A host-wide limit on the local units running at once: a counting semaphore of ``flock(2)`` locks.

Each of the limit's slots is a file ``slot-<i>.lock`` in a directory of this user's on this host (by default
the fork server's runtime directory, :func:`dagster_gpu.local.forkserver.socket_dir`, + ``unit-slots``). A
unit's supervisor holds one slot's exclusive lock from before its worker starts to its own exit; the kernel
drops the lock when the process ends, however it ends, so a killed unit never leaks its slot. Units of every
run and every Dagster process of this user on the host share the slots.

Dagster's own concurrency pools (``concurrency: pools: default_limit`` in dagster.yaml, dagster 1.13.27
``dagster/_core/instance/config.py``: optional, no limit when unset) count op slots in the instance's storage
for the whole deployment, not per host, and hold no limit unless one is configured; this limit follows the
host's cores with no configuration.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Callable

#: Environment variable naming the slots for a unit's supervisor: ``<limit>:<directory>``; absent: no limit.
ENV_VAR = "DAGSTER_GPU_LOCAL_SLOTS"
#: Seconds between tries while every slot is held.
POLL_S = 0.5


def host_cores() -> int:
    """The cores this process may run on (``os.sched_getaffinity``, a cgroup cpuset included; ``os.cpu_count``
    where there is none), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def env_value(limit: int, directory: Path) -> str:
    """The :data:`ENV_VAR` value for ``limit`` slots (>= 1) in ``directory``. Raises ValueError for a limit < 1."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"local.max_units must be an integer >= 1 (or 0: no limit), got {limit!r}")
    return f"{limit}:{directory}"


def parse_env(value: str | None) -> tuple[int, Path] | None:
    """``(limit, directory)`` from an :data:`ENV_VAR` value; None for no value. Raises ValueError naming the
    variable for a malformed one."""
    if not value:
        return None
    limit, sep, directory = value.partition(":")
    if not sep or not limit.isdigit() or int(limit) < 1 or not directory:
        raise ValueError(f"{ENV_VAR}={value!r}: expected '<limit >= 1>:<directory>'")
    return int(limit), Path(directory)


def try_acquire(limit: int, directory: Path) -> tuple[int, int] | None:
    """``(slot, fd)`` of the first free slot of ``limit`` in ``directory`` (created, mode 0700), its lock held
    on ``fd`` until the fd is closed or the process ends; None while all are held."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for slot in range(limit):
        fd = os.open(directory / f"slot-{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return slot, fd
    return None


def acquire(limit: int, directory: Path, say: Callable[[str], None], stop: Callable[[], bool]) -> int | None:
    """Wait for a free slot (:func:`try_acquire`, every :data:`POLL_S` seconds) and return its fd (its lock held
    until this process ends). ``say`` gets one line when the unit has to wait and one when it got its slot;
    ``stop()`` True ends the wait with None (no slot taken)."""
    got = try_acquire(limit, directory)
    if got is not None:
        return got[1]
    started = time.monotonic()
    say(f"dagster-gpu: waiting for a local unit slot: all {limit} of this host's are held by other units "
        f"(local.max_units; {directory})")
    while got is None:
        if stop():
            return None
        time.sleep(POLL_S)
        got = try_acquire(limit, directory)
    say(f"dagster-gpu: local unit slot {got[0]} of {limit} taken after {time.monotonic() - started:.1f} s waiting")
    return got[1]
