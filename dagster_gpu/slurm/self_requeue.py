"""An array task that stopped on the warning signal it asked for requeues itself (stdlib only).

The executor's ``slurm.signal_lead_seconds`` submits each job array with ``--signal=B:USR1@<s>``: the worker
gets SIGUSR1 ``<s>`` seconds before its time limit and, where the site sets ``PreemptParameters=
send_user_signal`` (24.11; ``SlurmctldParameters=preempt_send_user_signal`` in 22.05), as soon as a preempting
QOS chooses it. The worker then commits its checkpoint and exits 143. What Slurm does with a job that ended by
itself differs by version (measured on the test clusters, tests/test_slurm_preempt_e2e.py): 24.11 requeues a
preempted job that ended inside its GraceTime ("requeue ... per user/system request"); 22.05 records it FAILED
and never runs it again, and no version requeues a job that stopped before its time limit. So the worker asks
for the requeue itself: ``scontrol requeue <job>``, which Slurm allows the job's owner (job_mgr.c ``_job_requeue_op``). On
24.11 a preempted task that asks is at times requeued once more after it completed (measured in 3 of 4 runs:
PREEMPTED, PREEMPTED, PENDING); that attempt finds the step's outcome and exits at once (:mod:`dagster_gpu.slurm.requeue`),
a cheaper mistake than 22.05's lost task. Only on SIGUSR1, never on SIGTERM: a SIGTERM may be a user's cancel,
which must stay one.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Callable, Mapping

#: Set to "1" in a task's environment by the Slurm backend when the job array has ``--requeue`` and a warning
#: signal (``slurm.requeue`` and ``slurm.signal_lead_seconds``).
ENV_VAR = "DAGSTER_GPU_SLURM_REQUEUE_ON_WARNING"


def task_job_id(env: Mapping[str, str]) -> str | None:
    """``<array job id>_<task id>`` of the array task this process runs in (``SLURM_JOB_ID`` outside an array),
    None outside Slurm."""
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID") or None


def requeue_after_warning(signum: int | None, env: Mapping[str, str] | None = None,
                          run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> str | None:
    """Requeue this array task when it stopped on SIGUSR1 and its job array asked for it (:data:`ENV_VAR`);
    returns what happened in one line (for the task's log), None when nothing was asked. Never raises:
    ``scontrol`` missing, refused or slow is said, and the task exits as it would have."""
    env = os.environ if env is None else env
    if signum != signal.SIGUSR1 or env.get(ENV_VAR) != "1":
        return None
    job = task_job_id(env)
    if job is None:
        return None
    try:
        cp = run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"scontrol requeue {job} failed: {type(e).__name__}: {e}"
    if cp.returncode != 0:
        return f"scontrol requeue {job} refused (exit {cp.returncode}): {(cp.stderr or cp.stdout).strip()}"
    return f"asked Slurm to requeue {job} (stopped on its warning signal: it runs again after its checkpoint)"

