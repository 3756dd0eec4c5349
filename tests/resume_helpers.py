"""Shared steps of the resume tests (Slurm and Kubernetes): find a run's launch, resume the run as
Dagster's run monitoring does, and check it re-attached instead of launching the step again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def launch_handle(instance, run_id: str) -> dict | None:
    """The handle in the run's STEP_WORKER_STARTING event (None before the step was launched)."""
    from dagster._core.events import DagsterEventType

    from dagster_gpu.instance.events import HANDLE_KEY

    for rec in instance.get_records_for_run(run_id, of_type=DagsterEventType.STEP_WORKER_STARTING).records:
        md = rec.event_log_entry.dagster_event.engine_event_data.metadata
        if HANDLE_KEY in md:
            return md[HANDLE_KEY].value
    return None


def resume_and_check_reattached(instance, run, log_path: Path, env: dict[str, str] | None = None) -> None:
    """Run ``dagster api resume_run`` for ``run`` (this venv's dagster; output to ``log_path``) and assert
    the run succeeded by checking on its in-progress step, never by launching it again."""
    import dagster as dg
    from dagster._grpc.types import ResumeRunArgs

    argv = ResumeRunArgs(job_origin=run.job_code_origin, run_id=run.run_id, instance_ref=instance.get_ref()).get_command_args()
    with open(log_path, "wb") as log:  # argv: ["dagster", "api", "resume_run", ...]
        rc = subprocess.run([sys.executable, "-m", "dagster", *argv[1:]], cwd=REPO, env=env, stdout=log,
                            stderr=subprocess.STDOUT, timeout=300).returncode
    final = instance.get_run_by_id(run.run_id)
    assert rc == 0 and final.status == dg.DagsterRunStatus.SUCCESS, (rc, final.status, log_path.read_text()[-3000:])
    logs = [e.message or "" for e in instance.all_logs(run.run_id)]
    assert any("Checking on status of in-progress step" in m for m in logs)
    assert not any("Including step" in m and "in the new run" in m for m in logs), "the step was launched again"
