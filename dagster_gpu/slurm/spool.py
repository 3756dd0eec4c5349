"""The Slurm spool: a directory shared by every process (and host) that launches steps to one cluster.

Layout (all files written atomically: temp file + rename)::

    <spool>/lock                         flock: the coalescer's submit lock
    <spool>/poll.lock, poll.json         the shared poller's lock and last snapshot
    <spool>/pending/<ns>-<launch>.json   launches waiting to join a job array
    <spool>/results/<launch>.json        the array job id / task id (or the rejection) of a launch
    <spool>/batches/<batch>/             one job array: manifest.json, submitted.json, <task>.out logs,
                                         done (all tasks final), reconciled/<task>.json
    <spool>/dagster-gpu-array.sh         the constant job script

For run workers on several hosts put the spool on a shared file system with working ``flock``
(NFSv4, Lustre, GPFS); array tasks read their manifest from it too, so compute nodes must see it at the
same path.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from dagster_gpu.jsonfile import read_json, write_json  # noqa: F401  (re-exported: the spool's files)


class SpoolLockTimeout(TimeoutError):
    """A spool lock was not obtained in time (the message names the lock file)."""


def create_exclusive(path: Path, doc: Any) -> bool:
    """Create ``path`` with ``doc`` only if it does not exist (O_EXCL). True if this call created it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    return True


class Spool:
    """Paths and locks of one spool directory (created on first use)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        for d in (self.pending, self.results, self.batches):
            d.mkdir(parents=True, exist_ok=True)

    @property
    def pending(self) -> Path:
        return self.root / "pending"

    @property
    def results(self) -> Path:
        return self.root / "results"

    @property
    def batches(self) -> Path:
        return self.root / "batches"

    def batch_dir(self, batch: str) -> Path:
        return self.batches / batch

    @contextmanager
    def lock(self, name: str = "lock", timeout_s: float | None = 60.0, poll_s: float = 0.02) -> Iterator[bool]:
        """Hold ``flock(LOCK_EX)`` on ``<spool>/<name>``. With ``timeout_s=0`` it tries once and yields
        False when busy; otherwise it raises SpoolLockTimeout after ``timeout_s`` (None = wait forever)."""
        path = self.root / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        got = False
        try:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    got = True
                    break
                except OSError as e:
                    if e.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                if deadline is not None and time.monotonic() >= deadline:
                    if timeout_s == 0:
                        break
                    raise SpoolLockTimeout(f"could not lock {path} within {timeout_s:g}s")
                time.sleep(poll_s)
            yield got
        finally:
            if got:
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def active_batches(self) -> list[tuple[str, dict]]:
        """(batch id, submitted.json) of submitted job arrays not yet marked done, oldest first."""
        out = []
        for d in sorted(self.batches.iterdir()):
            if (d / "done").exists():
                continue
            sub = read_json(d / "submitted.json")
            if sub is not None:
                out.append((d.name, sub))
        return out
