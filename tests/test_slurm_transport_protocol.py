"""Each Slurm transport satisfies :class:`dagster_gpu.slurm.transport.Transport` with real values, and each
client declares what the coalescer, the poller and the backend read of it (no caller probes with getattr)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from dagster_gpu.slurm import backend, coalescer, poller
from dagster_gpu.slurm.client import SlurmClient
from dagster_gpu.slurm.rest import RestSlurmClient, RestTransport
from dagster_gpu.slurm.ssh import SshTransport
from dagster_gpu.slurm.ssh_command import SshTarget
from dagster_gpu.slurm.transport import LocalTransport, Transport, TransportUnavailable

MEMBERS = ("kind", "remote_spool", "run", "upload", "tail", "read_from")


def _ssh(tmp_path: Path) -> SshTransport:
    control = tmp_path / "ctl"
    return SshTransport(SshTarget(host="login.example", user="alice", known_hosts_file=str(tmp_path / "kh")),
                        remote_spool="/shared/spool", control_dir=str(control))


def test_every_transport_is_a_transport_with_its_kind_and_spool(tmp_path):
    transports = {"local": LocalTransport(), "ssh": _ssh(tmp_path), "rest": RestTransport("http://127.0.0.1:6820")}
    for kind, t in transports.items():
        assert isinstance(t, Transport), kind
        assert t.kind == kind
        for member in MEMBERS[2:]:
            assert callable(getattr(t, member)), (kind, member)
    assert transports["ssh"].remote_spool == "/shared/spool"
    assert transports["local"].remote_spool is None and transports["rest"].remote_spool is None


def test_the_protocol_declares_every_member_callers_reach():
    declared = set(Transport.__annotations__) | {n for n, v in vars(Transport).items() if inspect.isfunction(v)}
    assert set(MEMBERS) <= declared


@pytest.mark.parametrize("transport", [LocalTransport(), RestTransport("http://127.0.0.1:6820")], ids=["local", "rest"])
def test_spool_members_of_a_host_spool_transport_name_what_is_not_available(transport):
    kind = transport.kind
    with pytest.raises(TransportUnavailable, match=rf"^tail \(/s/batches/b/0.out\) is not available over {kind}"):
        transport.tail("/s/batches/b/0.out")
    with pytest.raises(TransportUnavailable, match=rf"^read_from \(/s/relay/r/x.jsonl\) is not available over {kind}"):
        transport.read_from("/s/relay/r/x.jsonl", 0)
    with pytest.raises(TransportUnavailable, match=rf"^upload \(/s/a.sh, /s/m.json\) is not available over {kind}"):
        transport.upload([("/s/a.sh", b"#!/bin/sh\n", 0o700), ("/s/m.json", b"{}", 0o600)])


def test_clients_declare_what_the_coalescer_and_poller_read():
    cli = SlurmClient()
    assert isinstance(cli.transport, LocalTransport)
    assert (cli.poll_format, cli.token_wait_s, dict(cli.extra_env)) == ("cli", 0.0, {})
    rest = RestSlurmClient(url="http://127.0.0.1:6820/", token_wait_s=42.0)
    assert isinstance(rest.transport, RestTransport) and rest.transport.url == "http://127.0.0.1:6820"
    assert (rest.poll_format, rest.token_wait_s, rest.transport.kind) == ("rest", 42.0, "rest")


def test_with_extra_env_copies_once_and_shares_the_call_counts():
    c = SlurmClient(extra_env={"A": "1"})
    umask = c.with_extra_env(SLURM_UMASK="0077")
    assert umask is not c and dict(umask.extra_env) == {"A": "1", "SLURM_UMASK": "0077"} and dict(c.extra_env) == {"A": "1"}
    assert umask.calls is c.calls
    assert umask.with_extra_env(SLURM_UMASK="0077") is umask


def test_no_caller_probes_the_client_or_transport_with_getattr():
    for module in (backend, coalescer, poller):
        src = Path(module.__file__).read_text()
        assert not re.findall(r"getattr\([^)]*(client|transport)", src), module.__name__
