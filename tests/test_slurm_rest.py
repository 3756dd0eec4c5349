"""The rest transport's client (dagster_gpu/slurm/rest.py) against the real slurmrestd of the 24.11 test cluster
(Debian trixie's slurmrestd 24.11.5 with auth/jwt, resources/slurm/trixie.sh): submit, state, cancel and
accounting on each data_parser version it serves, the version picked from /openapi/v3, an expired or foreign
token refused by name (never an empty queue), an unreachable server transient; and the token file and job
environment rules, which need no server."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from dagster_gpu.slurm.client import SlurmUnreachable
from dagster_gpu.slurm.poller import SharedPoller
from dagster_gpu.slurm.rest import RestAuthError, RestSlurmClient, TokenError, TokenSource, token_expiry
from dagster_gpu.slurm.spool import Spool
from tests import rest_helpers as R

LIVE = pytest.mark.e2e


@pytest.fixture(scope="module")
def token_file(tmp_path_factory) -> Path:
    reason = R.unavailable_reason()
    if reason:
        pytest.skip(reason)
    return R.write_token(tmp_path_factory.mktemp("rest-token") / "jwt", 3600)


def _client(token_file: Path, **kw) -> RestSlurmClient:
    return RestSlurmClient(url=R.URL, user="root", tokens=TokenSource(file=str(token_file)), attempts=2, backoff_max_s=0.5, **kw)


def _wait(pred, timeout_s: float, what: str, why=lambda: ""):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} {why()}")


@LIVE
def test_the_newest_served_version_is_picked(token_file):
    import dataclasses

    c = _client(token_file, version=None)
    assert c.data_parser() == "v0.0.42"  # 24.11 serves v0.0.40-v0.0.42
    # a copy with SLURM_UMASK (what the coalescer submits with) keeps the pick: no second /openapi/v3
    copy = dataclasses.replace(c, extra_env={"SLURM_UMASK": "0077"}, calls={})
    assert copy.data_parser() == "v0.0.42" and copy.calls == {}
    assert c.config()["SLURM_VERSION"].startswith("24.11") and c.gpu_tres_tracked()


@LIVE
@pytest.mark.parametrize("version", ["v0.0.40", "v0.0.41", "v0.0.42"])
def test_submit_state_cancel_accounting(token_file, tmp_path, version):
    c = _client(token_file, version=version)
    script = tmp_path / "job.sh"
    script.write_text('#!/bin/sh\n[ "$SLURM_ARRAY_TASK_ID" = 2 ] && exec sleep "$1"\nexit "$2"\n')
    opts = ["--account=research", "--gres=gpu:1", "--array=0-2", f"--output={tmp_path}/%a.out", "--job-name=rest-live",
            "--time=2", "--requeue"]
    job = c.submit_job(script, opts, script_args=["60", "3"])
    rows = _wait(lambda: (q := c.squeue([job.job_id])) and any(r.array_task_id == 2 and r.state.name == "RUNNING" for r in q) and q,
                 60, "task 2 running", lambda: [(r.id.raw, str(r.state)) for r in c.squeue([job.job_id])])
    assert {r.array_job_id for r in rows} == {job.job_id} and {r.name for r in rows} == {"rest-live"}
    assert {r.tres_per_node for r in rows} == {"gres/gpu:1"}
    # a running task: cancelling one that is still pending inside its array's record leaves no accounting
    # record on 24.11 (scancel on the CLI does the same: the task just leaves the array's pending set)
    c.scancel([f"{job.job_id}_2"])
    c.scancel(["999999999"])  # unknown: ignored
    acct = _wait(lambda: (a := c.sacct([job.job_id])) and len(a) == 3 and all(r.state.final for r in a) and a, 60,
                 "three final records", lambda: [(r.id.raw, str(r.state)) for r in c.sacct([job.job_id])])
    by_task = {r.id.task_id: r for r in acct}
    assert [by_task[t].state.name for t in (0, 1, 2)] == ["FAILED", "FAILED", "CANCELLED"]
    assert by_task[0].exit_code == 3 and by_task[0].alloc_tres["gres/gpu"] == 1.0  # `exit "$2"`
    assert by_task[2].start is not None and by_task[2].end >= by_task[2].start
    c.scancel([f"{job.job_id}_0"])  # ended: slurmrestd answers error 2021 in the status list, ignored
    q, a = c.poll_query([job.job_id])
    assert a.count("\n") == 1 and '"jobs"' in a


@LIVE
def test_an_expired_token_is_a_clear_error_not_an_empty_queue(token_file, tmp_path):
    short = R.write_token(tmp_path / "short", 1)
    time.sleep(2.5)
    c = _client(short)
    secret = short.read_text().strip()
    assert token_expiry(secret) < time.time()
    for call in (lambda: c.squeue([1]), lambda: c.sacct([1]), lambda: c.node_gres(None)):
        with pytest.raises(RestAuthError) as e:
            call()
        msg = str(e.value)
        assert "expired" in msg and R.URL in msg and "user root" in msg and str(short) in msg
        assert secret not in msg and secret.split(".")[1] not in msg
    # the shared poll records an error (steps stay UNKNOWN), never "no jobs"
    spool = Spool(tmp_path / "spool")
    snap = SharedPoller(spool, c, interval_s=1).poll({123})
    assert not snap.ok and "expired" in snap.error and not snap.queue and not snap.acct


@LIVE
def test_a_foreign_token_is_refused_by_name(token_file, tmp_path, monkeypatch):
    monkeypatch.setenv("DGPU_TEST_BAD_JWT", "eyJhbGciOiJIUzI1NiJ9.eyJleHAiOjQxMDI0NDQ4MDAsInN1biI6InJvb3QifQ.c2lnbmF0dXJl")
    c = RestSlurmClient(url=R.URL, user="root", tokens=TokenSource(env="DGPU_TEST_BAD_JWT"), attempts=1)
    with pytest.raises(RestAuthError, match=r"environment variable DGPU_TEST_BAD_JWT.*not valid for this server") as e:
        c.squeue([1])
    assert "c2lnbmF0dXJl" not in str(e.value)


@LIVE
def test_bearer_header_is_accepted(token_file):
    assert _client(token_file, auth_header="bearer").node_gres(None)[0].gpus() == 4


def test_an_unreachable_server_is_transient_and_unsent(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    monkeypatch.setenv("DGPU_TEST_JWT", "x.y.z")
    c = RestSlurmClient(url=f"http://127.0.0.1:{port}", tokens=TokenSource(env="DGPU_TEST_JWT"), attempts=2, backoff_max_s=0.1)
    with pytest.raises(SlurmUnreachable, match=f"127.0.0.1:{port} unreachable") as e:
        c.squeue([1])
    assert e.value.sent is False and c.calls["slurmrestd"] == 2  # retried, then raised


def test_token_file_must_be_private_and_is_re_read_when_it_changes(tmp_path):
    f = tmp_path / "jwt"
    f.write_text("SLURM_JWT=aaa.bbb.ccc\n")
    os.chmod(f, 0o644)
    src = TokenSource(file=str(f))
    with pytest.raises(TokenError, match=r"mode 0644.*chmod 600") as e:
        src.token()
    assert "aaa" not in str(e.value)
    os.chmod(f, 0o600)
    assert src.token() == "aaa.bbb.ccc"
    f.write_text("ddd.eee.fffff\n")  # renewed (size changes too)
    assert src.token() == "ddd.eee.fffff"
    with pytest.raises(TokenError, match="environment variable DGPU_TEST_NO_SUCH_JWT is unset"):
        TokenSource(env="DGPU_TEST_NO_SUCH_JWT").token()
    with pytest.raises(TokenError, match="cannot read"):
        TokenSource(file=str(tmp_path / "missing")).token()


def test_job_environment_leaves_secrets_and_slurm_names_out(monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", "/h")
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", "hunter2")
    monkeypatch.setenv("DAGSTER_GPU_API_TOKEN", "t")
    monkeypatch.setenv("SLURM_JWT", "x.y.z")
    monkeypatch.setenv("OTHER", "o")
    c = RestSlurmClient(url="http://127.0.0.1:1", extra_env={"SLURM_UMASK": "0077"}, slurm_conf="/etc/slurm.conf")
    env = c.job_environment()
    assert env["DAGSTER_HOME"] == "/h" and env["SLURM_UMASK"] == "0077" and env["PATH"] == os.environ["PATH"]
    assert not {"DAGSTER_PG_PASSWORD", "DAGSTER_GPU_API_TOKEN", "SLURM_JWT", "OTHER", "SLURM_CONF"} & set(env)


def test_settings_build_the_rest_client_or_say_what_is_missing(tmp_path):
    from dagster_gpu.slurm.backend import SlurmBackend, SlurmSettings
    from dagster_gpu.slurm.rest import client_from_settings

    with pytest.raises(ValueError, match="needs rest_url"):
        client_from_settings(SlurmSettings(transport="rest", spool_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="must start with http"):
        client_from_settings(SlurmSettings(transport="rest", rest_url="slurm:6820", spool_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="leave remote_spool_dir unset"):
        client_from_settings(SlurmSettings(transport="rest", rest_url="http://x:6820", remote_spool_dir="/s", spool_dir=str(tmp_path)))
    s = SlurmSettings(transport="rest", rest_url="https://slurm.example.org/", rest_token_env="MY_JWT", rest_auth_header="bearer",
                      rest_data_parser="v0.0.41", rest_max_array_size=501, spool_dir=str(tmp_path))
    c = SlurmBackend(s).client
    assert isinstance(c, RestSlurmClient) and c.url == "https://slurm.example.org" and c.tokens.env == "MY_JWT"
    assert (c.auth_header, c.version, c.max_array_size_assumed, c.poll_format) == ("bearer", "v0.0.41", 501, "rest")
    with pytest.raises(ValueError, match="x-slurm.*bearer"):
        RestSlurmClient(url="http://x", auth_header="basic")
