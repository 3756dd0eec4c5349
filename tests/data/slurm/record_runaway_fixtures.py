"""Record the Slurm outputs of a runaway job: running in sacct, unknown to the controller (about 1 minute).

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
job state at all, slurmctld would instead end every running job in accounting at start-up.) Then the administrator's fix (``sacctmgr show runawayjobs`` answered
``y``) gives them an end. Writes ``squeue_runaway.txt`` (stdout and stderr), ``sacct_runaway.txt``,
``sacctmgr_runawayjobs.txt``, ``sacct_runaway_fixed.txt`` and ``runaway_jobs.json``.
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


held = raw(["sbatch", "--parsable", "--account=research", "--hold", "--output=/dev/null", "--wrap=true"])
assert held.returncode == 0, held.stderr
state = D / "state"
wait(lambda: (state / "job_state").exists() and time.time() - (state / "job_state").stat().st_mtime > 2, "job state saved", 60)
saved = {Path(f).name: Path(f).read_bytes() for f in glob.glob(str(state / "job_state*"))}
cp = raw(["sbatch", "--parsable", "--account=research", f"--output={tmp}/%A_%a.out", "--array=0-1", "--gres=gpu:1",
          "--job-name=runaway-fixture", "--wrap=sleep 317"])
assert cp.returncode == 0, cp.stderr
aid = P.parse_sbatch_parsable(cp.stdout)[0]
wait(lambda: [r.state.name for r in P.parse_squeue(squeue(aid).stdout)] == ["RUNNING", "RUNNING"], "2 tasks RUNNING")
wait(lambda: [r.state.name for r in P.parse_sacct(sacct(aid))] == ["RUNNING", "RUNNING"], "sacct RUNNING")

ctld = int((D / "run" / "slurmctld.pid").read_text())
os.kill(ctld, signal.SIGKILL)
wait(lambda: not Path(f"/proc/{ctld}").exists(), "slurmctld gone", 30, 0.1)
for f in glob.glob(str(state / "job_state*")):
    os.unlink(f)
for name, data in saved.items():
    (state / name).write_bytes(data)
subprocess.run(["bash", str(REPO / "resources/slurm/cluster.sh"), "restart-slurmctld"], check=True)
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
save("runaway_jobs.json", json.dumps({"runaway_array": aid}, indent=1) + "\n")
raw(["scancel", str(P.parse_sbatch_parsable(held.stdout)[0])])
