"""The Slurm spool: a directory shared by every process (and host) that launches steps to one cluster.

Layout (all files written atomically: temp file + rename)::

    <spool>/lock                         flock: the coalescer's submit lock
    <spool>/poll.lock, poll.json         the shared poller's lock and last snapshot (poll/poll.json in a
                                         group-shared spool: any member replaces it, even under a sticky root)
    <spool>/pending/<ns>-<launch>.json   launches waiting to join a job array
    <spool>/results/<launch>.json        the array job id / task id (or the rejection) of a launch
    <spool>/batches/<batch>/             one job array: manifest.json, submitted.json, <task>.out logs,
                                         done (all tasks final), reconciled/<task>.json
    <spool>/dagster-gpu-array.sh         the constant job script (in a group-shared spool:
                                         users/<uid>/dagster-gpu-array.sh, users/ sticky, <uid>/ 0700)

``submitted.json``: ``{"array_job_id", "tasks", "submitted_at", "launch_ids", "group",
"job_script_sha256", "manifest_sha256"}`` (the two hashes were added for issue 13: what ``sbatch`` was
given and what the tasks verify; readers must not require them, older batches lack them).

For run workers on several hosts put the spool on a shared file system with working ``flock``
(NFSv4, Lustre, GPFS); array tasks read their manifest from it too, so compute nodes must see it at the
same path.

Trust (``docs/security.md``): every spool directory is created exclusively with mode 0700, and one that
already exists is used only when this user owns it and neither group nor others can write it; otherwise
:class:`~dagster_gpu.slurm.trust.UntrustedPathError` names the path, its owner, group and mode. With
``shared_group`` (the executor's ``spool_shared_group``) the operator opts into a spool shared by a Unix
group: directories are 2770 with that group, lock files 0660 and ``poll.json``/``submitted.json`` 0640
so members share the lock and the poll, while manifests, pending launches, results and logs stay 0600
and are still verified (owner and mode) before use; a process submits only its own user's launches.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from dagster_gpu.core.jsonfile import read_json, write_json  # noqa: F401  (re-exported: the spool's files)
from dagster_gpu.slurm.trust import UntrustedPathError, check_dir, read_trusted, resolve_gid

log = logging.getLogger(__name__)


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
    """Paths and locks of one spool directory (created on first use, checked before every use).

    Args:
        root: the spool directory; missing parents are created, the directory itself exclusively.
        shared_group: a Unix group (name or gid) that shares this spool, or None for a private one.

    Raises:
        UntrustedPathError: ``root`` or one of its subdirectories is not owned by this user or is
            writable by group/others (private spool), or has another group / is writable by others
            (shared spool). The message names the path, owner (uid and name), group and mode.
        ValueError: ``shared_group`` names no group on this host.
    """

    def __init__(self, root: str | Path, shared_group: str | int | None = None):
        self.root = Path(root)
        self.uid = os.geteuid()
        self.shared_gid = None if shared_group is None else resolve_gid(shared_group)
        shared = self.shared_gid is not None
        self.dir_mode = 0o2770 if shared else 0o700
        self.lock_mode = 0o660 if shared else 0o600  # every member takes the same flock
        self.public_mode = 0o640 if shared else 0o600  # poll.json, submitted.json: members read them
        self._warned: set[str] = set()
        self.make_dir(self.root, parents=True)
        for d in (self.pending, self.results, self.batches):
            self.make_dir(d)
        if shared:  # the job script sits where no member can rename or replace it
            self.make_dir(self.root / "users", mode=0o3770)
            self.make_dir(self.poll_file.parent)
            self.make_dir(self.job_script.parent, private=True)

    def make_dir(
        self, path: Path, parents: bool = False, exclusive: bool = False, mode: int | None = None, private: bool = False
    ) -> Path:
        """Create ``path`` with this spool's directory mode (0700, or 2770 + the shared group; or
        ``mode``) if it does not exist, then check it (raises UntrustedPathError). ``private``: 0700 and
        checked as a private directory even in a shared spool. ``exclusive``: raise FileExistsError
        when it exists. ``parents``: create missing parents first (default mode)."""
        shared_gid = None if private else self.shared_gid
        if parents:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if exclusive:
                raise
        else:
            if shared_gid is not None:
                os.chown(path, -1, shared_gid)
            # mkdir's mode is cut by the umask; set it exactly
            os.chmod(path, 0o700 if private else (self.dir_mode if mode is None else mode))
        check_dir(path, self.uid, shared_gid)
        return path

    @property
    def job_script(self) -> Path:
        """The job script ``sbatch`` reads. In a shared spool one per user, in ``users/<uid>/`` (0700,
        under a sticky ``users/``) so no member can swap it between its check and ``sbatch``."""
        if self.shared_gid is None:
            return self.root / "dagster-gpu-array.sh"
        return self.root / "users" / str(self.uid) / "dagster-gpu-array.sh"

    @property
    def poll_file(self) -> Path:
        """The shared poller's last snapshot. In a shared spool it sits in ``poll/`` (2770, not sticky)
        so any member can replace it even when the spool root is sticky (docs/security.md)."""
        if self.shared_gid is None:
            return self.root / "poll.json"
        return self.root / "poll" / "poll.json"

    def read_own_json(self, path: Path) -> Any | None:
        """The JSON document at ``path`` if it is a regular file owned by this user that neither group
        nor others can write; None when absent, unreadable, or not trusted (a file another member of
        a shared spool planted is logged once and ignored, never acted on)."""
        try:
            data = read_trusted(path, self.uid, what="spool file")
        except FileNotFoundError:
            return None
        except UntrustedPathError as e:
            if str(path) not in self._warned:
                self._warned.add(str(path))
                log.warning("ignoring %s", e)
            return None
        except OSError:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return None

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
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, self.lock_mode)
        st = os.fstat(fd)
        if st.st_uid == self.uid and stat.S_IMODE(st.st_mode) != self.lock_mode:
            os.fchmod(fd, self.lock_mode)  # the umask may have cut a shared spool's group bits
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
