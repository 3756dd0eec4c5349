"""gpu_executor's slurm backend with ``transport: ssh``: the main end-to-end flows of tests/test_slurm_e2e.py
with every Slurm command and every cluster-side spool file going through the test sshd (resources/ssh/sshd.sh,
127.0.0.1) to the Slurm 22.05 and 24.11 clusters, as from a Dagster host off the cluster. Counted: TCP
connections sshd accepted during the backfill (its log's "Accepted publickey" lines). The 24.11 cluster's
commands are wrappers into its chroot (resources/slurm/trixie.sh) that a non-interactive login shell does not
have on PATH, as on a site that installs Slurm under /opt: the slurm section names them with ``slurm_bin_dir``.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from dagster_gpu.slurm import ssh_command as C
from tests import slurm_helpers as H
from tests import ssh_helpers as SSH
from tests.test_slurm_e2e import H_WEIRD, _all_observed, _materializations, _wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.e2e, pytest.mark.postgres]


@pytest.fixture
def ssh_home(slurm_cluster, monkeypatch):
    reason = H.postgres_unavailable_reason()
    if reason:
        pytest.skip(reason)
    sshd = SSH.sshd_env()
    if sshd is None:
        pytest.skip("the test sshd did not start (resources/ssh/sshd.sh start; openssh-server from scripts/test.sh)")
    home, env = H.make_dagster_home()
    ctl = SSH.short_dir("dgs-ctl-")
    extra = {**sshd, "DGPU_TEST_SLURM_TRANSPORT": "ssh", "DGPU_TEST_SSH_CONTROL_DIR": ctl,
             "DGPU_TEST_REMOTE_SPOOL": str(home / "cluster-spool")}  # fmt: skip
    if slurm_cluster.bin_dir:  # the login shell's PATH has only the host's own Slurm (22.05)
        extra["DGPU_TEST_SLURM_BIN_DIR"] = str(slurm_cluster.bin_dir)
        # and the run worker's has none of 24.11's: a command that bypassed the transport would fail
        extra["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != str(slurm_cluster.bin_dir))
    env.update(extra)
    for k, v in env.items():
        if os.environ.get(k) != v:
            monkeypatch.setenv(k, v)
    socket = C.control_path(SSH.target(sshd), ctl)
    yield home, env, sshd, socket
    subprocess.run(["ssh", "-O", "exit", "-S", socket, "dagster-gpu-test"], capture_output=True)


def _check_runs(home_dir, env, keys, procs, timeout_s=900):
    codes = H.wait_all(procs, timeout_s)
    assert codes == [0] * len(keys), f"run workers exited {codes}; logs in {home_dir}\n{H.explain_failures(home_dir, keys, codes)}"
    mats = _materializations(keys)
    for k in keys:
        assert len(mats[k]) == 1, f"{k!r} materialized {len(mats[k])} times"
        assert mats[k][0]["test/partition_key"] == k
    return mats


def test_eight_runs_over_ssh_share_one_sbatch_and_one_connection(ssh_home):
    home_dir, env, sshd, socket = ssh_home
    keys = [f"p{i:03d}" for i in range(7)] + [H_WEIRD]
    pwned = Path("/tmp/pwned")
    pwned.unlink(missing_ok=True)
    before = SSH.logins(sshd)
    mats = _check_runs(home_dir, env, keys, H.start_runs(env, keys))
    batches = H.spool_batches(Path(env["DAGSTER_GPU_SLURM_SPOOL"]))
    assert 1 <= len(batches) <= 2 and sum(b["tasks"] for b in batches) == 8
    for k in keys:
        assert mats[k][0]["slurm/array_job_id"] in {b["array_job_id"] for b in batches}
    assert not pwned.exists(), "a partition key reached a shell"
    # the cluster side: manifests and the tasks' logs in the remote spool, 0600 under 0700 directories
    remote = Path(env["DGPU_TEST_REMOTE_SPOOL"])
    files = [p for b in batches for p in (remote / "batches" / b["batch"]).iterdir()]
    assert {p.name for p in files} >= {"manifest.json", "0.out"}
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {"0o600"}
    assert {oct(d.stat().st_mode & 0o777) for d in (remote, remote / "batches", remote / "runner")} == {"0o700"}
    # the bills came from sacct over the same connection
    obs = _wait_for(lambda: _all_observed(keys), 60, what="sacct observations")
    assert all(obs[k][0]["bill/source"] == "sacct" and obs[k][0]["slurm/state"] == "COMPLETED" for k in keys)
    connections = SSH.logins(sshd) - before
    print(f"ssh transport: 8 runs, {len(batches)} sbatch, {connections} TCP connection(s) to the login node")
    assert connections == 1


@H.on_slurm("22.05")
def test_the_master_killed_mid_backfill_is_remade_and_no_step_fails(ssh_home):
    home_dir, env, sshd, socket = ssh_home
    keys = [f"p{i:03d}" for i in range(10, 16)]
    before = SSH.logins(sshd)
    procs = H.start_runs(env, keys, sleep_s=8.0)
    spool = Path(env["DAGSTER_GPU_SLURM_SPOOL"])
    # every launch submitted (its task is pending or running on the cluster), none finished yet
    _wait_for(lambda: sum(b["tasks"] for b in H.spool_batches(spool)) == len(keys) or None, 600, 0.2, what="all launches submitted")
    assert all(p.poll() is None for p in procs)
    cp = subprocess.run(["ssh", "-O", "exit", "-S", socket, "dagster-gpu-test"], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr
    killed_at = time.time()
    _check_runs(home_dir, env, keys, procs)
    connections = SSH.logins(sshd) - before
    print(f"ssh transport: master killed {killed_at:.0f}; {connections} TCP connection(s) for the backfill")
    assert connections == 2  # the first master and the one re-made; no command opened its own


def test_relayed_events_come_back_over_the_same_connection_and_the_tasks_never_open_the_instance(ssh_home, monkeypatch):
    """``events: relay`` over ssh: the tasks load a wrong database password and no DAGSTER_HOME (slurm_helpers.
    no_database_env); their events reach the instance through channels in the cluster's spool, read over the one
    master; every run succeeds with one materialization per partition, and sacct bills each."""
    import dagster as dg

    home_dir, env, sshd, socket = ssh_home
    for k, v in H.no_database_env(home_dir).items():
        env[k] = v
        monkeypatch.setenv(k, v)
    keys = [f"p{i:03d}" for i in range(20, 26)]
    before = SSH.logins(sshd)
    mats = _check_runs(home_dir, env, keys, H.start_runs(env, keys))
    assert {mats[k][0]["test/dagster_home"] for k in keys} == {"/nonexistent/dagster-home"}
    remote = Path(env["DGPU_TEST_REMOTE_SPOOL"])
    channels = sorted((remote / "relay").rglob("*.jsonl"))
    assert len(channels) == len(keys) and {oct(p.stat().st_mode & 0o777) for p in channels} == {"0o600"}
    with dg.DagsterInstance.get() as instance:
        runs = [r.run_id for r in instance.get_runs()]
        reports = H.relay_reports(instance, runs)
    assert len(runs) == len(reports) == len(keys), reports
    assert all(r["dagster_gpu/relay_materializations"] == 1 and r["dagster_gpu/relay_bad_lines"] == 0 for r in reports)
    assert {r["dagster_gpu/relay_channel"] for r in reports} == {str(p) for p in channels}
    obs = _wait_for(lambda: _all_observed(keys), 60, what="sacct observations")
    assert all(obs[k][0]["bill/source"] == "sacct" for k in keys)
    delays = sorted(r["dagster_gpu/relay_delay_p50_s"] for r in reports)
    connections = SSH.logins(sshd) - before
    print(f"relay over ssh: {len(keys)} runs, delays {delays} s, {connections} TCP connection(s)")
    assert connections == 1
