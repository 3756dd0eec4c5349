"""Who owns a spool file or directory, and may we trust it? (stdlib only)

The Slurm spool lives on shared hosts (login node, shared file system, compute nodes). Anything we read
from it and then act on — a directory we write manifests into, a manifest whose ``argv`` an array task
runs, the job script ``sbatch`` submits, an env file holding a password — must be owned by the user
who acts on it and writable by nobody else; otherwise another user could put their own command in it
and have it run as us. See ``docs/security.md`` for the threat model.

The array task runner (:mod:`dagster_gpu.slurm.script`) loads this file by path in isolated mode,
so it imports nothing but the standard library.

Errors: :class:`UntrustedPathError` (a ``PermissionError``) whose message names the path, its owner
(uid and name), its group and its mode, and says what was expected.
"""

from __future__ import annotations

import errno
import grp
import hashlib
import os
import pwd
import stat

#: Bits that let someone other than the owner change a file or a directory's entries.
GROUP_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH


class UntrustedPathError(PermissionError):
    """A spool path, manifest, job script or env file that another user owns or can write."""


def user_name(uid: int) -> str:
    """``uid 1001 (dgpu-other)``; just the number when the uid has no passwd entry."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def group_name(gid: int) -> str:
    """``gid 1001 (gpu-team)``; just the number when the gid has no group entry."""
    try:
        return f"gid {gid} ({grp.getgrgid(gid).gr_name})"
    except KeyError:
        return f"gid {gid}"


def describe(path: str | os.PathLike, st: os.stat_result) -> str:
    """``<path> (owner uid 0 (root), group gid 0 (root), mode 0777)``: every fact a refusal names."""
    return f"{os.fspath(path)} (owner {user_name(st.st_uid)}, group {group_name(st.st_gid)}, mode {stat.S_IMODE(st.st_mode):04o})"


def resolve_gid(group: str | int) -> int:
    """The gid of a group given by name or number. Raises ValueError naming an unknown group."""
    if isinstance(group, int) or str(group).isdigit():
        return int(group)
    try:
        return grp.getgrnam(str(group)).gr_gid
    except KeyError:
        raise ValueError(f"spool_shared_group {group!r}: no such group on this host") from None


def is_group_member(uid: int, gid: int) -> bool:
    """True when user ``uid`` has ``gid`` as primary group or is listed in the group's members."""
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return False
    if pw.pw_gid == gid:
        return True
    try:
        return pw.pw_name in grp.getgrgid(gid).gr_mem
    except KeyError:
        return False


# ------------------------------------------------------------------------------------------ pure checks
def dir_problem(st: os.stat_result, uid: int, shared_gid: int | None = None) -> str | None:
    """Why a spool directory with stat ``st`` is not safe for user ``uid`` to use, or None.

    Private spool (``shared_gid`` None): a directory owned by ``uid`` that neither group nor others
    can write. Group-shared spool: group ``shared_gid``, not writable by others, owned by ``uid``,
    root or a member of that group (only they could have made it)."""
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    mode = stat.S_IMODE(st.st_mode)
    if shared_gid is None:
        if st.st_uid != uid:
            return f"it must be owned by {user_name(uid)} (or configure spool_shared_group for a shared spool)"
        if mode & GROUP_OTHER_WRITE:
            return "group or others can write it (or configure spool_shared_group for a shared spool)"
        return None
    if st.st_gid != shared_gid:
        return f"its group must be the configured spool_shared_group {group_name(shared_gid)}"
    if mode & stat.S_IWOTH:
        return "others can write it"
    if st.st_uid not in (uid, 0) and not is_group_member(st.st_uid, shared_gid):
        return f"its owner is neither {user_name(uid)}, root, nor a member of {group_name(shared_gid)}"
    return None


def file_problem(st: os.stat_result, uid: int) -> str | None:
    """Why a file we are about to act on (manifest, job script, env file, spool record) is not safe,
    or None: it must be a regular file owned by ``uid`` that neither group nor others can write."""
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if st.st_uid != uid:
        return f"it must be owned by {user_name(uid)}"
    if stat.S_IMODE(st.st_mode) & GROUP_OTHER_WRITE:
        return "group or others can write it"
    return None


# ------------------------------------------------------------------------------------------ I/O
def check_dir(path: str | os.PathLike, uid: int | None = None, shared_gid: int | None = None) -> os.stat_result:
    """Stat directory ``path`` (a symlink is followed only if ``uid`` owns the link) and raise
    UntrustedPathError unless :func:`dir_problem` accepts it. Returns its stat."""
    uid = os.geteuid() if uid is None else uid
    lst = os.lstat(path)
    if stat.S_ISLNK(lst.st_mode) and lst.st_uid not in (uid, 0):
        raise UntrustedPathError(f"refusing spool directory {describe(path, lst)}: it is a symlink owned by another user")
    st = os.stat(path)
    problem = dir_problem(st, uid, shared_gid)
    if problem:
        raise UntrustedPathError(f"refusing spool directory {describe(path, st)}: {problem}")
    return st


def read_trusted(path: str | os.PathLike, uid: int | None = None, what: str = "file", follow: bool = False) -> bytes:
    """The bytes of ``path`` after checking, on the open file itself (no race with a rename), that
    :func:`file_problem` accepts it for ``uid`` (default: this process's real uid).

    ``follow=False`` refuses a symlink (O_NOFOLLOW). Raises FileNotFoundError when absent,
    UntrustedPathError (naming path, owner, group, mode) when not trusted."""
    uid = os.getuid() if uid is None else uid
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UntrustedPathError(f"refusing {what} {describe(path, os.lstat(path))}: it is a symlink") from None
        raise
    try:
        st = os.fstat(fd)
        problem = file_problem(st, uid)
        if problem:
            raise UntrustedPathError(f"refusing {what} {describe(path, st)}: {problem}")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def sha256_hex(data: bytes) -> str:
    """Hex SHA-256 of ``data`` (the content hashes recorded at submit)."""
    return hashlib.sha256(data).hexdigest()
