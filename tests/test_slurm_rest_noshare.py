"""Nothing shared between the Dagster host and the compute nodes (``transport: rest`` with ``relay_url``): the job
script carries the task runner (dagster_gpu/slurm/object_runner.py), the manifest is fetched from the object store
and checked, the task's log is shipped there in parts and read back for the failure message. Run here with bash and
this interpreter as an array task would be (``SLURM_ARRAY_TASK_ID`` set), on moto's S3 server (the session's ``s3``
fixture, tests/s3_helpers.py); the end-to-end flow on Slurm 24.11 is tests/test_slurm_rest_noshare_e2e.py.

slurmrestd carries the job script's text and argv in the submit request (``job.script``, ``job.argv`` of
``POST /slurm/v0.0.4x/job/submit``: slurm.schedmd.com/rest_api.html, the job_desc_msg schema of Slurm 24.11), and
no file: hence the runner in the script's text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from dagster_gpu.relay.objects import object_log_tail, put_new_object
from dagster_gpu.relay.parts import LOG_SUFFIX, next_sequence, part_name, part_sequence
from dagster_gpu.slurm import object_runner
from dagster_gpu.slurm.script import REFUSED_EXIT, trust

BUCKET = "noshare-unit"


@pytest.fixture
def store(s3, tmp_path):
    s3.bucket(BUCKET)
    prefix = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    options = {"client_kwargs": {"endpoint_url": s3.endpoint}}
    script = tmp_path / "job.sh"
    script.write_text(object_runner.job_script())
    return prefix, options, script


def _manifest(batch: str, argv: list[str], env: dict | None = None) -> bytes:
    return json.dumps({"version": 1, "batch": batch, "env_files": [],
                       "tasks": [{"launch_id": "l0", "run_id": "r0", "step_key": "s", "covers": "partition 'a'",
                                  "argv": argv, "env": env or {}}]}).encode()


def _run_task(script: Path, args: list[str], env_extra: dict | None = None, drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update({"SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "0", **(env_extra or {})})
    return subprocess.run(["bash", str(script), sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=120, cwd="/")


def test_log_part_names_are_their_own_sequence_beside_the_channel_parts():
    assert part_name(3, LOG_SUFFIX) == "00000003.log" and part_sequence("b/p/0.log/00000003.log", LOG_SUFFIX) == 3
    assert part_sequence("b/p/00000003.log") is None and part_sequence("b/p/00000003.jsonl", LOG_SUFFIX) is None
    assert next_sequence(["x/00000001.log", "x/00000002.log", "x/00000009.jsonl"], LOG_SUFFIX) == 3


def test_the_job_script_is_constant_text_with_no_step_in_it():
    text = object_runner.job_script()
    assert text == object_runner.job_script() and text.startswith("#!/bin/bash\n")
    assert text.rstrip().endswith('exec "$1" -I -c "$RUNNER" "${@:2}"')
    # under 128 KiB: the runner travels as one argv element of the interpreter (Linux MAX_ARG_STRLEN)
    assert len(text.encode()) < 128 * 1024 - 4096


def test_a_task_fetches_its_manifest_runs_the_step_and_ships_its_log(store, tmp_path):
    prefix, options, script = store
    batch = "20261207T230000-abcdef01"
    marker = tmp_path / "ran"
    code = ("import os, sys; print('step output', os.environ['STEP_VAR']); open(sys.argv[1], 'w').write(os.environ['TMPDIR']);"
            " print('the failure message', file=sys.stderr); sys.exit(4)")
    data = _manifest(batch, [sys.executable, "-c", code, str(marker)], {"STEP_VAR": "v1"})
    url = f"{prefix}/batches/{batch}/manifest.json"
    digest = put_new_object(url, data, options)
    assert digest == trust.sha256_hex(data)
    cp = _run_task(script, [url, batch, digest, json.dumps(options), "[]", f"{prefix}/batches/{batch}"])
    assert cp.returncode == 4, cp.stdout + cp.stderr
    assert "step output v1" in cp.stdout  # the node's own copy (sbatch --output)
    log = object_runner.log_prefix(f"{prefix}/batches/{batch}", 0)
    tail = object_log_tail(log, storage_options=options)
    assert tail.splitlines()[-2:] == ["step output v1", "the failure message"], tail
    assert "array task 77_0 runs step 's' of run r0 (partition 'a')" in tail
    scratch = marker.read_text()
    assert Path(scratch).name.startswith("dagster-gpu-77_0-") and not Path(scratch).exists()  # node-local, removed


def test_a_requeued_attempt_continues_the_log_after_the_earlier_parts(store):
    prefix, options, script = store
    batch = "b-requeue"
    data = _manifest(batch, [sys.executable, "-c", "print('attempt', __import__('os').environ.get('SLURM_RESTART_COUNT'))"])
    url = f"{prefix}/batches/{batch}/manifest.json"
    digest = put_new_object(url, data, options)
    args = [url, batch, digest, json.dumps(options), "[]", f"{prefix}/batches/{batch}"]
    assert _run_task(script, args, {"SLURM_RESTART_COUNT": "0"}).returncode == 0
    assert _run_task(script, args, {"SLURM_RESTART_COUNT": "1"}).returncode == 0
    tail = object_log_tail(object_runner.log_prefix(f"{prefix}/batches/{batch}", 0), lines=50, storage_options=options)
    assert [ln for ln in tail.splitlines() if ln.startswith("attempt")] == ["attempt 0", "attempt 1"]


def test_a_manifest_someone_else_wrote_under_the_prefix_is_refused(store, tmp_path):
    prefix, options, script = store
    batch = "b-forged"
    url = f"{prefix}/batches/{batch}/manifest.json"
    marker = tmp_path / "pwned"
    # someone with write access to the prefix puts their own command there first
    forged = _manifest(batch, [sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
    put_new_object(url, forged, options)
    with pytest.raises(FileExistsError, match="already exists"):
        put_new_object(url, _manifest(batch, ["true"]), options)  # the submitter never writes over it
    # and a task given the digest of the manifest the submitter meant refuses what it finds
    meant = trust.sha256_hex(_manifest(batch, ["true"]))
    cp = _run_task(script, [url, batch, meant, json.dumps(options), "[]", f"{prefix}/batches/{batch}"])
    assert cp.returncode == REFUSED_EXIT and not marker.exists()
    tail = object_log_tail(object_runner.log_prefix(f"{prefix}/batches/{batch}", 0), storage_options=options)
    assert f"refusing to start array task 77_0 from {url} (nothing was run)" in tail
    assert f"is not the {meant} recorded" in tail and "someone else wrote it under the prefix" in tail


def test_the_store_credentials_reach_the_task_through_env_files_only(store, tmp_path):
    prefix, options, script = store
    batch = "b-creds"
    secrets = tmp_path / "s3.env"
    secrets.write_text("AWS_ACCESS_KEY_ID=testing\nAWS_SECRET_ACCESS_KEY=testing\nAWS_DEFAULT_REGION=us-east-1\n")
    url = f"{prefix}/batches/{batch}/manifest.json"
    data = _manifest(batch, [sys.executable, "-c", "print('ran')"])
    digest = put_new_object(url, data, options)
    args = [url, batch, digest, json.dumps(options), json.dumps([str(secrets)]), f"{prefix}/batches/{batch}"]
    no_creds = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    isolated = {"AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
                "AWS_EC2_METADATA_DISABLED": "true"}
    secrets.chmod(0o644)  # readable by others: refused before anything is fetched
    cp = _run_task(script, args, isolated, drop=no_creds)
    assert cp.returncode == REFUSED_EXIT and f"env file {secrets}" in cp.stdout and "must be 0600" in cp.stdout
    secrets.chmod(0o600)
    cp = _run_task(script, args, isolated, drop=no_creds)
    assert cp.returncode == 0 and "ran" in cp.stdout, cp.stdout + cp.stderr
    assert "testing" not in object_runner.job_script() and str(secrets) not in object_runner.job_script()


def test_the_backend_says_at_start_what_the_compute_nodes_must_share(tmp_path, caplog):
    from dagster_gpu.slurm.backend import SlurmBackend
    from dagster_gpu.slurm.settings import SlurmSettings

    base = {"transport": "rest", "rest": {"url": "http://127.0.0.1:1"}, "spool_dir": str(tmp_path / "spool")}
    with caplog.at_level("WARNING", logger="dagster_gpu.slurm.backend"):
        shared = SlurmBackend(SlurmSettings.from_section({**base, "events": "relay"}))
    assert not shared.nothing_shared
    [warning] = [r.getMessage() for r in caplog.records if "without slurm.relay_url" in r.getMessage()]
    assert "slurm.spool_dir (the manifests, the task runner and the tasks' logs)" in warning
    assert f"at {tmp_path / 'spool'}, the same path as this host" in warning
    caplog.clear()
    with caplog.at_level("WARNING", logger="dagster_gpu.slurm.backend"):
        noshare = SlurmBackend(SlurmSettings.from_section(
            {**base, "events": "relay", "relay_url": "s3://bucket/prefix/", "env_files": ["/etc/dg/s3.env"]}))
    assert noshare.nothing_shared and not [r for r in caplog.records if "relay_url" in r.getMessage()]
    assert noshare._task_log("b1", 3) == "s3://bucket/prefix/batches/b1/3.log"
    store = noshare.coalescer.object_store
    assert (store.url, store.storage_options, store.job_script()) == ("s3://bucket/prefix", {}, object_runner.job_script())
    assert noshare.coalescer.env_files == ["/etc/dg/s3.env"]
