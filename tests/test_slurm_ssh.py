"""The Slurm ssh transport against a real OpenSSH server (Debian's openssh-server on 127.0.0.1,
resources/ssh/sshd.sh): one TCP connection for every command of every process, a changed or unknown host key
and a refused login refused by name, a killed master re-made without a second connection, quoting that no
partition key or file name can break, the cluster-side spool files written and trust-checked there.

The OpenSSH behaviours relied on (checked here on the real client and server, OpenSSH 9.2p1 Debian 12):
``ssh -O check`` answers rc 0 while the master lives; a command with ``ControlMaster=no`` and a failing
``ProxyCommand`` exits 255 when the socket is stale instead of connecting directly; sshd logs one
``Accepted publickey for <user>`` line per TCP connection (LogLevel INFO), none per multiplexed session.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dagster_gpu.slurm import ssh_command as C
from dagster_gpu.slurm.ssh import SshTransport
from dagster_gpu.slurm.transport import TransportRefused, TransportUnreachable
from tests import ssh_helpers as SSH

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sshd() -> dict[str, str]:
    env = SSH.sshd_env()
    if env is None:
        pytest.skip("the test sshd did not start (resources/ssh/sshd.sh start; openssh-server from scripts/test.sh)")
    return env


@pytest.fixture
def dirs():
    made = [SSH.short_dir("dgs-ctl-"), SSH.short_dir("dgs-spool-")]
    yield made
    for sock in Path(made[0]).glob("cm-*[!gk]"):  # a master a failed test left (not the .lock/.log files)
        subprocess.run(["ssh", "-O", "exit", "-S", str(sock), "dagster-gpu-test"], capture_output=True)
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


def _stop(t: SshTransport) -> None:
    t.stop_master()


# ------------------------------------------------------------------------------------------- pure
def test_control_path_is_short_and_the_same_for_the_same_target():
    a = C.SshTarget("login.example.org", user="alice", port=22)
    p = C.control_path(a, "/run/user/1000/dagster-gpu-ssh")
    assert p == C.control_path(C.SshTarget("login.example.org", user="alice", port=22), "/run/user/1000/dagster-gpu-ssh/")
    assert p != C.control_path(C.SshTarget("login.example.org", user="bob", port=22), "/run/user/1000/dagster-gpu-ssh")
    assert p != C.control_path(C.SshTarget("login.example.org", user="alice", port=2222), "/run/user/1000/dagster-gpu-ssh")
    assert len(p.encode()) < 108 and os.path.basename(p).startswith("cm-") and len(os.path.basename(p)) == 19


def test_every_ssh_is_batch_mode_strict_and_never_a_password():
    t = C.SshTarget("h", user="u", port=2200, identity_file="/k", known_hosts_file="/kh")
    for argv in (C.master_argv(t, "/s", "/l"), C.command_argv(t, "/s", "true"), C.control_argv(t, "/s", "check")):
        joined = " ".join(argv)
        for opt in ("BatchMode=yes", "StrictHostKeyChecking=yes", "UserKnownHostsFile=/kh", "PasswordAuthentication=no",
                    "KbdInteractiveAuthentication=no"):
            assert opt in joined, (opt, argv)
        assert argv[:1] == ["ssh"] and "-F" in argv and argv[argv.index("-F") + 1] == "none"
    cmd = C.command_argv(t, "/s", "true")
    assert "ControlMaster=no" in cmd and "ProxyCommand=false" in cmd  # never a second TCP connection
    assert "-J" in C.master_argv(C.SshTarget("h", proxy_jump="bastion:2222", known_hosts_file="/kh"), "/s", "/l")
    assert "-F" not in C.master_argv(C.SshTarget("h", use_ssh_config=True), "/s", "/l")  # the user's ~/.ssh/config
    for bad in ("-oProxyCommand=x", "a b", ""):
        with pytest.raises(ValueError):
            C.SshTarget(bad)


# ------------------------------------------------------------------------------------------- real sshd
def test_many_commands_from_many_processes_use_one_connection(sshd, dirs):
    ctl, spool = dirs
    before = SSH.logins(sshd)
    t = SSH.transport(sshd, spool, ctl)
    assert t.run(["true"], set_env={}, timeout_s=20).returncode == 0
    # three more processes, five commands each: they find the same master by its socket path
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(REPO)!r})
        from tests import ssh_helpers as SSH
        env = SSH.sshd_env()
        t = SSH.transport(env, {spool!r}, {ctl!r})
        for i in range(5):
            cp = t.run(["echo", str(i)], set_env={{}}, timeout_s=20)
            assert cp.stdout == f"{{i}}\\n", cp
        print(t.masters_started)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert outs == ["0", "0", "0"]  # none of them started a master
    assert SSH.logins(sshd) - before == 1
    _stop(t)


def test_no_partition_key_or_file_name_reaches_a_shell(sshd, dirs):
    ctl, spool = dirs
    t = SSH.transport(sshd, spool, ctl)
    canary = Path(spool) / "pwned"
    nasty = f"p it's \"$(touch {canary})\"; `touch {canary}` & y\n$HOME * ~ \\"
    cp = t.run(["printf", "%s", nasty], set_env={"SLURM_CONF": f"/x/$(touch {canary})"}, timeout_s=20)
    assert cp.returncode == 0 and cp.stdout == nasty
    assert not canary.exists()
    _stop(t)


def test_the_slurm_variables_are_scrubbed_on_the_login_node_and_the_job_gets_the_forwarded_ones(sshd, dirs, monkeypatch):
    ctl, spool = dirs
    t = SSH.transport(sshd, spool, ctl)
    monkeypatch.setenv("DAGSTER_TEST_SECRET", "s3cr3t value")
    probe = ["sh", "-c", 'echo "$SQUEUE_FORMAT|$SLURM_CONF|$SLURM_UMASK|${DAGSTER_TEST_SECRET:-}"']
    remote_env = {"SLURM_CONF": "/etc/slurm/x.conf", "SLURM_UMASK": "0077"}
    # a login environment that sets SQUEUE_FORMAT and SLURM_* defaults (a site profile): the wrapper, run by
    # sh exactly as on the login node, unsets them before the command and keeps SLURM_CONF
    login_env = {"PATH": os.environ["PATH"], "SQUEUE_FORMAT": "%i", "SBATCH_ACCOUNT": "other", "SLURM_CONF": "/site.conf"}
    cp = subprocess.run(["sh", "-c", C.REMOTE_WRAPPER, "dagster-gpu", "0", "sh", "-c", 'echo "$SQUEUE_FORMAT|$SBATCH_ACCOUNT|$SLURM_CONF"'],
                        env=login_env, capture_output=True, text=True)
    assert cp.stdout.strip() == "||/site.conf", cp.stderr
    cp = t.run(["env", "SQUEUE_FORMAT=%i", *probe], set_env=remote_env, timeout_s=20)
    assert cp.stdout.strip() == "%i|/etc/slurm/x.conf|0077|"  # what the command itself sets stays
    cp = t.run(probe, set_env=remote_env, timeout_s=20, forward_env=True)
    assert cp.stdout.strip() == "|/etc/slurm/x.conf|0077|s3cr3t value"
    assert "s3cr3t" not in " ".join(C.remote_command(probe, remote_env, stdin_env=True))  # never in the argv
    _stop(t)


def test_a_killed_master_is_remade_and_no_command_opens_its_own_connection(sshd, dirs):
    ctl, spool = dirs
    t = SSH.transport(sshd, spool, ctl)
    before = SSH.logins(sshd)
    assert t.run(["echo", "a"], set_env={}, timeout_s=20).stdout == "a\n"
    assert t.master_alive()
    assert subprocess.run(C.control_argv(t.target, t.socket, "exit"), capture_output=True).returncode == 0
    assert not t.master_alive()
    # the next command finds the socket gone, re-makes the master once, and runs
    assert t.run(["echo", "b"], set_env={}, timeout_s=20).stdout == "b\n"
    assert t.masters_started == 2
    assert SSH.logins(sshd) - before == 2  # two masters, and not one connection more
    # killed (SIGKILL) rather than asked: the stale socket file stays; a command still never connects directly
    pid = int(subprocess.run(C.control_argv(t.target, t.socket, "check"), capture_output=True, text=True).stderr.split("pid=")[1].split(")")[0])
    os.kill(pid, 9)
    t._checked_at = 0.0
    assert t.run(["echo", "c"], set_env={}, timeout_s=20).stdout == "c\n"
    assert t.masters_started == 3 and SSH.logins(sshd) - before == 3
    _stop(t)


def test_a_changed_host_key_is_refused_naming_host_and_fingerprint(sshd, dirs):
    ctl, spool = dirs
    other = Path(ctl) / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = Path(ctl) / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{sshd['DAGSTER_GPU_SSH_PORT']} {' '.join(other.with_suffix('.pub').read_text().split()[:2])}\n")
    real_fp = subprocess.run(["ssh-keygen", "-lf", str(Path(sshd["DAGSTER_GPU_SSH_KNOWN_HOSTS"]))], capture_output=True, text=True).stdout.split()[1]
    before = SSH.logins(sshd)
    t = SSH.transport(sshd, spool, ctl, known_hosts_file=str(wrong))
    with pytest.raises(TransportRefused) as e:
        t.run(["true"], set_env={}, timeout_s=20)
    msg = str(e.value)
    assert "127.0.0.1" in msg and "host key changed" in msg and real_fp in msg and str(wrong) in msg
    assert SSH.logins(sshd) == before  # nothing logged in


def test_an_unknown_host_key_is_refused(sshd, dirs):
    ctl, spool = dirs
    empty = Path(ctl) / "known_hosts"
    empty.write_text("")
    with pytest.raises(TransportRefused) as e:
        SSH.transport(sshd, spool, ctl, known_hosts_file=str(empty)).run(["true"], set_env={}, timeout_s=20)
    assert "127.0.0.1" in str(e.value) and "not in" in str(e.value)


def test_a_refused_login_names_host_and_user_and_says_passwords_are_not_supported(sshd, dirs):
    ctl, spool = dirs
    stranger = Path(ctl) / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    with pytest.raises(TransportRefused) as e:
        SSH.transport(sshd, spool, ctl, identity_file=str(stranger)).run(["true"], set_env={}, timeout_s=20)
    msg = str(e.value)
    assert f"{sshd['DAGSTER_GPU_SSH_USER']} on 127.0.0.1:{sshd['DAGSTER_GPU_SSH_PORT']}" in msg
    assert "Permission denied" in msg and "password" in msg


def test_a_login_node_that_does_not_answer_is_transient_and_nothing_was_sent(sshd, dirs):
    ctl, spool = dirs
    with pytest.raises(TransportUnreachable) as e:
        SSH.transport(sshd, spool, ctl, port=1).run(["true"], set_env={}, timeout_s=20)
    assert e.value.sent is False and "127.0.0.1" in str(e.value)


def test_spool_files_are_written_atomically_and_checked_on_the_cluster(sshd, dirs):
    ctl, spool = dirs
    t = SSH.transport(sshd, spool, ctl)
    man = f"{spool}/batches/b1/manifest.json"
    digests = t.upload([(man, b'{"tasks": []}', 0o600), (f"{spool}/dagster-gpu-array.sh", b"#!/bin/sh\n", 0o700)])
    assert set(digests) == {man, f"{spool}/dagster-gpu-array.sh"}
    assert oct(os.stat(man).st_mode & 0o777) == "0o600" and oct(os.stat(f"{spool}/batches/b1").st_mode & 0o777) == "0o700"
    assert t.tail(man) == '{"tasks": []}'
    assert t.tail(f"{spool}/nothing") == ""
    os.chmod(f"{spool}/batches", 0o777)  # another user could now swap the batch directory
    with pytest.raises(TransportRefused) as e:
        t.upload([(f"{spool}/batches/b2/manifest.json", b"{}", 0o600)])
    assert f"{spool}/batches" in str(e.value) and "777" in str(e.value)
    _stop(t)


def test_a_command_through_a_gone_master_is_known_never_to_have_left(sshd, dirs):
    """What OpenSSH prints when the master's socket is stale and the fallback connection is cut by
    ProxyCommand=false: recorded here on the real client, and recognised as 'never sent' (even sbatch may go again)."""
    ctl, spool = dirs
    t = SSH.transport(sshd, spool, ctl)
    import socket as so

    stale = so.socket(so.AF_UNIX)
    stale.bind(t.socket)
    stale.close()  # a socket file nobody listens on: a master that died
    cp = subprocess.run(C.command_argv(t.target, t.socket, "true"), capture_output=True, text=True)
    assert cp.returncode == 255 and C.never_sent(cp.stderr), cp.stderr
    before = SSH.logins(sshd)
    assert t.run(["echo", "ok"], set_env={}, timeout_s=20, forward_env=True).stdout == "ok\n"  # sbatch-like: sent once
    assert SSH.logins(sshd) - before == 1 and t.masters_started == 1
    _stop(t)


def test_slurm_bin_dir_names_the_commands_on_the_login_node(sshd, dirs):
    """A site whose Slurm lives outside the non-interactive login shell's PATH (``/opt/slurm/bin``, a module):
    ``slurm_bin_dir`` runs ``<dir>/<command>`` there; a dir without the command says so, naming the setting."""
    from dagster_gpu.slurm.client import SlurmClient, SlurmNotInstalled

    ctl, spool = dirs
    bin_dir = Path(spool) / "opt slurm" / "bin"  # a space: the path travels as one quoted word
    bin_dir.mkdir(parents=True)
    (bin_dir / "scontrol").write_text('#!/bin/sh\necho "scontrol from $0 with SLURM_CONF=$SLURM_CONF: $*"\n')
    (bin_dir / "scontrol").chmod(0o755)
    t = SSH.transport(sshd, spool, ctl)
    client = SlurmClient(slurm_conf="/etc/slurm-site/slurm.conf", transport=t, bin_dir=str(bin_dir), attempts=1)
    cp = client.run(["scontrol", "show", "config"])
    assert cp.stdout.strip() == f"scontrol from {bin_dir}/scontrol with SLURM_CONF=/etc/slurm-site/slurm.conf: show config"
    assert client.calls == {"scontrol": 1}
    with pytest.raises(SlurmNotInstalled, match=f"{bin_dir}/sinfo not found on the ssh login node"):
        client.run(["sinfo", "-V"])
    _stop(t)
