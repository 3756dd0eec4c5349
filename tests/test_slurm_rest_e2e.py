"""gpu_executor's slurm backend with ``transport: rest``: the main end-to-end flow of tests/test_slurm_e2e.py with
every Slurm call going to the 24.11 test cluster's slurmrestd (resources/slurm/trixie.sh: Debian trixie's
slurmrestd with auth/jwt on 127.0.0.1) as from a Dagster host with no Slurm commands: the run workers' SLURM_CONF
names no file and their PATH has no 24.11 wrappers, so a call that bypassed slurmrestd would fail. The spool is
the local one (/tmp is the same directory inside the cluster's root); the tasks read the PostgreSQL password from
an env_files file, since a job's environment from slurmrestd carries no secret.
"""

from __future__ import annotations

import os
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
        assert o["billing/source"] == "sacct" and o["slurm/state"] == "COMPLETED"
        assert o["billing/gpu_seconds"] == o["slurm/elapsed_seconds"] * 1.0 and "gres/gpu=1" in o["slurm/alloc_tres"]
    # the same tasks as slurmrestd reports them
    client = RestSlurmClient(url=R.URL, user="root", tokens=TokenSource(file=str(token)))
    acct = client.sacct([b["array_job_id"] for b in batches])
    assert sorted(r.state.name for r in acct) == ["COMPLETED"] * 8
