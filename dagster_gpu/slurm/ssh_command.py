"""Pure: the OpenSSH command lines of the ``ssh`` transport, the remote shell words they carry, and what
OpenSSH's messages mean (no I/O; :mod:`dagster_gpu.slurm.ssh` runs them).

One ControlMaster per ``user@host:port`` carries every command: its socket path is short and
deterministic (:func:`control_path`: ``<control dir>/cm-<16 hex of sha256(user@host:port)>``, under the
AF_UNIX limit of 108 bytes), so every run worker, sensor tick and process on the host finds the same
master. Every ``ssh`` we start has ``BatchMode=yes`` (never a prompt), ``StrictHostKeyChecking=yes``
against ``known_hosts_file`` (a changed or unknown key is refused, never accepted), password and
keyboard-interactive authentication off (passwords are not supported: a daemon cannot type one), and,
unless ``use_ssh_config``, ``-F none`` (only these options count). A command through the master also has
``ProxyCommand=none``-like protection: ``ControlMaster=no`` plus a ProxyCommand that fails, so when the
master is gone OpenSSH cannot quietly open a second TCP connection (it falls back to a direct connection
when the socket is stale, OpenSSH ``mux.c`` ``muxclient()``): the command fails instead and the transport
re-makes the master.

Remote words: the remote login shell parses the command line OpenSSH sends it, so every word is
:func:`shlex.quote`-d (:func:`remote_command`); a slurm partition name, a file name or a partition key
travels as one quoted word and can never inject. The wrapper (:data:`REMOTE_WRAPPER`, a constant) scrubs the
Slurm output/default variables on the login node too, reads the variables a submitted job must inherit
from stdin (never argv), then ``exec``\\ s the command.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass
from typing import Mapping, Sequence

#: ``ServerAliveInterval`` × ``ServerAliveCountMax``: a dead login node is noticed within 45 s.
SERVER_ALIVE = ("ServerAliveInterval=15", "ServerAliveCountMax=3")
#: How long an idle master stays up after its last command (s): ten minutes, as dagster-slurm's default.
CONTROL_PERSIST_S = 600

#: Runs on the login node as ``sh -c REMOTE_WRAPPER dagster-gpu <n> <KEY=VALUE>... <argv>...``: unset the
#: variables that change what Slurm commands print or submit (``SLURM_*`` but ``SLURM_CONF``, ``SBATCH_*``,
#: ``SQUEUE_*``…, as the local client does), export the ``n`` KEY=VALUE words (no secret: SLURM_CONF,
#: SLURM_UMASK), then, when n is negative (-1 - n words), also export the NUL-free ``KEY=VALUE`` lines read
#: from stdin (the job's inherited variables: may hold secrets, so never argv), and exec the command.
REMOTE_WRAPPER = r"""
for v in $(env | sed -n 's/^\(\(SLURM\|SBATCH\|SQUEUE\|SACCT\|SINFO\|SCANCEL\|SRUN\|SALLOC\|SCONTROL\)_[A-Za-z0-9_]*\)=.*/\1/p'); do
  [ "$v" = SLURM_CONF ] || unset "$v"
done
n=$1; shift
stdin_env=0
if [ "$n" -lt 0 ]; then stdin_env=1; n=$((-1 - n)); fi
while [ "$n" -gt 0 ]; do export "$1"; shift; n=$((n - 1)); done
if [ "$stdin_env" = 1 ]; then
  while IFS= read -r line; do
    case "$line" in [A-Za-z_]*=*) export "$line" ;; esac
  done
fi
exec "$@"
"""

#: Runs on the login node as ``sh -c REMOTE_UPLOAD dagster-gpu <spool root> (<path> <mode> <bytes>)...``
#: with the files' bytes, in order, on stdin: makes the spool root (0700) if missing and refuses it, or any
#: directory between it and a file, when this user does not own it or group/others can write it (exit 3, the
#: reason on stderr, as the local spool's trust check), and any path outside the root;
#: writes each file atomically (a mktemp file in its directory, chmod, rename) under directories made 0700;
#: then prints ``<sha256>  <path>`` of each file as written, so the caller compares them with what it sent.
REMOTE_UPLOAD = r"""
set -eu
umask 077
root=$1; shift
mkdir -p "$root"
check_dir() {
  d_owner=$(stat -c %u "$1"); d_mode=$(stat -c %a "$1")
  if [ "$d_owner" != "$(id -u)" ]; then
    echo "refusing spool directory $1 on $(hostname): owner uid $d_owner, mode $d_mode; it must be owned by uid $(id -u)" >&2; exit 3
  fi
  case "$d_mode" in *[2367]? | *[2367]) echo "refusing spool directory $1 on $(hostname): mode $d_mode; group or others can write it" >&2; exit 3 ;; esac
}
check_dir "$root"
written=""
while [ $# -ge 3 ]; do
  path=$1; mode=$2; size=$3; shift 3
  dir=$(dirname "$path")
  mkdir -p "$dir"
  d=$dir
  while :; do
    check_dir "$d"
    [ "$d" = "$root" ] && break
    case "$d" in "$root"/*) d=$(dirname "$d") ;; *) echo "refusing $path: not under the spool $root" >&2; exit 3 ;; esac
  done
  tmp=$(mktemp "$dir/.upload.XXXXXXXX")
  head -c "$size" > "$tmp"
  chmod "$mode" "$tmp"
  mv -f "$tmp" "$path"
  written="$written $path"
done
check_dir "$root"
for p in $written; do
  [ -f "$p" ] && [ ! -L "$p" ] && [ "$(stat -c %u "$p")" = "$(id -u)" ] || { echo "refusing $p: not a regular file of uid $(id -u)" >&2; exit 3; }
done
sha256sum $written
"""

#: ``sh -c REMOTE_TAIL dagster-gpu <path> <n>``: the last n lines of a file ('' when it does not exist).
REMOTE_TAIL = r"""[ -f "$1" ] && tail -n "$2" -- "$1" || true"""
#: ``sh -c REMOTE_READ_FROM dagster-gpu <path> <offset + 1>``: a file's bytes from a 0-based offset (``tail -c +K``
#: starts at byte K, 1-based; POSIX tail); nothing when the file does not exist.
REMOTE_READ_FROM = r"""[ -f "$1" ] && tail -c +"$2" -- "$1" || true"""


@dataclass(frozen=True)
class SshTarget:
    """A login node and how to reach it.

    Attributes:
        host: host name or address (``login.cluster.example``).
        user: login name (None: OpenSSH's default, this user's name, or ``User`` in ~/.ssh/config).
        port: TCP port.
        identity_file: private key (None: the agent's keys, or ~/.ssh/config's). Its passphrase, if any,
            must be in an agent: nothing prompts.
        known_hosts_file: the known_hosts file the host key is checked against, strictly (None: OpenSSH's
            defaults, ~/.ssh/known_hosts; only sensible with ``use_ssh_config``).
        proxy_jump: ``ProxyJump`` (``bastion.example`` or ``user@bastion:2222``), or None.
        use_ssh_config: read ~/.ssh/config (and /etc/ssh/ssh_config) for this host: its User, IdentityFile,
            CertificateFile, GSSAPI (Kerberos), ProxyJump apply. False: ``-F none``.
        connect_timeout_s: ``ConnectTimeout``.
    """

    host: str
    user: str | None = None
    port: int = 22
    identity_file: str | None = None
    known_hosts_file: str | None = None
    proxy_jump: str | None = None
    use_ssh_config: bool = False
    connect_timeout_s: int = 15

    def __post_init__(self):
        for name in ("host", "user", "proxy_jump"):
            v = getattr(self, name)
            if v is not None and (not v or v.startswith("-") or any(c.isspace() for c in v)):
                raise ValueError(f"ssh {name} {v!r}: must be non-empty, without spaces, not start with '-'")
        if not 0 < int(self.port) < 65536:
            raise ValueError(f"ssh port {self.port!r}: not a TCP port")

    @property
    def label(self) -> str:
        """``user@host:port`` (``host:port`` without a user): the master's identity, and what messages name."""
        return f"{self.user + '@' if self.user else ''}{self.host}:{self.port}"


def control_path(target: SshTarget, control_dir: str) -> str:
    """The master's socket: ``<control_dir>/cm-<first 16 hex of sha256(user@host:port)>`` (same target ->
    same path in every process; 20 bytes after the directory, far under AF_UNIX's 108)."""
    return f"{control_dir.rstrip('/')}/cm-{hashlib.sha256(target.label.encode()).hexdigest()[:16]}"


def common_options(target: SshTarget) -> list[str]:
    """The options every ``ssh`` of the transport carries (see module doc)."""
    opts = [] if target.use_ssh_config else ["-F", "none"]
    opts += [
        "-o", "BatchMode=yes",
        "-o", "PasswordAuthentication=no",
        "-o", "KbdInteractiveAuthentication=no",
        "-o", f"ConnectTimeout={int(target.connect_timeout_s)}",
        "-p", str(int(target.port)),
    ]  # fmt: skip
    if not target.use_ssh_config or target.known_hosts_file:
        opts += ["-o", "StrictHostKeyChecking=yes"]
    if target.known_hosts_file:
        opts += ["-o", f"UserKnownHostsFile={target.known_hosts_file}", "-o", "GlobalKnownHostsFile=/dev/null"]
    if target.identity_file:
        opts += ["-i", target.identity_file, "-o", "IdentitiesOnly=yes"]
    if target.user:
        opts += ["-l", target.user]
    return opts


def master_argv(target: SshTarget, socket: str, log_file: str) -> list[str]:
    """Start the master: ``ssh -M -N -f`` with ``ControlPersist``, keepalives, ``ProxyJump`` if any, its
    messages in ``log_file`` (``-E``: the backgrounded master keeps no pipe of ours open)."""
    argv = ["ssh", "-M", "-N", "-f", "-S", socket, "-E", log_file, *common_options(target),
            "-o", f"ControlPersist={CONTROL_PERSIST_S}", "-o", SERVER_ALIVE[0], "-o", SERVER_ALIVE[1]]  # fmt: skip
    if target.proxy_jump:
        argv += ["-J", target.proxy_jump]
    return [*argv, "--", target.host]


def control_argv(target: SshTarget, socket: str, op: str) -> list[str]:
    """``ssh -O check|exit -S <socket> <host>``: ask the master (rc 0: it answered)."""
    if op not in ("check", "exit", "stop"):
        raise ValueError(f"not an ssh control command: {op!r}")
    return ["ssh", "-O", op, "-S", socket, *common_options(target), "--", target.host]


def command_argv(target: SshTarget, socket: str, remote: str) -> list[str]:
    """One command through the master only: ``ControlMaster=no`` and a ProxyCommand that fails, so a gone
    master is an error (rc 255), never a second TCP connection."""
    return ["ssh", "-S", socket, "-o", "ControlMaster=no", "-o", "ProxyCommand=false", "-T",
            *common_options(target), "--", target.host, remote]  # fmt: skip


def remote_command(argv: Sequence[str], set_env: Mapping[str, str] = (), stdin_env: bool = False) -> str:
    """The command line the login node's shell gets: :data:`REMOTE_WRAPPER` run by ``sh -c`` with ``set_env``
    as ``KEY=VALUE`` words and ``argv``, every word :func:`shlex.quote`-d. ``stdin_env``: the wrapper also
    exports the ``KEY=VALUE`` lines it reads from stdin. Raises ValueError for an empty argv or a bad name."""
    if not argv:
        raise ValueError("empty command")
    words = []
    for k, v in dict(set_env).items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise ValueError(f"not an environment variable name: {k!r}")
        words.append(f"{k}={v}")
    n = -1 - len(words) if stdin_env else len(words)
    return shlex.join(["sh", "-c", REMOTE_WRAPPER, "dagster-gpu", str(n), *words, *map(str, argv)])


def stdin_env_text(env: Mapping[str, str]) -> str:
    """``KEY=VALUE`` lines for :func:`remote_command`'s ``stdin_env`` (a value with a newline is left out:
    it could not be told from the next line)."""
    return "".join(f"{k}={v}\n" for k, v in env.items() if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) and "\n" not in v)


def upload_command(root: str, files: Sequence[tuple[str, int, int]]) -> str:
    """:data:`REMOTE_UPLOAD` for ``files`` = ``(path, mode, size in bytes)`` under spool ``root``, quoted."""
    words = ["sh", "-c", REMOTE_UPLOAD, "dagster-gpu", root]
    for path, mode, size in files:
        words += [path, f"{int(mode):o}", str(int(size))]
    return shlex.join(words)


def tail_command(path: str, lines: int) -> str:
    """:data:`REMOTE_TAIL` for the last ``lines`` lines of ``path``, quoted."""
    return shlex.join(["sh", "-c", REMOTE_TAIL, "dagster-gpu", path, str(int(lines))])


def read_from_command(path: str, offset: int) -> str:
    """:data:`REMOTE_READ_FROM` for ``path`` from byte ``offset`` (0-based), quoted."""
    return shlex.join(["sh", "-c", REMOTE_READ_FROM, "dagster-gpu", path, str(int(offset) + 1)])


def parse_sha256sum(text: str) -> dict[str, str]:
    """``sha256sum`` output -> {path: hex digest}."""
    out = {}
    for line in text.splitlines():
        digest, _, path = line.partition("  ")
        if re.fullmatch(r"[0-9a-f]{64}", digest):
            out[path] = digest
    return out


# ------------------------------------------------------------------------- what OpenSSH's messages mean
_FINGERPRINT = re.compile(r"\b(SHA256:[A-Za-z0-9+/=]{20,}|MD5(?::[0-9a-f]{2}){16})")
_CHANGED = re.compile(r"REMOTE HOST IDENTIFICATION HAS CHANGED|Host key for .* has changed", re.I)
_HOSTKEY = re.compile(r"Host key verification failed|No \S+ host key is known for|host key .* not found", re.I)
_REFUSED = re.compile(r"Permission denied \((?P<methods>[^)]*)\)|Too many authentication failures", re.I)
_SESSION = re.compile(r"session request failed|Session open refused|mux_client_request_session|administratively prohibited", re.I)


def classify(text: str) -> str:
    """What an ``ssh`` that exited 255 said: ``host_key_changed``, ``host_key_unknown``, ``login_refused``,
    ``session_refused`` (the master is up but sshd's MaxSessions is reached: retry later) or
    ``unreachable`` (anything else: refused, timed out, dropped, the master gone)."""
    if _CHANGED.search(text):
        return "host_key_changed"
    if _HOSTKEY.search(text):
        return "host_key_unknown"
    if _REFUSED.search(text):
        return "login_refused"
    if _SESSION.search(text):
        return "session_refused"
    return "unreachable"


#: What a command through a gone master prints: its mux client could not reach the socket and fell back to
#: a direct connection, which ``ProxyCommand=false`` ended before any byte reached the server (OpenSSH 9.2:
#: ``Control socket connect(<path>): Connection refused`` for a stale socket, then ``kex_exchange_identification:
#: Connection closed by remote host`` / ``Connection closed by UNKNOWN port 65535`` from the failed proxy).
_NOT_SENT = re.compile(r"kex_exchange_identification|Connection closed by UNKNOWN port 65535|Control socket connect", re.I)


def never_sent(text: str) -> bool:
    """True when an ``ssh`` through the master exited 255 without reaching the login node (the master was
    gone): the command can be sent again, even sbatch."""
    return bool(_NOT_SENT.search(text))


def fingerprint(text: str) -> str | None:
    """The host key fingerprint OpenSSH printed (``SHA256:…``), or None."""
    m = _FINGERPRINT.search(text)
    return m.group(1) if m else None


def refusal_message(kind: str, target: SshTarget, text: str, known_hosts: str | None) -> str:
    """The error a refusal raises: names host, user, the fingerprint of a changed key, and what to do."""
    who = f"{target.user or '(ssh default user)'} on {target.host}:{target.port}"
    last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")
    if kind == "host_key_changed":
        return (
            f"ssh refused {target.host}:{target.port}: its host key changed (the server now offers "
            f"{fingerprint(text) or 'an unknown key'}), which does not match {known_hosts or 'known_hosts'}; "
            "nothing was sent. If the cluster's administrators changed the key, put the new one in that file"
        )
    if kind == "host_key_unknown":
        return (
            f"ssh refused {target.host}:{target.port}: its host key is not in {known_hosts or 'known_hosts'} "
            f"(strict host key checking; {fingerprint(text) or 'no fingerprint printed'}); add the login node's "
            "key from a trusted source (ssh-keyscan output checked against the site's published fingerprints)"
        )
    return (
        f"ssh login refused for {who}: {last or 'no message'}. dagster-gpu authenticates with a key (slurm.ssh.identity_file "
        "or the ssh agent), a certificate or Kerberos through ~/.ssh/config (slurm.ssh.config: true); password and "
        "keyboard-interactive logins are not supported (BatchMode=yes)"
    )
