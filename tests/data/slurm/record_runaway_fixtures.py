"""Record the Slurm outputs of a runaway job: running in sacct, unknown to the controller (about 4 minutes).

It destroys the controller's job state, so run it on a private cluster, never the shared one:

    export DAGSTER_GPU_SLURM_DIR=/tmp/slurm-runaway DAGSTER_GPU_SLURM_CTLD_PORT=7817 \\
        DAGSTER_GPU_SLURM_SLURMD_PORT=7818 DAGSTER_GPU_SLURM_DBD_PORT=7819 DAGSTER_GPU_SLURM_DB_PORT=3407
    bash resources/slurm/cluster.sh start && eval "$(bash resources/slurm/cluster.sh env)"
    .venv/bin/python tests/data/slurm/record_runaway_fixtures.py
    bash resources/slurm/cluster.sh stop

A held job is submitted and slurmctld's saved job state copied (it knows only that job); then one job
array of two running tasks; slurmctld is killed (SIGKILL), the copy put back and slurmctld started again:
it no longer knows the array (squeue: "Invalid job id specified"), its orphaned task processes are killed,
and slurmdbd still has both tasks RUNNING: Slurm's runaway jobs (``sacctmgr show runawayjobs``). (With no
job state at all, slurmctld would instead end every running job in accounting at start-up.) Then the
administrator's fix (``sacctmgr show runawayjobs`` answered ``y``) gives them an end. Writes
``squeue_runaway.txt`` (stdout and stderr), ``sacct_runaway.txt``, ``sacctmgr_runawayjobs.txt`` and
``sacct_runaway_fixed.txt``.

Then a new job array is running when slurmctld loses all its job state (killed, state removed, slurmctld
and slurmd started): slurmctld ends it in accounting (CANCELLED) and numbers jobs from 1 again, so after
throwaway jobs a job array of two 4-second tasks gets its id, and ``sacct --duplicates`` lists both
arrays' tasks under the same ids: ``sacct_reused_id.txt``. The ids and our submission time of the new
array (epoch seconds, after sbatch returned) go to ``runaway_jobs.json``.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dagster_gpu.slurm import parse as P
from dagster_gpu.slurm.client import SlurmClient
from dagster_gpu.slurm.status import SUBMIT_SLACK_S, acct_since

OUT = Path(__file__).resolve().parent
REPO = OUT.parents[2]
D = Path(os.environ["DAGSTER_GPU_SLURM_DIR"])  # the private cluster (see the module doc)
if D == Path("/tmp/dagster-gpu-slurm"):
    sys.exit("record_runaway_fixtures.py destroys slurmctld's job state: run it on a private cluster (module doc)")
C = SlurmClient()
tmp = tempfile.mkdtemp(prefix="slurm-runaway-fixtures-")


def raw(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, env=C.env(), input=stdin, check=False)


def save(name: str, text: str) -> None:
    (OUT / name).write_text(text)
    print(f"wrote {name} ({len(text.splitlines())} lines)", file=sys.stderr)


def squeue(aid: int) -> subprocess.CompletedProcess:
    return raw(["squeue", "--noheader", "--array", "--states=all", f"--jobs={aid}", "-o", P.SQUEUE_FORMAT])


def sacct(aid: int) -> str:
    return raw(C.sacct_argv([aid])).stdout


def wait(pred, what: str, timeout=120, poll=1.0):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(poll)
    raise TimeoutError(f"runaway scenario: {what} not reached in {timeout} s")


def lose_job_state(keep: dict[str, bytes] | None = None) -> None:
    """SIGKILL slurmctld, replace its saved job state with ``keep`` (file name -> bytes; none: no state),
    start it again with slurmd (``cluster.sh restart``): a slurmd that remembers job ids the controller
    hands out again drains the node ("Duplicate jobid")."""
    pid = int((D / "run" / "slurmctld.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    wait(lambda: not Path(f"/proc/{pid}").exists(), "slurmctld gone", 30, 0.1)
    for f in glob.glob(str(state / "job_state*")):
        os.unlink(f)
    for name, data in (keep or {}).items():
        (state / name).write_bytes(data)
    subprocess.run(["bash", str(REPO / "resources/slurm/cluster.sh"), "restart"], check=True)


state = D / "state"
held = raw(["sbatch", "--parsable", "--account=research", "--hold", "--output=/dev/null", "--wrap=true"])
assert held.returncode == 0, held.stderr
wait(lambda: (state / "job_state").exists() and time.time() - (state / "job_state").stat().st_mtime > 2, "job state saved", 60)
saved = {Path(f).name: Path(f).read_bytes() for f in glob.glob(str(state / "job_state*"))}
cp = raw(["sbatch", "--parsable", "--account=research", f"--output={tmp}/%A_%a.out", "--array=0-1", "--gres=gpu:1",
          "--job-name=runaway-fixture", "--wrap=sleep 317"])
assert cp.returncode == 0, cp.stderr
first_submitted_at = time.time()
aid = P.parse_sbatch_parsable(cp.stdout)[0]
wait(lambda: [r.state.name for r in P.parse_squeue(squeue(aid).stdout)] == ["RUNNING", "RUNNING"], "2 tasks RUNNING")
wait(lambda: [r.state.name for r in P.parse_sacct(sacct(aid))] == ["RUNNING", "RUNNING"], "sacct RUNNING")

lose_job_state(keep=saved)
wait(lambda: "Invalid job id" in squeue(aid).stderr, "squeue forgets the array", 60)
# slurmd kills a task the controller does not know when it next registers; do not wait for it
subprocess.run(["pkill", "-f", "sleep 317"], check=False)
time.sleep(2)
q = squeue(aid)
save("squeue_runaway.txt", q.stdout + q.stderr)
save("sacct_runaway.txt", sacct(aid))
runaway = raw(["sacctmgr", "show", "runawayjobs"], stdin="n\n")
save("sacctmgr_runawayjobs.txt", runaway.stdout)
fixed = raw(["sacctmgr", "show", "runawayjobs"], stdin="y\n")
assert fixed.returncode == 0, fixed.stderr
wait(lambda: all(r.state.final for r in P.parse_sacct(sacct(aid))), "sacct final after the fix", 60)
save("sacct_runaway_fixed.txt", sacct(aid))
raw(["scancel", str(P.parse_sbatch_parsable(held.stdout)[0])])


# An array running when slurmctld loses all its job state: at start-up slurmctld ends it in accounting
# (CANCELLED, with the time it ran) and numbers jobs from 1 again; throwaway jobs take the ids below it.
cp = raw(["sbatch", "--parsable", "--account=research", f"--output={tmp}/%A_%a.out", "--array=0-1", "--gres=gpu:1",
          "--job-name=flushed-fixture", "--wrap=sleep 317"])
flushed, flushed_submitted_at = P.parse_sbatch_parsable(cp.stdout)[0], time.time()
wait(lambda: [r.state.name for r in P.parse_sacct(sacct(flushed)) if r.name == "flushed-fixture"] == ["RUNNING"] * 2,
     "sacct RUNNING")
time.sleep(5)
lose_job_state()
subprocess.run(["pkill", "-f", "sleep 317"], check=False)
jid = 0
while jid < flushed - 1:
    jid = P.parse_sbatch_parsable(raw(["sbatch", "--parsable", "--account=research", "--output=/dev/null", "--wrap=true"]).stdout)[0]
assert jid == flushed - 1, (jid, flushed)
time.sleep(max(0.0, flushed_submitted_at + SUBMIT_SLACK_S + 10 - time.time()))  # the old records lie outside the slack
again = raw(["sbatch", "--parsable", "--account=research", f"--output={tmp}/%A_%a.out", "--array=0-1", "--gres=gpu:1",
             "--job-name=reused-id-fixture", "--wrap=sleep 4"])
submitted_at = time.time()
assert P.parse_sbatch_parsable(again.stdout)[0] == flushed, again.stdout + again.stderr
wait(lambda: sum(r.state.final for r in acct_since(P.parse_sacct(sacct(flushed)), submitted_at)) == 2, "new array final")
save("sacct_reused_id.txt", sacct(flushed))
save("runaway_jobs.json", json.dumps({"runaway_array": aid, "reused_array": flushed, "reused_id_submitted_at": submitted_at},
                                     indent=1) + "\n")
