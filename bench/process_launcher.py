"""A run launcher for benchmarks: each run worker a process of its own, resumable by Dagster's run monitoring.

Dagster's DefaultRunLauncher starts a run worker inside the code server, which marks the run failed the moment that
process dies (``DagsterApiServer``: "Run execution process ... was terminated by signal 9"), and it cannot resume
a run. Where Dagster runs off the cluster it usually runs on Kubernetes, and K8sRunLauncher behaves otherwise:
the run worker is a Job's pod running ``dagster api execute_run``; when the pod dies, run monitoring
(``run_monitoring: max_resume_run_attempts``) sees the worker failed through ``check_run_worker_health`` and starts
``dagster api resume_run`` (dagster-k8s ``K8sRunLauncher``: ``supports_resume_run``, ``resume_run``,
``check_run_worker_health`` from the Job's status). :class:`ProcessRunLauncher` does the same with local processes:

- ``launch_run`` / ``resume_run``: ``python -m dagster api execute_run|resume_run <args>`` in a new session, its
  output in ``$DAGSTER_HOME/run-workers/<run id>.log``; the pid in the run's ``bench/run_worker_pid`` tag and in
  an engine event;
- ``check_run_worker_health``: RUNNING while the process lives, SUCCESS when it exited 0, FAILED otherwise (a
  SIGKILL: exit -9);
- ``terminate``: SIGTERM to the worker, as a pod deletion does.

Used by bench/remote_faults.py (``dagster.yaml``: ``run_launcher: {module: process_launcher, class:
ProcessRunLauncher}``, with bench/ on PYTHONPATH).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, ResumeRunContext, RunLauncher, WorkerStatus
from dagster._grpc.types import ExecuteRunArgs, ResumeRunArgs
from dagster._serdes import ConfigurableClass

PID_TAG = "bench/run_worker_pid"


class ProcessRunLauncher(RunLauncher, ConfigurableClass):
    def __init__(self, inst_data=None):
        self._inst_data = inst_data
        self._procs: dict[str, subprocess.Popen] = {}
        super().__init__()

    @property
    def inst_data(self):
        return self._inst_data

    @classmethod
    def config_type(cls):
        return {}

    @classmethod
    def from_config_value(cls, inst_data, config_value):
        return cls(inst_data=inst_data)

    def _start(self, run, argv: list[str], what: str) -> None:
        logs = Path(os.environ["DAGSTER_HOME"]) / "run-workers"
        logs.mkdir(exist_ok=True)
        with open(logs / f"{run.run_id}.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "dagster", *argv[1:]], stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self._procs[run.run_id] = proc
        self._instance.add_run_tags(run.run_id, {PID_TAG: str(proc.pid)})
        self._instance.report_engine_event(f"{what} (pid: {proc.pid}).", run, cls=self.__class__)

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        args = ExecuteRunArgs(job_origin=run.job_code_origin, run_id=run.run_id, instance_ref=self._instance.get_ref(),
                              set_exit_code_on_failure=True)
        self._start(run, args.get_command_args(), "Started run worker process")

    @property
    def supports_resume_run(self) -> bool:
        return True

    def resume_run(self, context: ResumeRunContext) -> None:
        run = context.dagster_run
        args = ResumeRunArgs(job_origin=run.job_code_origin, run_id=run.run_id, instance_ref=self._instance.get_ref(),
                             set_exit_code_on_failure=True)
        self._start(run, args.get_command_args(), f"Started run worker process to resume the run (attempt {context.resume_attempt_number})")

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run) -> CheckRunHealthResult:
        proc = self._procs.get(run.run_id)
        if proc is None:  # started by another process of this host: alive or not, from /proc (no exit code)
            pid = run.tags.get(PID_TAG)
            if pid is None:
                return CheckRunHealthResult(WorkerStatus.NOT_FOUND, f"run {run.run_id} has no {PID_TAG} tag")
            if _alive(int(pid)):
                return CheckRunHealthResult(WorkerStatus.RUNNING)
            return CheckRunHealthResult(WorkerStatus.FAILED, f"run worker pid {pid} is gone")
        rc = proc.poll()
        if rc is None:
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        if rc == 0:
            return CheckRunHealthResult(WorkerStatus.SUCCESS)
        return CheckRunHealthResult(WorkerStatus.FAILED, f"run worker pid {proc.pid} exited {rc}")

    def terminate(self, run_id: str) -> bool:
        """SIGTERM to the run's worker process; False when this process did not start it or it has ended."""
        proc = self._procs.get(run_id)
        run = self._instance.get_run_by_id(run_id)
        if proc is None or run is None or proc.poll() is not None:
            return False
        self._instance.report_run_canceling(run)
        os.kill(proc.pid, signal.SIGTERM)
        return True


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (/proc/<pid>/stat's state field)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
