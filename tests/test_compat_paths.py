"""Paths written by an earlier version still work after an upgrade, or end with a clear error.

A Slurm array task submitted before an upgrade runs the manifest it was given, whose entries name
``requeue_module: dagster_gpu.slurm.requeue`` for a requeued attempt; a code location may import
``corpus_source`` from ``dagster_gpu.instance.source_versions`` (its module before it moved to
``dagster_gpu/partitions/``). The supervisor's earlier path ``dagster_gpu.worker.supervise`` is gone: the local
backend runs the command it writes at once (a supervisor already running keeps the code it imported), so no
command line of an earlier version reaches it after an upgrade, and running it by hand names the missing module.
docs/architecture.md lists the moved modules (the package root's finder) these paths rely on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from dagster import DagsterEvent, DagsterInstance, job, op, reconstructable
from dagster._core.events import StepSuccessData
from dagster._grpc.types import ExecuteStepArgs

from dagster_gpu.instance.step_args import ENV_VAR, encode_step_args
from dagster_gpu.local import backend as local_backend
from dagster_gpu.partitions import source_versions
from dagster_gpu.slurm.script import RUNNER, write_job_script, write_manifest

PY = sys.executable


@op
def noop():
    return None


@job
def noop_job():
    noop()


def test_the_supervisors_earlier_path_ends_with_an_error_naming_it(tmp_path):
    """``python -m dagster_gpu.worker.supervise`` (the local worker's command before the supervisor moved beside the
    local backend) fails before it starts the child, naming the module; the backend's command names the new one."""
    status, marker = tmp_path / "status.json", tmp_path / "ran"
    child = [PY, "-c", "import sys; open(sys.argv[1], 'w').write('ran')", str(marker)]
    cp = subprocess.run([PY, "-m", "dagster_gpu.worker.supervise", "--status-file", str(status), "--", *child],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 1 and "No module named dagster_gpu.worker.supervise" in cp.stderr, cp.stderr
    assert not marker.exists() and not status.exists()
    assert '"-m", "dagster_gpu.local.supervise"' in (Path(local_backend.__file__)).read_text()


def test_corpus_source_imported_from_its_earlier_module_is_the_same_function_and_warns():
    with pytest.warns(DeprecationWarning, match=r"dagster_gpu.instance.source_versions is deprecated .*: use `from dagster_gpu import corpus_source`"):
        from dagster_gpu.instance.source_versions import corpus_source
    assert corpus_source is source_versions.corpus_source
    with pytest.warns(DeprecationWarning, match=r"use `from dagster_gpu.partitions.source_versions import corpus_asset_key`"):
        from dagster_gpu.instance.source_versions import corpus_asset_key
    assert corpus_asset_key(dg.AssetKey(["docs", "emb"])) == source_versions.corpus_asset_key(dg.AssetKey(["docs", "emb"]))
    with pytest.raises(ImportError):
        from dagster_gpu.instance.source_versions import no_such_name  # noqa: F401


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
