"""Helpers for the tests of the Slurm ssh transport: the private sshd of resources/ssh/sshd.sh (the "login node"
on 127.0.0.1 in front of the local Slurm clusters), its log's count of logins, and transports built on it."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from dagster_gpu.slurm.ssh import SshTransport
from dagster_gpu.slurm.ssh_command import SshTarget

REPO = Path(__file__).resolve().parents[1]
SSHD_SH = REPO / "resources" / "ssh" / "sshd.sh"


def sshd_env() -> dict[str, str] | None:
    """Start (idempotently) the test sshd and return its ``DAGSTER_GPU_SSH_*`` settings, or None when it cannot
    start (openssh-server not installed)."""
    cp = subprocess.run(["bash", str(SSHD_SH), "start"], capture_output=True, text=True)
    if cp.returncode != 0:
        return None
    out = subprocess.run(["bash", str(SSHD_SH), "env"], check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.split())


def logins(env: dict[str, str]) -> int:
    """TCP connections sshd accepted so far ("Accepted publickey" lines of its log, LogLevel INFO)."""
    try:
        return Path(env["DAGSTER_GPU_SSH_LOG"]).read_text(errors="replace").count("Accepted publickey for ")
    except FileNotFoundError:
        return 0


def short_dir(prefix: str = "dgs-") -> str:
    """A new private directory with a short path (a ControlMaster socket path must stay under 108 bytes;
    pytest's tmp_path can be longer)."""
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")


def target(env: dict[str, str], **over) -> SshTarget:
    kw = dict(host=env["DAGSTER_GPU_SSH_HOST"], user=env["DAGSTER_GPU_SSH_USER"], port=int(env["DAGSTER_GPU_SSH_PORT"]),
              identity_file=env["DAGSTER_GPU_SSH_KEY"], known_hosts_file=env["DAGSTER_GPU_SSH_KNOWN_HOSTS"])
    kw.update(over)
    return SshTarget(**kw)


def transport(env: dict[str, str], remote_spool: str, control_dir: str, **over) -> SshTransport:
    return SshTransport(target(env, **over), remote_spool=remote_spool, control_dir=control_dir)
