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
runs no commands and has no remote spool (the spool is on a file system the compute nodes see). The backend
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
from typing import Mapping, Protocol, Sequence

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


class Transport(Protocol):
    """What :class:`~dagster_gpu.slurm.client.SlurmClient` needs of a transport."""

    #: ``local``, ``ssh`` or ``rest``: for messages and metadata.
    kind: str

    def run(
        self, argv: Sequence[str], *, set_env: Mapping[str, str], timeout_s: float, forward_env: bool = False
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` with the scrubbed environment plus ``set_env`` (no secret: a remote transport may
        put these on its command line). ``forward_env``: also give the command the variables a submitted job
        must inherit (sbatch exports its environment to the job), passed out of any argv. Returns the
        finished process (text stdout/stderr). Raises TransportUnreachable, TransportRefused,
        FileNotFoundError, subprocess.TimeoutExpired."""
        ...


class LocalTransport:
    """Slurm commands as child processes of this one (Dagster runs on a Slurm login node)."""

    kind = "local"
    remote_spool = None  # the spool the array tasks read is this host's own

    def run(
        self, argv: Sequence[str], *, set_env: Mapping[str, str], timeout_s: float, forward_env: bool = False
    ) -> subprocess.CompletedProcess:
        # forward_env needs nothing here: a local sbatch inherits this process's environment already
        return subprocess.run(
            list(argv), capture_output=True, text=True, env=scrubbed_env(os.environ, set_env), timeout=timeout_s, check=False
        )
