"""A task in a preemptible QOS with a GraceTime, preempted by a higher QOS on the real Slurm 22.05 and 24.11:
which signal reaches the worker and when, its graceful stop (exit 143, no step outcome), the requeue, and the
partition materialized once.

The clusters' QOS (resources/lib/slurm_cluster.sh): ``preemptible`` (GraceTime=20, PreemptMode=requeue) and
``high`` (Preempt=normal,preemptible); slurm.conf ``PreemptType=preempt/qos``, ``PreemptMode=REQUEUE``,
``KillWait=5``. The step is the test pipeline's asset with the embedding unit's stop path
(``DGPU_TEST_GRACEFUL``: dagster_gpu.worker.preemption) writing down the signal it got.
"""

from __future__ import annotations

import datetime as dt
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests import slurm_helpers as H
from tests.test_slurm_e2e import _client, _materializations, _wait_for, home  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.e2e, pytest.mark.postgres]


def _preempt_once(home_dir, env, key, signal_lead=None):
    client = _client()
    pid_dir = tempfile.mkdtemp(prefix="dgpu-preempt-")
    run_env = {**env, "DGPU_TEST_GRACEFUL": "1", "SLURM_TEST_QOS": "preemptible", "DGPU_TEST_PID_DIR": pid_dir,
               **({"SLURM_TEST_SIGNAL_LEAD": str(signal_lead)} if signal_lead else {})}
    procs = H.start_runs(run_env, [key], sleep_s=240)
    spool = Path(env["DAGSTER_GPU_SLURM_SPOOL"])

    def running():
        ids = [b["array_job_id"] for b in H.spool_batches(spool)]
        rows = [r for r in client.squeue(ids) if r.state.name == "RUNNING"] if ids else []
        return rows or None

    task = _wait_for(running, 240, 1, "the array task running")[0]
    time.sleep(3)  # the worker's Python is up and its stop path installed
    submitted = time.time()
    subprocess.run(["sbatch", "--parsable", "--account=research", "--qos=high", "--gres=gpu:4", "--output=/dev/null",
                    "--wrap=sleep 2"], capture_output=True, text=True, env=client.env(), check=True)
    marker = Path(pid_dir) / f"{key}.stopped"
    preempted_at = None  # slurmctld's PreemptTime: when it chose the task and its GraceTime started

    def stopped():
        nonlocal preempted_at
        if preempted_at is None:
            out = subprocess.run(["scontrol", "-o", "show", "job", task.id.raw], capture_output=True, text=True,
                                 env=client.env()).stdout
            m = re.search(r"\bPreemptTime=(\d{4}-\d\d-\d\dT[\d:]+)", out)
            preempted_at = dt.datetime.fromisoformat(m.group(1)).timestamp() if m else None
        return marker.exists() or None

    _wait_for(stopped, 120, 0.5, "the worker's stop signal")
    signum, at = marker.read_text().split()
    codes = H.wait_all(procs, 600)
    assert codes == [0], f"run worker exited {codes}; logs in {home_dir}\n{H.explain_failures(home_dir, [key], codes)}"
    states = [r.state.name for r in client.sacct([task.id.job_id])]
    # PreemptTime when scontrol showed it before the task ended; a task that stops at once (its warning signal)
    # may be gone first: then the preemptor's submission, which preempts in the same scheduling pass
    return int(signum), float(at) - (preempted_at or submitted), states


@H.on_slurm("22.05")
def test_without_a_warning_signal_a_batch_worker_hears_of_its_preemption_only_when_gracetime_ends(home):
    """slurmctld signals only a preempted job's steps when its GraceTime starts (preempt.c: job_signal(SIGTERM)
    with no KILL_JOB_BATCH flag); the batch script, which is our worker, gets SIGTERM when GraceTime ends
    (then SIGKILL after KillWait): measured here, so the advice of docs/how-to/sharing-gpus.md is what Slurm does."""
    home_dir, env = home
    signum, delay, states = _preempt_once(home_dir, env, "p090")
    print(f"GraceTime=20, no warning signal: signal {signum} reached the worker {delay:.1f} s after PreemptTime; sacct {states}")
    # GraceTime's end is enforced by slurmctld's periodic time-limit check (every 30 s), so 20-50 s
    assert signum == signal.SIGTERM and 18 <= delay <= 55, (signum, delay)
    assert states[0] == "PREEMPTED" and states[-1] == "COMPLETED", states
    assert len(_materializations(["p090"])["p090"]) == 1


def test_with_signal_lead_seconds_the_worker_stops_as_gracetime_starts_and_is_requeued_once(home):
    """``slurm.signal_lead_seconds`` (sbatch --signal=B:USR1@<s>) with the site's ``PreemptParameters=
    send_user_signal``: slurmctld sends SIGUSR1 to the batch script as soon as it preempts the task
    (send_job_warn_signal), so the worker commits and exits with all of GraceTime to spare; the requeued task
    materializes the partition once and sacct has both attempts."""
    home_dir, env = home
    signum, delay, states = _preempt_once(home_dir, env, "p091", signal_lead=60)
    print(f"GraceTime=20, --signal=B:USR1@60: signal {signum} reached the worker {delay:.1f} s after PreemptTime; sacct {states}")
    assert signum == signal.SIGUSR1 and delay <= 5, (signum, delay)
    # requeued and run again (22.05: only by the worker's own scontrol requeue: REQUEUED, COMPLETED). 24.11 at times
    # requeues the completed attempt once more, which sacct lists as PREEMPTED, PREEMPTED, PENDING: that third
    # attempt finds the step's outcome and exits 0 (dagster_gpu.slurm.requeue)
    assert states[0] in ("PREEMPTED", "REQUEUED") and len(states) >= 2, states
    assert len(_materializations(["p091"])["p091"]) == 1
