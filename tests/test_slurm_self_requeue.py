"""dagster_gpu.slurm.self_requeue on recorded Slurm environments: who asks for a requeue, and how failures read."""

from __future__ import annotations

import signal
import subprocess

from dagster_gpu.slurm.self_requeue import ENV_VAR, requeue_after_warning, task_job_id

TASK = {"SLURM_JOB_ID": "1061", "SLURM_ARRAY_JOB_ID": "1058", "SLURM_ARRAY_TASK_ID": "0", ENV_VAR: "1"}


def _runner(rc=0, err=""):
    calls = []

    def run(argv, **kw):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, rc, "", err)
    return run, calls


def test_only_a_warning_signal_of_a_task_that_asked_requeues_it():
    run, calls = _runner()
    assert requeue_after_warning(signal.SIGUSR1, TASK, run) == (
        "asked Slurm to requeue 1058_0 (stopped on its warning signal: it runs again after its checkpoint)")
    assert calls == [["scontrol", "requeue", "1058_0"]]  # the array task, not the whole array
    # SIGTERM may be a user's cancel: never undone; a task whose array did not ask (no --requeue or no
    # warning signal), or a process outside Slurm, asks nothing
    for signum, env in ((signal.SIGTERM, TASK), (signal.SIGUSR1, {**TASK, ENV_VAR: "0"}), (signal.SIGUSR1, {ENV_VAR: "1"}),
                        (None, TASK)):
        run, calls = _runner()
        assert requeue_after_warning(signum, env, run) is None and calls == []


def test_a_refused_or_missing_scontrol_is_said_and_never_raises():
    run, _ = _runner(1, "scontrol: error: Access/permission denied for job 1058_0")
    assert requeue_after_warning(signal.SIGUSR1, TASK, run) == (
        "scontrol requeue 1058_0 refused (exit 1): scontrol: error: Access/permission denied for job 1058_0")

    def missing(argv, **kw):
        raise FileNotFoundError(2, "No such file or directory", "scontrol")
    assert requeue_after_warning(signal.SIGUSR1, TASK, missing).startswith("scontrol requeue 1058_0 failed: FileNotFoundError")
    assert task_job_id({"SLURM_JOB_ID": "77"}) == "77" and task_job_id({}) is None

