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

    with pytest.raises(ValueError, match=r"needs slurm\.rest\.url"):
        client_from_settings(SlurmSettings(transport="rest", spool_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="must start with http"):
        client_from_settings(SlurmSettings(transport="rest", rest={"url": "slurm:6820"}, spool_dir=str(tmp_path)))
    with pytest.raises(ValueError, match=r"leave slurm\.ssh\.remote_spool_dir unset"):
        client_from_settings(SlurmSettings(transport="rest", rest={"url": "http://x:6820"}, ssh={"remote_spool_dir": "/s"},
                                           spool_dir=str(tmp_path)))
    s = SlurmSettings(transport="rest", rest={"url": "https://slurm.example.org/", "token_env": "MY_JWT", "auth_header": "bearer",
                                              "data_parser": "v0.0.41", "max_array_size": 501}, spool_dir=str(tmp_path))
    c = SlurmBackend(s).client
    assert isinstance(c, RestSlurmClient) and c.url == "https://slurm.example.org" and c.tokens.env == "MY_JWT"
    assert (c.auth_header, c.version, c.max_array_size_assumed, c.poll_format) == ("bearer", "v0.0.41", 501, "rest")
    with pytest.raises(ValueError, match="x-slurm.*bearer"):
        RestSlurmClient(url="http://x", auth_header="basic")


# ------------------------------------------------------------------------------------------ an expired token at submission
DATA = Path(__file__).parent / "data" / "slurm" / "rest" / "v0.0.42"


def _jwt(exp: float, tag: str = "a") -> str:
    import base64
    import json

    enc = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).decode().rstrip("=")  # noqa: E731
    return f"{enc({'alg': 'HS256'})}.{enc({'exp': int(exp), 'sun': 'root', 'tag': tag})}.c2lnLXt{tag}"


def _write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with ``text`` (mode 0600), as ``trixie.sh token`` and a renewing cron do."""
    tmp = path.with_name(path.name + ".new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


class _Resp:
    def __init__(self, status: int, doc: dict):
        import json

        self.status, self.reason, self.data = status, {200: "OK", 511: "Network Authentication Required"}.get(status, "?"), json.dumps(doc).encode()


class FakeSlurmrestd:
    """slurmrestd 24.11's answers from the recorded documents: ``/openapi/v3`` serves v0.0.42 whatever the token;
    a call with a token whose ``exp`` has passed (on this server's clock, ``time.time() + skew_s``) gets the
    recorded HTTP 511 refusal and creates nothing; ``job/submit`` otherwise the recorded job id. ``posts`` lists
    each job/submit as (token tag, HTTP status); ``read_timeout``: every job/submit times out after it was sent."""

    def __init__(self, skew_s: float = 0.0, read_timeout: bool = False):
        self.skew_s, self.read_timeout = skew_s, read_timeout
        self.posts: list[tuple[str, int]] = []
        self.reads: list[tuple[str, int]] = []

    def request(self, method, url, headers=None, body=None, timeout=None, redirect=False):
        import json

        import urllib3

        path = url.split("://", 1)[1].split("/", 1)[1]
        if path == "openapi/v3":
            return _Resp(200, {"paths": {"/slurm/v0.0.42/jobs/": {}, "/slurm/v0.0.42/job/submit": {}}})
        tok = headers["X-SLURM-USER-TOKEN"]
        tag = json.loads(__import__("base64").urlsafe_b64decode(tok.split(".")[1] + "==")).get("tag", "?")
        refused = token_expiry(tok) <= time.time() + self.skew_s
        status = 511 if refused else 200
        if path.endswith("job/submit"):
            self.posts.append((tag, status))
            if self.read_timeout:
                raise urllib3.exceptions.ReadTimeoutError(None, url, "read timed out")
            return _Resp(511, json.loads((DATA / "submit_expired_token.json").read_text())) if refused else \
                _Resp(200, json.loads((DATA / "submit.json").read_text()))
        self.reads.append((path, status))
        if refused:
            return _Resp(511, {"errors": [{"error": "Protocol authentication error", "error_number": 1007}]})
        return _Resp(200, json.loads((DATA / "nodes.json").read_text()))


def _fake_client(tmp_path, token: str, fake: FakeSlurmrestd | None = None, **kw) -> tuple[RestSlurmClient, FakeSlurmrestd, Path]:
    f = tmp_path / "jwt"
    _write_private(f, token)
    fake = fake or FakeSlurmrestd()
    kw.setdefault("token_poll_s", 0.02)
    c = RestSlurmClient(url="http://slurmrestd.test:6820", user="root", tokens=TokenSource(file=str(f)), http=fake,
                        version="v0.0.42", attempts=4, backoff_max_s=0.01, **kw)
    return c, fake, f


def _renew_later(path: Path, delay_s: float, token: str):
    import threading

    t = threading.Timer(delay_s, _write_private, (path, token))
    t.start()
    return t


def _script(tmp_path) -> Path:
    s = tmp_path / "job.sh"
    s.write_text("#!/bin/sh\ntrue\n")
    return s


def test_a_submission_under_an_expired_token_waits_for_the_renewed_file_and_submits_once(tmp_path, caplog):
    import logging

    stale = _jwt(time.time() - 40, "stale")
    c, fake, f = _fake_client(tmp_path, stale, token_wait_s=10)
    fresh = _jwt(time.time() + 1800, "fresh")
    _renew_later(f, 0.4, fresh)
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger="dagster_gpu.slurm.rest"):
        job = c.submit_job(_script(tmp_path), ["--array=0-1"], script_args=["x"])
    waited = time.monotonic() - t0
    assert job.job_id == 267 and 0.35 < waited < 5  # the recorded submit.json's job id
    assert fake.posts == [("fresh", 200)]  # nothing was sent with the expired token, and exactly one submission
    waits = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(waits) == 1 and f"token file {f}" in waits[0] and "expired at" in waits[0] and "up to 10 s" in waits[0]
    assert any("was renewed after" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    assert not any(stale in r.getMessage() or fresh in r.getMessage() for r in caplog.records)


def test_a_token_refused_as_expired_in_flight_is_sent_again_once_after_the_renewal(tmp_path):
    # the server's clock is 60 s ahead: the token is still valid here, expired there (a token that expires while
    # its launch is held for company looks the same): job/submit is refused (the recorded 511, nothing created)
    soon = _jwt(time.time() + 30, "soon")
    c, fake, f = _fake_client(tmp_path, soon, FakeSlurmrestd(skew_s=60), token_wait_s=10)
    with pytest.raises(RestAuthError, match="not valid for this server"):  # refused, not expired here: no wait
        c.submit_job(_script(tmp_path), ["--array=0-1"])
    assert fake.posts == [("soon", 511)]
    # expired on both clocks: waited for, then sent again exactly once with the renewed token
    fake.skew_s = 0.0
    late = _jwt(time.time() - 1, "late")
    _write_private(f, late)
    _renew_later(f, 0.3, _jwt(time.time() + 1800, "renewed"))
    assert c.submit_job(_script(tmp_path), ["--array=0-1"]).job_id == 267
    assert fake.posts == [("soon", 511), ("renewed", 200)]


@pytest.mark.exclusive  # waits timed in tenths of a second
def test_a_token_that_expires_while_its_submission_is_refused_is_waited_for_then_sent_once(tmp_path, monkeypatch):
    # valid when checked here, refused by the server, expired here too when the refusal is read
    edge = _jwt(time.time() + 1.5, "edge")
    c, fake, f = _fake_client(tmp_path, edge, FakeSlurmrestd(skew_s=60), token_wait_s=10)
    real_request = fake.request

    def refusal_arrives_after_exp(method, url, **kw):
        r = real_request(method, url, **kw)
        if url.endswith("job/submit") and r.status == 511:
            time.sleep(max(0.0, token_expiry(edge) - time.time()) + 0.05)
            fake.skew_s = 0.0
        return r

    monkeypatch.setattr(fake, "request", refusal_arrives_after_exp)
    _renew_later(f, 2.0, _jwt(time.time() + 1800, "renewed"))
    assert c.submit_job(_script(tmp_path), ["--array=0-1"]).job_id == 267
    assert fake.posts == [("edge", 511), ("renewed", 200)]


@pytest.mark.exclusive  # waits timed in tenths of a second
def test_the_wait_runs_out_with_the_auth_error_and_is_not_repeated(tmp_path):
    stale = _jwt(time.time() - 100, "stale")
    c, fake, f = _fake_client(tmp_path, stale, token_wait_s=0.3)
    t0 = time.monotonic()
    with pytest.raises(RestAuthError) as e:
        c.submit_job(_script(tmp_path), ["--array=0-1"])
    assert 0.3 <= time.monotonic() - t0 < 3
    msg = str(e.value)
    assert "slurmrestd http://slurmrestd.test:6820" in msg and f"token file {f}" in msg and "user root" in msg
    assert "expired at" in msg and "not renewed within 0.3 s" in msg and "nothing was submitted" in msg
    assert stale not in msg and stale.split(".")[1] not in msg
    assert fake.posts == []
    # the same expired token again in this process: no second wait
    t0 = time.monotonic()
    with pytest.raises(RestAuthError, match="already waited for it to be renewed in vain"):
        c.submit_job(_script(tmp_path), ["--array=0-1"])
    assert time.monotonic() - t0 < 0.2 and fake.posts == []
    _write_private(f, _jwt(time.time() + 1800, "fresh"))  # renewed at last: submitted
    assert c.submit_job(_script(tmp_path), ["--array=0-1"]).job_id == 267 and fake.posts == [("fresh", 200)]


@pytest.mark.exclusive  # waits timed in tenths of a second
def test_an_expired_token_from_the_environment_fails_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("DGPU_TEST_OLD_JWT", _jwt(time.time() - 5, "env"))
    fake = FakeSlurmrestd()
    c = RestSlurmClient(url="http://slurmrestd.test:6820", tokens=TokenSource(env="DGPU_TEST_OLD_JWT"), http=fake,
                        version="v0.0.42", token_wait_s=30)
    t0 = time.monotonic()
    with pytest.raises(RestAuthError, match=r"environment variable DGPU_TEST_OLD_JWT\) expired at .*use slurm\.rest\.token_file"):
        c.await_credentials("the launch of step 'embed'")
    assert time.monotonic() - t0 < 0.5 and fake.posts == [] and fake.reads == []


def test_a_submission_that_may_have_reached_slurm_is_never_sent_again(tmp_path):
    c, fake, _ = _fake_client(tmp_path, _jwt(time.time() + 1800, "ok"), FakeSlurmrestd(read_timeout=True))
    with pytest.raises(SlurmUnreachable, match="ReadTimeoutError during POST") as e:
        c.submit_job(_script(tmp_path), ["--array=0-1"])
    assert e.value.sent is True and fake.posts == [("ok", 200)]  # sent once, never again (attempts=4)


def _backend(tmp_path, fake, token_wait_s: float):
    from dagster_gpu.slurm.backend import SlurmBackend, SlurmSettings
    from dagster_gpu.slurm.rest import client_from_settings

    f = tmp_path / "jwt"
    s = SlurmSettings(transport="rest", rest={"url": "http://slurmrestd.test:6820", "user": "root", "token_file": str(f),
                                              "data_parser": "v0.0.42", "token_wait_seconds": token_wait_s},
                      spool_dir=str(tmp_path / "spool"),
                      coalesce_window_seconds=0.0, coalesce_max_window_seconds=0.0, coalesce_hold_max_seconds=0.0,
                      coalesce_target_tasks=0, coalesce_backlog_tasks=0, submit_timeout_seconds=5.0)
    client = client_from_settings(s, http=fake)
    client.token_poll_s = 0.02
    return SlurmBackend(s, client=client), f


def _step(key="a.txt"):
    from dagster_gpu.contracts import StepLaunch
    from dagster_gpu.core.request import GpuRequest
    from dagster_gpu.policy.placement import Placement

    return StepLaunch(run_id="r-1", step_key="embed", partition_keys=(key,), attempt=0, argv=("python", "-c", "pass"),
                      env={}, request=GpuRequest(count=1), placement=Placement(backend="slurm", reason="forced"))


def test_a_slurm_launch_under_an_expired_token_waits_then_submits_one_job_array(tmp_path):
    from dagster_gpu.slurm.handle import SlurmHandle

    fake = FakeSlurmrestd()
    backend, f = _backend(tmp_path, fake, token_wait_s=10)
    assert backend.coalescer.lock_wait_s == 40.0  # a launch past its timeout outwaits a submitter's token wait
    _write_private(f, _jwt(time.time() - 60, "stale"))
    _renew_later(f, 0.4, _jwt(time.time() + 1800, "fresh"))
    h = SlurmHandle.from_handle(backend.launch(_step()))
    assert (h.array_job_id, h.array_task_id, h.tasks_in_array) == (267, 0, 1)
    # the throttle's nodes/ read and the submission went with the renewed token only; one job array
    assert fake.reads == [("slurm/v0.0.42/nodes/", 200)] and fake.posts == [("fresh", 200)]
    assert list(backend.spool.pending.glob("*.json")) == []


def test_a_slurm_launch_fails_with_the_auth_error_when_the_wait_runs_out(tmp_path):
    fake = FakeSlurmrestd()
    backend, f = _backend(tmp_path, fake, token_wait_s=0.2)
    _write_private(f, _jwt(time.time() - 60, "stale"))
    with pytest.raises(RestAuthError, match=r"expired at .* not renewed within 0.2 s \(slurm\.rest\.token_wait_seconds\), so the "
                                            r"launch of step 'embed' \(partition 'a.txt'\) failed"):
        backend.launch(_step())
    assert fake.posts == [] and fake.reads == [] and list(backend.spool.pending.glob("*.json")) == []


def test_a_token_expired_while_the_launch_was_held_is_waited_for_under_the_spool_lock(tmp_path):
    """The launch passed its check, then its token expired before the flush: job/submit waits for the renewal
    (holding the spool lock, so nobody else submits the launch), then sends once."""
    from dagster_gpu.slurm.coalescer import TaskRequest

    fake = FakeSlurmrestd()
    backend, f = _backend(tmp_path, fake, token_wait_s=10)
    _write_private(f, _jwt(time.time() - 1, "stale"))
    _renew_later(f, 0.3, _jwt(time.time() + 1800, "fresh"))
    req = TaskRequest(options=("--gres=gpu:1",), throttle=0, argv=("true",), env={}, run_id="r", step_key="s", partition_keys=("k",))
    a = backend.coalescer.submit(req)
    assert a.array_job_id == 267 and fake.posts == [("fresh", 200)]


def test_a_flush_that_raises_withdraws_the_launch(tmp_path):
    """A launch whose own flush raised before submitting anything (here MaxArraySize could not be read) fails, and
    its request leaves the spool: no later flush of another process submits a task for a failed launch."""
    from dagster_gpu.slurm.client import SlurmTransientError
    from dagster_gpu.slurm.coalescer import ArrayCoalescer, TaskRequest
    from dagster_gpu.slurm.window import WindowRule

    def unreadable():
        raise SlurmTransientError(["scontrol"], 1, "Unable to contact slurm controller")

    spool = Spool(tmp_path / "spool")
    co = ArrayCoalescer(spool, RestSlurmClient(url="http://x"), python="python3", rule=WindowRule(0.0, 0.0, 0.0),
                        max_wait_s=5, max_array_size=unreadable)
    req = TaskRequest(options=(), throttle=0, argv=("true",), env={}, run_id="r", step_key="s", partition_keys=("k",))
    with pytest.raises(SlurmTransientError, match="Unable to contact"):
        co.submit(req)
    assert list(spool.pending.glob("*.json")) == []
