"""Test infrastructure: Dagster's DefaultRunLauncher plus ``resume_run``, so a local instance may set
``run_monitoring.max_resume_run_attempts`` > 0 as a Kubernetes/ECS deployment does (Dagster refuses that
setting with a launcher that cannot resume). A resume runs ``dagster api resume_run`` in a new process,
exactly what tests/resume_helpers.py runs by hand."""

from __future__ import annotations

import subprocess
import sys

from dagster._core.launcher.base import ResumeRunContext
from dagster._core.launcher.default_run_launcher import DefaultRunLauncher
from dagster._grpc.types import ResumeRunArgs


class ResumableRunLauncher(DefaultRunLauncher):
    @property
    def supports_resume_run(self) -> bool:
        return True

    def resume_run(self, context: ResumeRunContext) -> None:
        run = context.dagster_run
        argv = ResumeRunArgs(job_origin=run.job_code_origin, run_id=run.run_id, instance_ref=self._instance.get_ref(),
                             set_exit_code_on_failure=True).get_command_args()  # fmt: skip
        subprocess.Popen([sys.executable, "-m", "dagster", *argv[1:]], start_new_session=True)
