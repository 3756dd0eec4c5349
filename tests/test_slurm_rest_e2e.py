"""gpu_executor's slurm backend with ``transport: rest``: the main end-to-end flow of tests/test_slurm_e2e.py with
every Slurm call going to the 24.11 test cluster's slurmrestd (resources/slurm/trixie.sh: Debian trixie's
slurmrestd with auth/jwt on 127.0.0.1) as from a Dagster host with no Slurm commands: the run workers' SLURM_CONF
names no file and their PATH has no 24.11 wrappers, so a call that bypassed slurmrestd would fail. The spool is
the local one (/tmp is the same directory inside the cluster's root); the tasks read the PostgreSQL password from
an env_files file, since a job's environment from slurmrestd carries no secret.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from dagster_gpu.slurm.rest import RestSlurmClient, TokenSource
from tests import rest_helpers as R
from tests import slurm_helpers as H
from tests.test_slurm_e2e import H_WEIRD, _all_observed, _materializations, _wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.e2e, pytest.mark.postgres]


@pytest.fixture
def rest_home(slurm_cluster, monkeypatch):
    for reason in (H.postgres_unavailable_reason(), R.unavailable_reason()):
        if reason:
            pytest.skip(reason)
    home, env = H.make_dagster_home()
    token = R.write_token(home / "slurmrestd.jwt", 3600)
    secrets = home / "worker-secrets.env"
    fd = os.open(secrets, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"DAGSTER_PG_PASSWORD={env['DAGSTER_PG_PASSWORD']}\n")
    env.update({
        "DGPU_TEST_SLURM_TRANSPORT": "rest", "DGPU_TEST_REST_URL": R.URL, "DGPU_TEST_REST_CREDENTIAL_FILE": str(token),
        "DGPU_TEST_ENV_FILE": str(secrets), "SLURM_CONF": str(home / "no-slurm.conf"),
        "PATH": os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p not in H.WRAPPER_DIRS),
    })  # fmt: skip
    for k, v in env.items():
        if os.environ.get(k) != v:
            monkeypatch.setenv(k, v)
    yield home, env, token


@H.on_slurm("24.11")
def test_eight_runs_over_slurmrestd_share_one_submit(rest_home):
    home_dir, env, token = rest_home
    keys = [f"p{i:03d}" for i in range(7)] + [H_WEIRD]
    pwned = Path("/tmp/pwned")
    pwned.unlink(missing_ok=True)
    procs = H.start_runs(env, keys)
    codes = H.wait_all(procs, 600)
    assert codes == [0] * len(keys), f"run workers exited {codes}; logs in {home_dir}\n{H.explain_failures(home_dir, keys, codes)}"
    batches = H.spool_batches(Path(env["DAGSTER_GPU_SLURM_SPOOL"]))
    print(f"rest transport: 8 runs -> {len(batches)} job/submit call(s): {[b['tasks'] for b in batches]}")
    assert 1 <= len(batches) <= 2 and sum(b["tasks"] for b in batches) == 8
    mats = _materializations(keys)
    for k in keys:
        assert len(mats[k]) == 1, f"{k!r} materialized {len(mats[k])} times"
        md = mats[k][0]
        assert md["test/partition_key"] == k and md["slurm/array_job_id"] in {b["array_job_id"] for b in batches}
        assert md["test/cuda_visible_devices"] in {"0", "1", "2", "3"}
    assert not pwned.exists(), "a partition key reached a shell"
    # the manifests and the tasks' logs stay 0600 in the local spool the tasks read (docs/security.md)
    spool = Path(env["DAGSTER_GPU_SLURM_SPOOL"])
    files = [p for b in batches for p in (spool / "batches" / b["batch"]).iterdir() if p.name == "manifest.json" or p.suffix == ".out"]
    assert len(files) == len(batches) + 8 and {oct(p.stat().st_mode & 0o777) for p in files} == {"0o600"}
    # no secret in the manifests or logs
    password = env["DAGSTER_PG_PASSWORD"]
    assert not any(password in p.read_text(errors="replace") for p in files)
    assert not any(token.read_text().strip() in p.read_text(errors="replace") for p in files)
    # bills from slurmdbd's records, read through slurmrestd
    obs = _wait_for(lambda: _all_observed(keys), 90, what="sacct observations")
    for k in keys:
        o = obs[k][0]
        assert o["bill/source"] == "sacct" and o["slurm/state"] == "COMPLETED"
        assert o["bill/gpu_seconds"] == o["slurm/elapsed_seconds"] * 1.0 and "gres/gpu=1" in o["slurm/alloc_tres"]
    # the same tasks as slurmrestd reports them
    client = RestSlurmClient(url=R.URL, user="root", tokens=TokenSource(file=str(token)))
    acct = client.sacct([b["array_job_id"] for b in batches])
    assert sorted(r.state.name for r in acct) == ["COMPLETED"] * 8


@H.on_slurm("24.11")
def test_a_backfill_terminated_mid_way_cancels_its_tasks_through_slurmrestd(rest_home):
    """The backfill daemon's runs, throttle 2, terminated while two tasks run (what the UI's Terminate does:
    the backfill CANCELING; tests/test_slurm_e2e.py's test_terminate_mid_backfill on the CLI path): every
    task leaves the queue through slurmrestd's DELETE, and slurmdbd records the cancelled ones."""
    import dagster as dg
    from dagster._core.execution.backfill import BulkActionStatus
    from dagster._core.storage.dagster_run import DagsterRunStatus, RunsFilter

    from dagster_gpu.commands.backfill import DaemonProcess, submit_asset_backfill
    from tests.slurm_pipeline import defs

    home_dir, env, token = rest_home
    env = {**env, "SLURM_TEST_THROTTLE": "2", "SLURM_TEST_WINDOW": "2", "SLURM_TEST_MAX_WINDOW": "10"}
    keys = [f"p{i:03d}" for i in range(6)]
    spool = Path(env["DAGSTER_GPU_SLURM_SPOOL"])
    client = RestSlurmClient(url=R.URL, user="root", tokens=TokenSource(file=str(token)))
    with dg.DagsterInstance.get() as instance:
        with DaemonProcess(home_dir / "workspace.yaml", env=env, log_file=home_dir / "daemon.log"):
            bid = submit_asset_backfill(instance, defs, dg.AssetKey("trivial"), keys, tags={"test/sleep": "120"})

            def running_tasks():
                ids = [b["array_job_id"] for b in H.spool_batches(spool)]
                return [r for r in (client.squeue(ids) if ids else []) if r.state.name == "RUNNING"]

            _wait_for(lambda: len(running_tasks()) >= 2, 300, 2, "two running array tasks")
            instance.update_backfill(instance.get_backfill(bid).with_status(BulkActionStatus.CANCELING))

            def all_ended():
                rs = instance.get_runs(RunsFilter(tags={"dagster/backfill": bid}))
                return rs if rs and all(r.is_finished for r in rs) else None

            runs = _wait_for(all_ended, 400, 3, "every run of the backfill to end")
    ids = [b["array_job_id"] for b in H.spool_batches(spool)]
    assert ids, "nothing was submitted"
    live = [r for r in client.squeue(ids) if r.state.status.value in ("pending", "running", "requeued")]
    assert live == [], f"tasks still queued after terminate: {[(r.id.raw, str(r.state)) for r in live]}"
    assert DagsterRunStatus.CANCELED in {r.status for r in runs}
    # the two tasks that ran when the backfill was terminated are recorded CANCELLED after running; a pending task
    # the throttle let start as the first cancels landed may be recorded too, CANCELLED the second it started (the
    # runs are terminated one by one, each run worker cancelling its own task)
    ran = _wait_for(lambda: (c := [r for r in client.sacct(ids) if r.state.name == "CANCELLED" and r.id.task_id is not None and r.start]) and
                    len([r for r in c if r.elapsed_s > 0]) >= 2 and c, 60, 2, "two cancelled tasks that ran, in slurmdbd")
    # and the tasks that never left the array's pending record as one record, 625_[2-5] as sacct prints it
    rest = [r for r in client.sacct(ids) if r.id.task_id is None]
    assert all(r.id.task_ranges and r.state.name == "CANCELLED" and r.elapsed_s == 0 for r in rest), [(r.id.raw, str(r.state)) for r in rest]
    assert all(r.alloc_tres.get("gres/gpu") == 1.0 for r in ran), [(r.id.raw, r.start, r.end, r.elapsed_s, dict(r.alloc_tres)) for r in ran]


def _relayed_runs(home_dir: Path, env: dict[str, str], keys: list[str]) -> list[dict]:
    """One relayed run per key, to the end: every run worker exits 0, each partition materializes once with its
    task's metadata (from a task with no DAGSTER_HOME), and each run's relay report says one materialization.
    Returns the reports (slurm_helpers.relay_reports)."""
    import dagster as dg

    codes = H.wait_all(H.start_runs(env, keys), 600)
    assert codes == [0] * len(keys), f"run workers exited {codes}; logs in {home_dir}\n{H.explain_failures(home_dir, keys, codes)}"
    mats = _materializations(keys)
    assert all(len(mats[k]) == 1 and mats[k][0]["test/partition_key"] == k for k in keys), mats
    assert {mats[k][0]["test/dagster_home"] for k in keys} == {"/nonexistent/dagster-home"}
    with dg.DagsterInstance.get() as instance:
        reports = H.relay_reports(instance, [r.run_id for r in instance.get_runs()])
    assert len(reports) == len(keys) and all(r["dagster_gpu/relay_materializations"] == 1 for r in reports), reports
    return reports


@H.on_slurm("24.11")
def test_relayed_events_over_slurmrestd_the_tasks_never_open_the_instance(rest_home, monkeypatch):
    """``events: relay`` with ``transport: rest``: the tasks load a wrong database password after the real one and
    no DAGSTER_HOME (slurm_helpers.no_database_env); each run's events come back through its channel in the
    spool both sides see, and each partition materializes once with its task's metadata."""
    home_dir, env, token = rest_home
    for k, v in H.no_database_env(home_dir).items():
        env[k] = v
        monkeypatch.setenv(k, v)
    keys = [f"p{i:03d}" for i in range(30, 34)]
    reports = _relayed_runs(home_dir, env, keys)
    spool = Path(env["DAGSTER_GPU_SLURM_SPOOL"])
    assert {r["dagster_gpu/relay_channel"] for r in reports} == {str(p) for p in (spool / "relay").rglob("*.jsonl")}
    obs = _wait_for(lambda: _all_observed(keys), 90, what="sacct observations")
    assert all(obs[k][0]["bill/source"] == "sacct" for k in keys)


@H.on_slurm("24.11")
def test_a_launch_under_an_expired_token_waits_for_its_renewal_and_submits_once(rest_home):
    """The token file holds an expired token when the run's step is launched and a renewed one a few seconds
    later (what a cron renewing it does): the launch logs once that it waits (naming the file and the expiry,
    never the token), then one job array is submitted and the step succeeds."""
    import time

    from dagster_gpu.slurm.rest import token_expiry

    home_dir, env, token = rest_home
    R.write_token(token, 1)
    stale = token.read_text().strip().removeprefix("SLURM_JWT=")
    while token_expiry(stale) > time.time() - 1:
        time.sleep(0.2)
    key = "p040"
    procs = H.start_runs(env, [key])
    log = home_dir / "run-000.log"
    waiting = _wait_for(lambda: "waiting up to" in log.read_text(errors="replace"), 120, 0.5, "the launch to wait for the token")
    assert waiting and procs[0].poll() is None
    time.sleep(3)
    assert H.spool_batches(Path(env["DAGSTER_GPU_SLURM_SPOOL"])) == []  # nothing submitted under the expired token
    R.write_token(token, 3600)
    fresh = token.read_text().strip().removeprefix("SLURM_JWT=")
    codes = H.wait_all(procs, 300)
    assert codes == [0], f"run worker exited {codes}; logs in {home_dir}\n{H.explain_failures(home_dir, [key], codes)}"
    batches = H.spool_batches(Path(env["DAGSTER_GPU_SLURM_SPOOL"]))
    assert [b["tasks"] for b in batches] == [1]
    mats = _materializations([key])
    assert len(mats[key]) == 1 and mats[key][0]["slurm/array_job_id"] == batches[0]["array_job_id"]
    text = log.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if "waiting up to" in ln]
    assert len(lines) == 1 and f"token file {token}" in lines[0] and "expired at" in lines[0], lines
    assert stale not in text and fresh not in text and stale.split(".")[1] not in text
    client = RestSlurmClient(url=R.URL, user="root", tokens=TokenSource(file=str(token)))
    assert [r.state.name for r in client.sacct([batches[0]["array_job_id"]])] == ["COMPLETED"]


@H.on_slurm("24.11")
def test_relayed_events_through_an_object_store_channel_over_slurmrestd(rest_home, s3, monkeypatch):
    """``events: relay`` with ``relay_url`` on moto's S3 (the session's ``s3`` endpoint) and ``transport: rest``: the
    tasks write their channels as parts under the prefix, never into the spool's relay directory, and each
    partition materializes once with its task's metadata. The compute nodes get their S3 credentials from the
    0600 env_files file (a job's environment from slurmrestd never holds a *SECRET* name); the run workers from
    their own environment. Neither the spool's files nor the task logs hold the secret."""
    import uuid

    home_dir, env, token = rest_home
    secret = f"relay-e2e-{uuid.uuid4().hex}"  # moto takes any key; a unique one can be searched for
    creds = {"AWS_ACCESS_KEY_ID": "relay-e2e", "AWS_SECRET_ACCESS_KEY": secret, "AWS_DEFAULT_REGION": "us-east-1"}
    with open(env["DGPU_TEST_ENV_FILE"], "a") as f:
        f.writelines(f"{k}={v}\n" for k, v in creds.items())
    prefix = f"relay/{uuid.uuid4().hex}"
    env.update({**H.no_database_env(home_dir), **creds, "DGPU_TEST_RELAY_URL": f"s3://{s3.bucket('relay-e2e')}/{prefix}",
                "DGPU_TEST_RELAY_ENDPOINT": s3.endpoint})
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    keys = [f"p{i:03d}" for i in range(44, 47)]
    reports = _relayed_runs(home_dir, env, keys)
    everything = [o["Key"] for o in s3.client.list_objects_v2(Bucket="relay-e2e", Prefix=prefix + "/")["Contents"]]
    # with relay_url nothing is shared: beside the channels, each job array's manifest and each task's shipped log
    # (tests/test_slurm_rest_noshare_e2e.py)
    listed = [k for k in everything if not k.startswith(f"{prefix}/batches/")]
    shipped = [k for k in everything if k.startswith(f"{prefix}/batches/")]
    assert all(re.fullmatch(rf"{prefix}/batches/[^/]+/(manifest\.json|\d+\.log/\d{{8}}\.log)", k) for k in shipped), shipped
    assert len({k.rsplit("/", 1)[0] for k in shipped if k.endswith(".log")}) == len(keys), shipped
    channels = {f"s3://relay-e2e/{k.rsplit('/', 1)[0]}" for k in listed}
    assert {r["dagster_gpu/relay_channel"] for r in reports} == channels and len(channels) == len(keys), listed
    assert all(re.fullmatch(rf"{prefix}/[A-Za-z0-9-]+/[0-9a-f]{{20}}/\d{{8}}\.jsonl", k) for k in listed), listed
    spool = Path(env["DAGSTER_GPU_SLURM_SPOOL"])
    assert not (spool / "relay").exists() or not any(p.is_file() for p in (spool / "relay").rglob("*"))
    leaked = [str(p) for p in spool.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert leaked == [], f"the S3 secret is in {leaked}"
    delays = sorted(r["dagster_gpu/relay_delay_max_s"] for r in reports)
    p50s = sorted(r["dagster_gpu/relay_delay_p50_s"] for r in reports)
    print(f"relay through S3: materializations stored {p50s} s (p50 per run), {delays} s (max per run) after the "
          "tasks wrote them")
    assert delays[-1] < 10.0, delays  # the run worker's slowest read gap is 8 s; a part lands within 0.2 s
    obs = _wait_for(lambda: _all_observed(keys), 90, what="sacct observations")
    assert all(obs[k][0]["bill/source"] == "sacct" for k in keys)
