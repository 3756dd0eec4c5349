"""Where Slurm commands run: the transport seam under :class:`~dagster_gpu.slurm.client.SlurmClient`.

A transport runs one Slurm command (an argv list, never a shell line written by us from data) and hands
back a :class:`subprocess.CompletedProcess`; the client keeps the retries, the error classes and the
parsing. Two transports exist:

- :class:`LocalTransport` (``transport: local``, the default): the command runs on this host, as a child
  process with the scrubbed environment (:func:`scrubbed_env`). Dagster sits on a Slurm login node.
- :class:`dagster_gpu.slurm.ssh.SshTransport` (``transport: ssh``): the command runs on a login node
  through the system's OpenSSH client over one shared ControlMaster per ``user@host:port``; it also
  carries the spool files the array tasks read (the manifest, the job script, the task runner) and reads
  the tasks' logs back.

A third, ``rest`` (slurmrestd), is a client subclass instead, :class:`dagster_gpu.slurm.rest.RestSlurmClient`,
whose methods call slurmrestd and read JSON; its ``transport`` (:class:`dagster_gpu.slurm.rest.RestTransport`)
runs no commands and has no remote spool (with ``relay_url`` the tasks' files travel in the job script and the
object store, :mod:`dagster_gpu.slurm.object_runner`; without, the spool is on a file system the compute nodes see). The backend
builds it from the ``transport`` setting with :func:`dagster_gpu.slurm.rest.client_from_settings`.

Errors a transport raises besides what the command printed: :class:`TransportUnreachable` (the login
node could not be reached now: transient, the client retries and the poller reports UNKNOWN, which never
fails a step), :class:`TransportRefused` (the login node refused us: a changed host key, a refused login;
not transient, the message names host, user and fingerprint) and FileNotFoundError (a local command not
on PATH).
"""

from __future__ import annotations

import os
import subprocess
from typing import Mapping, Protocol, Sequence, runtime_checkable

#: Prefixes of environment variables Slurm commands read as defaults or output formats.
SCRUBBED_PREFIXES = ("SLURM_", "SBATCH_", "SQUEUE_", "SACCT_", "SINFO_", "SCANCEL_", "SRUN_", "SALLOC_", "SCONTROL_")
#: Kept even though they match a prefix: where the cluster config is.
KEPT = frozenset({"SLURM_CONF"})


class TransportError(RuntimeError):
    """The transport itself failed (not the Slurm command)."""


class TransportUnreachable(TransportError):
    """The login node could not be reached now (connection refused, timed out or dropped, master gone):
    transient; nothing about the jobs is known from it. ``sent``: False when the command surely never
    left this host (no connection), True when it may have run before the connection dropped."""

    def __init__(self, message: str, sent: bool = True):
        super().__init__(message)
        self.sent = sent


class TransportRefused(TransportError):
    """The login node refused this client (changed or unknown host key, login refused): retrying does
    not help; the message names the host, the user and, for a host key, its fingerprint."""


def scrubbed_env(base: Mapping[str, str], extra: Mapping[str, str] = ()) -> dict[str, str]:
    """``base`` without the variables that change what Slurm commands print or submit (every
    :data:`SCRUBBED_PREFIXES` name but :data:`KEPT`), then ``extra`` on top."""
    env = {k: v for k, v in base.items() if k in KEPT or not k.startswith(SCRUBBED_PREFIXES)}
    env.update(dict(extra))
    return env


@runtime_checkable
class Transport(Protocol):
    """What :class:`~dagster_gpu.slurm.client.SlurmClient`, the coalescer and the backend use of a transport.

    A transport whose spool is on the cluster (``remote_spool`` set: ssh) carries the spool files with
    :meth:`upload` and reads them back with :meth:`tail` and :meth:`read_from`; one whose spool is this host's
    (``remote_spool`` None: local, rest) raises :class:`TransportUnavailable` from those three, and callers
    read the spool on this host instead."""

    #: ``local``, ``ssh`` or ``rest``: for messages and metadata.
    kind: str
    #: The spool directory on the cluster (a path the compute nodes see), or None when the array tasks read
    #: this host's spool.
    remote_spool: str | None

    def run(
        self, argv: Sequence[str], *, set_env: Mapping[str, str], timeout_s: float, forward_env: bool = False
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` with the scrubbed environment plus ``set_env`` (no secret: a remote transport may
        put these on its command line). ``forward_env``: also give the command the variables a submitted job
        must inherit (sbatch exports its environment to the job), passed out of any argv. Returns the
        finished process (text stdout/stderr). Raises TransportUnreachable, TransportRefused,
        FileNotFoundError, subprocess.TimeoutExpired."""
        ...

    def upload(self, files: Sequence[tuple[str, bytes, int]], timeout_s: float = 60.0) -> dict[str, str]:
        """Write ``files`` (path under :attr:`remote_spool`, content, mode); returns {path: SHA-256 hex} as
        read back on the cluster. Raises TransportRefused, TransportUnreachable, TransportUnavailable."""
        ...

    def tail(self, path: str, lines: int = 20) -> str:
        """The last ``lines`` lines of a file in the cluster's spool (a message in their place when it
        cannot be read now). Raises TransportUnavailable."""
        ...

    def read_from(self, path: str, offset: int, timeout_s: float = 30.0) -> bytes:
        """The bytes of a file in the cluster's spool from ``offset`` (b"" when absent). Raises
        TransportUnreachable, TransportRefused, TransportError, TransportUnavailable."""
        ...


class TransportUnavailable(TransportError):
    """A transport was asked for something it does not carry (the spool files of a transport whose spool
    is this host's); the message names the member and the transport."""


class NoRemoteSpool:
    """The spool members of a transport whose array tasks read this host's spool: ``remote_spool`` None,
    and :meth:`upload`, :meth:`tail`, :meth:`read_from` raise :class:`TransportUnavailable`."""

    kind: str
    remote_spool: None = None

    def _unavailable(self, member: str, path: str) -> TransportUnavailable:
        return TransportUnavailable(f"{member} ({path}) is not available over {self.kind}: the array tasks read "
                                    "this host's spool, so read it here")

    def upload(self, files: Sequence[tuple[str, bytes, int]], timeout_s: float = 60.0) -> dict[str, str]:
        raise self._unavailable("upload", ", ".join(p for p, _, _ in files))

    def tail(self, path: str, lines: int = 20) -> str:
        raise self._unavailable("tail", path)

    def read_from(self, path: str, offset: int, timeout_s: float = 30.0) -> bytes:
        raise self._unavailable("read_from", path)


class LocalTransport(NoRemoteSpool):
    """Slurm commands as child processes of this one (Dagster runs on a Slurm login node)."""

    kind = "local"

    def run(
        self, argv: Sequence[str], *, set_env: Mapping[str, str], timeout_s: float, forward_env: bool = False
    ) -> subprocess.CompletedProcess:
        # forward_env needs nothing here: a local sbatch inherits this process's environment already
        return subprocess.run(
            list(argv), capture_output=True, text=True, env=scrubbed_env(os.environ, set_env), timeout=timeout_s, check=False
        )
