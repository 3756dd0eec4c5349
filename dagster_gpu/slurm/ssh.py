"""The ``ssh`` transport: Slurm commands and the array tasks' spool files on a login node, through the
system's OpenSSH client over one shared ControlMaster per ``user@host:port``.

- The master's socket is :func:`~dagster_gpu.slurm.ssh_command.control_path` in ``control_dir`` (default
  ``$XDG_RUNTIME_DIR/dagster-gpu-ssh``, else ``/tmp/dagster-gpu-ssh-<uid>``; made 0700 and refused when
  another user owns it or group/others can write it), so every process on the host shares one TCP
  connection. A process checks it with ``ssh -O check`` before its first command and at most every
  ``CHECK_EVERY_S`` after, and at once after a command failed for the connection; a stale master is re-made
  under an flock (``<socket>.lock``) so concurrent processes start one, not many.
- Commands never open a connection of their own (:func:`~dagster_gpu.slurm.ssh_command.command_argv`): a
  master that died between the check and the command makes the command fail (rc 255); the transport
  re-makes the master and sends the command once more (sbatch only when it surely never left).
- A connection that cannot be made or dropped is :class:`~dagster_gpu.slurm.transport.TransportUnreachable`
  (transient: the client retries with backoff; the poller's snapshot is an error and the steps' states stay
  UNKNOWN, which never fails a step; the tasks keep running on the cluster). A changed or unknown host key
  and a refused login are :class:`~dagster_gpu.slurm.transport.TransportRefused`, naming host, user and the
  fingerprint.
- Secrets: none in any argv. The variables a submitted job inherits (``forward_env`` names: ``DAGSTER_*``
  by default) travel on sbatch's stdin; the master's own messages go to ``<socket>.log`` (0600).
"""

from __future__ import annotations

import fcntl
import fnmatch
import hashlib
import logging
import os
import stat
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from dagster_gpu.slurm import ssh_command as C
from dagster_gpu.slurm.transport import TransportError, TransportRefused, TransportUnreachable, scrubbed_env

log = logging.getLogger(__name__)

#: Seconds between two ``ssh -O check`` of one process while its commands succeed.
CHECK_EVERY_S = 15.0
#: Seconds to wait for the flock of a master being (re)made by another process.
MASTER_LOCK_S = 60.0


def default_control_dir() -> str:
    """``$XDG_RUNTIME_DIR/dagster-gpu-ssh`` when that is an absolute directory, else ``/tmp/dagster-gpu-ssh-<uid>``."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg) and os.path.isdir(xdg):
        return os.path.join(xdg, "dagster-gpu-ssh")
    return f"/tmp/dagster-gpu-ssh-{os.geteuid()}"


def _private_dir(path: str) -> None:
    """Make ``path`` 0700 if missing; refuse one another user owns or group/others can write (a socket
    there could be swapped for another master)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o022:
        raise TransportRefused(
            f"refusing ssh control directory {path} (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}): "
            f"it must be a directory of uid {os.geteuid()} that group and others cannot write"
        )


@dataclass
class SshTransport:
    """See module doc.

    Args:
        target: the login node (:class:`~dagster_gpu.slurm.ssh_command.SshTarget`).
        remote_spool: the spool directory on the cluster (a path the compute nodes see): manifests, the job
            script, the task runner, the tasks' logs.
        forward_env: patterns (fnmatch) of this process's variables that a submitted job inherits, as it does
            from a local sbatch (default ``DAGSTER_*``: DAGSTER_HOME, a DAGSTER_PG_PASSWORD the instance refers
            to); never ``SLURM_*``-like names (scrubbed).
        control_dir: where the master's socket lives (default :func:`default_control_dir`).
    """

    target: C.SshTarget
    remote_spool: str
    forward_env: Sequence[str] = ("DAGSTER_*",)
    control_dir: str = field(default_factory=default_control_dir)
    kind: str = "ssh"
    masters_started: int = 0  # by this process (tests, benchmarks)
    _checked_at: float = field(default=0.0, repr=False)

    def __post_init__(self):
        _private_dir(self.control_dir)
        self.socket = C.control_path(self.target, self.control_dir)

    # ------------------------------------------------------------------------------ the master
    def _ssh(self, argv: Sequence[str], timeout_s: float, stdin: str | bytes | None = None, text: bool = True):
        env = scrubbed_env(os.environ)
        feed = {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
        return subprocess.run(list(argv), capture_output=True, text=text, env=env, timeout=timeout_s, check=False, **feed)

    def master_alive(self) -> bool:
        """``ssh -O check``: True when the master answers on the socket."""
        if not os.path.exists(self.socket):
            return False
        try:
            return self._ssh(C.control_argv(self.target, self.socket, "check"), 15).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    @contextmanager
    def _master_lock(self) -> Iterator[None]:
        fd = os.open(self.socket + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            deadline = time.monotonic() + MASTER_LOCK_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TransportUnreachable(f"ssh master for {self.target.label} is being made by another process", sent=False)
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)

    def ensure_master(self, force_check: bool = False) -> None:
        """A live master on the socket: checked (at most every CHECK_EVERY_S unless ``force_check``), else
        (re)made under the lock. Raises TransportUnreachable, TransportRefused."""
        now = time.monotonic()
        if not force_check and now - self._checked_at < CHECK_EVERY_S:
            return
        if self.master_alive():
            self._checked_at = now
            return
        with self._master_lock():
            if self.master_alive():  # another process made it meanwhile
                self._checked_at = time.monotonic()
                return
            self._start_master()
            self._checked_at = time.monotonic()

    def _start_master(self) -> None:
        if os.path.lexists(self.socket):  # stale: its master is gone
            os.unlink(self.socket)
        log_file = self.socket + ".log"
        fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        argv = C.master_argv(self.target, self.socket, log_file)
        try:
            cp = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env=scrubbed_env(os.environ), timeout=self.target.connect_timeout_s + 30, check=False)
        except subprocess.TimeoutExpired:
            raise TransportUnreachable(f"ssh to {self.target.label} timed out", sent=False) from None
        text = Path(log_file).read_text(errors="replace") + (cp.stderr or b"").decode(errors="replace")
        if cp.returncode != 0 or not os.path.exists(self.socket):
            self._raise(text, sent=False)
        self.masters_started += 1
        log.info("ssh: master for %s up (socket %s)", self.target.label, self.socket)

    def stop_master(self) -> None:
        """``ssh -O exit``: end the master (its commands in flight end too)."""
        if os.path.exists(self.socket):
            self._ssh(C.control_argv(self.target, self.socket, "exit"), 15)

    def _raise(self, text: str, sent: bool) -> None:
        kind = C.classify(text)
        if kind in ("host_key_changed", "host_key_unknown", "login_refused"):
            raise TransportRefused(C.refusal_message(kind, self.target, text, self.target.known_hosts_file))
        last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "no message")
        raise TransportUnreachable(f"ssh to {self.target.label}: {last}", sent=sent)

    # ------------------------------------------------------------------------------ commands
    def _remote(self, remote: str, timeout_s: float, stdin: str | bytes | None = None, text: bool = True, resend: bool = True):
        """One command over the master (re-made once if it was gone). Returns the CompletedProcess."""
        self.ensure_master()
        for attempt in (0, 1):
            cp = self._ssh(C.command_argv(self.target, self.socket, remote), timeout_s, stdin=stdin, text=text)
            if cp.returncode != 255:
                return cp
            err = cp.stderr if isinstance(cp.stderr, str) else cp.stderr.decode(errors="replace")
            if C.classify(err) == "session_refused":
                raise TransportUnreachable(f"ssh to {self.target.label}: the login node refused another session "
                                           f"on the shared connection (sshd MaxSessions): {err.strip()}", sent=False)
            self._checked_at = 0.0
            if C.never_sent(err):  # the master was gone before the command left: make one, send it again (even sbatch)
                if attempt == 0:
                    log.warning("ssh: master for %s is gone; making a new one", self.target.label)
                    self.ensure_master(force_check=True)
                    continue
                raise TransportUnreachable(f"ssh to {self.target.label}: no master ({err.strip()})", sent=False)
            # the connection dropped while the command ran (or the remote command exited 255 itself)
            if self.master_alive():
                return cp
            if attempt == 0 and resend:
                log.warning("ssh: connection to %s dropped (%s); making a new one", self.target.label, err.strip() or "no message")
                self.ensure_master(force_check=True)
                continue
            raise TransportUnreachable(f"ssh to {self.target.label}: connection lost ({err.strip() or 'no message'})", sent=True)
        raise AssertionError("unreachable")

    def run(
        self, argv: Sequence[str], *, set_env: Mapping[str, str], timeout_s: float, forward_env: bool = False
    ) -> subprocess.CompletedProcess:
        """``argv`` on the login node (see :class:`~dagster_gpu.slurm.transport.Transport`). A command that
        cannot be sent again safely (``forward_env``: sbatch) is not resent after a drop."""
        stdin = C.stdin_env_text(self.forwarded()) if forward_env else None
        remote = C.remote_command(argv, set_env, stdin_env=forward_env)
        return self._remote(remote, timeout_s, stdin=stdin, resend=not forward_env)

    def forwarded(self) -> dict[str, str]:
        """This process's variables matching ``forward_env`` (never a Slurm-scrubbed name)."""
        env = scrubbed_env(os.environ)
        return {k: v for k, v in env.items() if any(fnmatch.fnmatchcase(k, p) for p in self.forward_env)}

    # ------------------------------------------------------------------------------ spool files
    def upload(self, files: Sequence[tuple[str, bytes, int]], timeout_s: float = 60.0) -> dict[str, str]:
        """Write ``files`` (remote path, content, mode) under :attr:`remote_spool` in one round trip: each
        atomically, directories 0700 and trust-checked on the cluster side. Returns {path: sha256 hex} as
        the login node read them back; raises TransportRefused when the remote spool is not trusted or a
        digest differs from what was sent, TransportUnreachable."""
        payload = b"".join(content for _, content, _ in files)
        remote = C.upload_command(self.remote_spool, [(p, mode, len(content)) for p, content, mode in files])
        cp = self._remote(remote, timeout_s, stdin=payload, text=False)
        out, err = cp.stdout.decode(errors="replace"), cp.stderr.decode(errors="replace")
        if cp.returncode != 0:
            raise TransportRefused(f"ssh {self.target.label}: could not write the spool files under {self.remote_spool}: {err.strip() or cp.returncode}")
        digests = C.parse_sha256sum(out)
        for path, content, _ in files:
            if digests.get(path) != hashlib.sha256(content).hexdigest():
                raise TransportRefused(f"ssh {self.target.label}: {path} reads back as {digests.get(path)}, not what was written")
        return digests

    def tail(self, path: str, lines: int = 20) -> str:
        """The last ``lines`` lines of a file on the cluster ('' when absent or unreachable now)."""
        try:
            cp = self._remote(C.tail_command(path, lines), 30)
        except (TransportUnreachable, TransportRefused, subprocess.TimeoutExpired) as e:
            return f"(could not read {path} over ssh: {e})"
        return cp.stdout


    def read_from(self, path: str, offset: int, timeout_s: float = 30.0) -> bytes:
        """The bytes of a file on the cluster from ``offset`` (b"" when absent), in one round trip over the
        master. Raises TransportUnreachable, TransportRefused, subprocess.TimeoutExpired, and
        TransportError when the remote ``tail`` fails."""
        cp = self._remote(C.read_from_command(path, offset), timeout_s, text=False)
        if cp.returncode != 0:
            raise TransportError(f"ssh {self.target.label}: reading {path}: {cp.stderr.decode(errors='replace').strip()}")
        return cp.stdout


def transport_from_settings(settings) -> "SshTransport | None":
    """The transport a :class:`~dagster_gpu.slurm.settings.SlurmSettings` asks for: None for ``local`` (the
    client's default), an :class:`SshTransport` from its ``ssh`` section for ``ssh``. Raises ValueError for an
    unknown transport (``rest`` is built by :func:`dagster_gpu.slurm.rest.client_from_settings`) or ssh
    settings missing a host."""
    kind = (settings.transport or "local").lower()
    if kind == "local":
        return None
    if kind != "ssh":
        raise ValueError(f"slurm transport {settings.transport!r}: 'local', 'ssh' or 'rest' (slurmrestd: "
                         "dagster_gpu.slurm.rest.client_from_settings builds that client)")
    ssh = settings.ssh
    if not ssh.host:
        raise ValueError("slurm transport 'ssh' needs slurm.ssh.host")
    target = C.SshTarget(
        host=ssh.host, user=ssh.user, port=int(ssh.port),
        identity_file=os.path.expanduser(ssh.identity_file) if ssh.identity_file else None,
        known_hosts_file=os.path.expanduser(ssh.known_hosts_file) if ssh.known_hosts_file else None,
        proxy_jump=ssh.proxy_jump, use_ssh_config=bool(ssh.config),
    )  # fmt: skip
    if not target.known_hosts_file and not target.use_ssh_config:
        raise ValueError("slurm transport 'ssh' needs slurm.ssh.known_hosts_file (host keys are checked strictly), "
                         "or slurm.ssh.config: true")
    remote_spool = ssh.remote_spool_dir or settings.spool_dir
    if not remote_spool or not os.path.isabs(remote_spool):
        raise ValueError("slurm transport 'ssh' needs slurm.ssh.remote_spool_dir (or slurm.spool_dir): an absolute "
                         "path on the cluster that its compute nodes see")
    return SshTransport(
        target=target,
        remote_spool=remote_spool,
        forward_env=tuple(ssh.forward_env),
        control_dir=ssh.control_dir or default_control_dir(),
    )
