"""Nothing shared: gpu_executor's slurm backend with ``transport: rest`` and ``events: relay`` + ``relay_url`` on the
real Slurm 24.11 cluster (resources/slurm/trixie.sh) through slurmrestd, with the Dagster host's spool where the
compute side cannot see it (tests/noshare_helpers.py: ``trixie.sh mask-noshare``), and channels, manifests and task
logs on the session's moto S3 endpoint. Each materialization says whether its task saw the spool's path.

What it relies on of Slurm: slurmrestd's ``job/submit`` takes the job script's text and argv in the request
(``job.script``, ``job.argv``; slurm.schedmd.com/rest_api.html, Slurm 24.11's v0.0.42 job_desc_msg) and stores the
script for slurmd (``slurmd/slurmd/req.c`` writes it as the batch step's ``slurm_script``), so no file of this host
travels; a job's environment holds only what the request lists (``job.environment``), so the tasks' S3 credentials
come from the 0600 env_files file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests import noshare_helpers as N
from tests import slurm_helpers as H
from tests.test_slurm_e2e import _all_observed, _materializations, _wait_for
from tests.test_slurm_rest_e2e import rest_home  # noqa: F401 - the fixture

pytestmark = [pytest.mark.slurm, pytest.mark.e2e, pytest.mark.postgres]

BUCKET = "noshare-e2e"


def _step_failures(instance, key: str) -> list[str]:
    import dagster as dg
    from dagster._core.storage.dagster_run import RunsFilter

    out = []
    for run in instance.get_runs(RunsFilter(tags={"dagster/partition": key})):
        for r in instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE).records:
            err = r.event_log_entry.dagster_event.step_failure_data.error
            out.append(f"{r.event_log_entry.message or ''} {err.to_string() if err else ''}")
    return out


@H.on_slurm("24.11")
def test_a_backfill_with_nothing_shared_and_a_crashed_partition_s_log_tail(rest_home, s3, monkeypatch):  # noqa: F811
    import dagster as dg

    home_dir, env, token = rest_home
    env, creds, prefix = N.noshare_env(env, home_dir, s3.endpoint, s3.bucket(BUCKET))
    crash = "p063"
    env["DGPU_TEST_CRASH"] = crash
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    spool = Path(env["DAGSTER_GPU_SLURM_SPOOL"])
    ok_keys = [f"p{i:03d}" for i in range(60, 63)]
    keys = [*ok_keys, crash]
    codes = H.wait_all(H.start_runs(env, keys), 600)
    assert codes[:3] == [0, 0, 0] and codes[3] != 0, \
        f"run workers exited {codes}; logs in {home_dir}\n{H.explain_failures(home_dir, keys, codes)}"
    # every partition ran on the cluster, where the host's spool does not exist
    mats = _materializations(ok_keys)
    for k in ok_keys:
        assert len(mats[k]) == 1 and mats[k][0]["test/partition_key"] == k, mats
        assert mats[k][0]["test/host_spool_visible"] is False and mats[k][0]["test/dagster_home"] == "/nonexistent/dagster-home"
    batches = H.spool_batches(spool)
    assert sum(b["tasks"] for b in batches) == 4
    # the manifest went to the store once per job array, the logs beside it; the tasks wrote nothing into the spool
    listed = [o["Key"] for o in s3.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")["Contents"]]
    manifests = sorted(k for k in listed if k.endswith("/manifest.json"))
    assert manifests == sorted(f"{prefix}/batches/{b['batch']}/manifest.json" for b in batches), listed
    logs = {k.rsplit("/", 1)[0] for k in listed if re.fullmatch(rf"{prefix}/batches/[^/]+/\d+\.log/\d{{8}}\.log", k)}
    assert len(logs) == 4, listed
    assert not (spool / "relay").exists() and not list(spool.rglob("*.out"))
    # the crashed partition's step failure carries the last lines of its shipped log
    with dg.DagsterInstance.get() as instance:
        failures = _step_failures(instance, crash)
    assert any(f"partition {crash} crashes here with exit 7" in f and f"s3://{BUCKET}/{prefix}/batches/" in f
               for f in failures), failures
    # no secret in the job script, the manifests or a log: the S3 secret, the database password, the JWT
    secrets = [creds["AWS_SECRET_ACCESS_KEY"], env["DAGSTER_PG_PASSWORD"], token.read_text().strip().removeprefix("SLURM_JWT=")]
    texts = {k: s3.client.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in listed}
    texts.update({str(p): p.read_bytes() for p in spool.rglob("*") if p.is_file() and p.suffix in (".sh", ".json")})
    assert any(p.endswith("dagster-gpu-array-noshare.sh") for p in texts)
    leaked = [(name, i) for name, data in texts.items() for i, s in enumerate(secrets) if s.encode() in data]
    assert leaked == [], f"secrets (0: S3, 1: database, 2: JWT) in {leaked}"
    # bills from slurmdbd's records, through slurmrestd, with the host's copy of the manifest
    obs = _wait_for(lambda: _all_observed(ok_keys), 90, what="sacct observations")
    assert all(obs[k][0]["bill/source"] == "sacct" and obs[k][0]["slurm/state"] == "COMPLETED" for k in ok_keys), obs


@H.on_slurm("24.11")
def test_a_preempted_task_with_nothing_shared_is_requeued_and_its_log_continues(rest_home, s3, monkeypatch):  # noqa: F811
    """A task in the ``preemptible`` QOS (GraceTime=20, PreemptMode=requeue: resources/lib/slurm_cluster.sh) with
    ``signal_lead_seconds`` is preempted by a ``high`` job: slurmctld sends SIGUSR1 to the batch shell, which is
    the task runner here (``sbatch --signal=B:USR1@<s>`` with ``PreemptParameters=send_user_signal``:
    slurm.schedmd.com/slurm.conf.html), the runner forwards it to the worker, which stops gracefully; 24.11 requeues
    the job (tests/test_slurm_preempt_e2e.py measured it), and the requeued attempt fetches the same manifest, finds no
    outcome in the channel on S3, runs the step again and continues the log after the first attempt's parts."""
    import subprocess
    import tempfile
    import time

    from dagster_gpu.relay.objects import object_log_tail
    from dagster_gpu.slurm.rest import RestSlurmClient, TokenSource

    home_dir, env, token = rest_home
    env, _, prefix = N.noshare_env(env, home_dir, s3.endpoint, s3.bucket(BUCKET))
    pid_dir = tempfile.mkdtemp(prefix="dgpu-noshare-preempt-")  # the test's own side channel, not the product's
    key = "p070"
    # the first attempt writes <pid_dir>/p070.pid once in its body (tests/slurm_pipeline.py), where its stop path is
    # about to be installed: a signal before that would end a worker still importing Dagster
    env.update({"DGPU_TEST_GRACEFUL": "1", "SLURM_TEST_QOS": "preemptible", "DGPU_TEST_PID_DIR": pid_dir,
                "SLURM_TEST_SIGNAL_LEAD": "60", "DGPU_TEST_SLOW_FIRST": key})
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    spool = Path(env["DAGSTER_GPU_SLURM_SPOOL"])
    client = RestSlurmClient(url=env["DGPU_TEST_REST_URL"], user="root", tokens=TokenSource(file=str(token)))
    procs = H.start_runs(env, [key], sleep_s=240)

    def running():
        ids = [b["array_job_id"] for b in H.spool_batches(spool)]
        return [r for r in client.squeue(ids) if r.state.name == "RUNNING"] if ids else None

    task = _wait_for(running, 240, 1, "the array task running")[0]
    _wait_for(lambda: (Path(pid_dir) / f"{key}.pid").exists() or None, 240, 0.5, "the worker in the asset's body")
    time.sleep(1)  # its stop path installed
    cli_env = {**os.environ, **H.SLURM_24_11.env()}
    subprocess.run(["sbatch", "--parsable", "--account=research", "--qos=high", "--gres=gpu:4", "--output=/dev/null",
                    "--wrap=sleep 2"], capture_output=True, text=True, env=cli_env, check=True, timeout=60)
    marker = Path(pid_dir) / f"{key}.stopped"
    _wait_for(lambda: marker.exists() or None, 120, 0.5, "the worker's stop signal")
    assert marker.read_text().split()[0] == "10"  # SIGUSR1, forwarded by the runner
    codes = H.wait_all(procs, 600)
    assert codes == [0], f"run worker exited {codes}; logs in {home_dir}\n{H.explain_failures(home_dir, [key], codes)}"
    states = [r.state.name for r in client.sacct([task.id.job_id])]
    assert states[0] == "PREEMPTED" and len(states) >= 2, states
    mats = _materializations([key])[key]
    assert len(mats) == 1 and mats[0]["test/host_spool_visible"] is False, mats
    batch = H.spool_batches(spool)[0]["batch"]
    log = object_log_tail(f"s3://{BUCKET}/{prefix}/batches/{batch}/0.log", lines=400, max_bytes=1 << 20,
                          storage_options={"client_kwargs": {"endpoint_url": s3.endpoint}})
    attempts = [ln for ln in log.splitlines() if "_0 runs step " in ln]
    assert len(attempts) >= 2, log
