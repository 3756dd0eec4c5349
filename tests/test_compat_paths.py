"""Command lines written by an earlier version still run after an upgrade.

A worker's command line outlives the process that wrote it: a local worker runs under
``python -m dagster_gpu.worker.supervise`` (the supervisor's path before it moved beside the local backend,
``dagster_gpu/local/supervise.py``), and a Slurm array task submitted before an upgrade runs the manifest it
was given, whose entries name ``requeue_module: dagster_gpu.slurm.requeue`` for a requeued attempt. Each test
runs such a command line as the earlier version wrote it, to completion, against the installed package.
docs/architecture.md lists the compatibility shims these paths rely on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dagster import DagsterEvent, DagsterInstance, job, op, reconstructable
from dagster._core.events import StepSuccessData
from dagster._grpc.types import ExecuteStepArgs

from dagster_gpu.instance.step_args import ENV_VAR, encode_step_args
from dagster_gpu.local.supervise import read_status
from dagster_gpu.slurm.script import RUNNER, write_job_script, write_manifest

PY = sys.executable


@op
def noop():
    return None


@job
def noop_job():
    noop()


def test_a_local_worker_command_of_an_earlier_version_runs_under_the_supervisor(tmp_path):
    """The argv the local backend wrote before the supervisor moved: the child runs, its exit code and the
    supervisor's message land in the status file the backend reads, and the exit code passes through."""
    status, marker = tmp_path / "status.json", tmp_path / "ran"
    child = [PY, "-c", "import sys; open(sys.argv[1], 'w').write('ran'); sys.exit(3)", str(marker)]
    cp = subprocess.run([PY, "-m", "dagster_gpu.worker.supervise", "--status-file", str(status), "--", *child],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 3, cp.stderr
    assert marker.read_text() == "ran"
    st = read_status(status)
    assert (st["exit_code"], st["message"]) == (3, "worker exited with code 3")
    assert st["started"] <= st["finished"]


def _old_manifest(tmp_path: Path, instance: DagsterInstance, run_id: str, marker: Path) -> Path:
    """A manifest as the Slurm backend of the earlier version wrote it: its entry names the requeue module by
    its dotted path and carries the compressed step args of a run in ``instance``."""
    args = ExecuteStepArgs(job_origin=reconstructable(noop_job).get_python_origin(), run_id=run_id,
                           step_keys_to_execute=["noop"], instance_ref=instance.get_ref())
    argv = [PY, "-c", "import sys; open(sys.argv[1], 'w').write('ran')", str(marker)]
    entry = {"launch_id": "l1", "run_id": run_id, "step_key": "noop", "covers": "1 partition 'a'", "argv": argv,
             "env": {ENV_VAR: encode_step_args(args)}, "requeue_module": "dagster_gpu.slurm.requeue"}
    return write_manifest(tmp_path / "spool" / "manifest.json", "b1", [entry])


def _run_requeued_task(tmp_path: Path, manifest: Path) -> subprocess.CompletedProcess:
    """The real job script under bash, as slurmstepd runs a requeued array task 0 (SLURM_RESTART_COUNT=1)."""
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_JOB_ID": "77", "SLURM_RESTART_COUNT": "1"}
    cmd = ["bash", str(write_job_script(tmp_path)), PY, RUNNER, str(manifest)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def test_a_requeued_array_task_of_an_earlier_manifest_reruns_a_step_without_outcome(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "home").mkdir()
    with DagsterInstance.local_temp(str(tmp_path / "home")) as instance:
        run_id = instance.create_run_for_job(noop_job).run_id
        cp = _run_requeued_task(tmp_path, _old_manifest(tmp_path, instance, run_id, marker))
    assert cp.returncode == 0, cp.stderr
    assert "requeued attempt 1: rerunning the step" in cp.stderr
    assert marker.read_text() == "ran"


def test_a_requeued_array_task_of_an_earlier_manifest_skips_a_step_that_recorded_its_outcome(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "home").mkdir()
    with DagsterInstance.local_temp(str(tmp_path / "home")) as instance:
        run_id = instance.create_run_for_job(noop_job).run_id
        instance.report_dagster_event(
            DagsterEvent(event_type_value="STEP_SUCCESS", job_name="noop_job", step_key="noop",
                         event_specific_data=StepSuccessData(duration_ms=1.0)),
            run_id=run_id)
        cp = _run_requeued_task(tmp_path, _old_manifest(tmp_path, instance, run_id, marker))
    assert cp.returncode == 0, cp.stderr
    assert "the step already recorded its outcome; nothing to do" in cp.stderr
    assert not marker.exists()
    assert json.loads(Path(cp.args[-1]).read_text())["tasks"][0]["requeue_module"] == "dagster_gpu.slurm.requeue"
