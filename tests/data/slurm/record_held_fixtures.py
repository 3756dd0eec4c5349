"""Record the Slurm outputs of array tasks held until someone releases them (about 20 seconds).

    eval "$(resources/slurm/cluster.sh env)"; .venv/bin/python tests/data/slurm/record_held_fixtures.py

One job array of three running tasks: task 0 ``scontrol requeuehold`` (squeue: PENDING, reason "job requeued
in held state"), task 1 ``scontrol requeuehold State=SpecialExit`` (squeue: SPECIAL_EXIT), task 2
``scontrol hold`` after a plain requeue (PENDING, JobHeldAdmin). Recorded while held, then after
``scancel`` (sacct: Start ``None`` for an attempt that never started). Writes ``squeue_held.txt``,
``sacct_held.txt``, ``squeue_held_cancelled.txt``, ``sacct_held_cancelled.txt`` and ``held_jobs.json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dagster_gpu.slurm import parse as P
from dagster_gpu.slurm.client import SlurmClient

OUT = Path(__file__).resolve().parent
C = SlurmClient()
tmp = tempfile.mkdtemp(prefix="slurm-held-fixtures-")


def raw(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, env=C.env(), check=False)


def save(name: str, text: str) -> None:
    (OUT / name).write_text(text)
    print(f"wrote {name} ({len(text.splitlines())} lines)", file=sys.stderr)


def squeue(ids) -> str:
    return raw(["squeue", "--noheader", "--array", "--states=all", f"--jobs={','.join(map(str, ids))}", "-o", P.SQUEUE_FORMAT]).stdout


def sacct(ids) -> str:
    return raw(
        ["sacct", "--parsable2", "--noheader", "--allocations", "--duplicates", "--allusers",
         f"--jobs={','.join(map(str, ids))}", "--format", P.SACCT_FORMAT]
    ).stdout  # fmt: skip


def sbatch(*opts: str, wrap: str) -> int:
    cp = raw(["sbatch", "--parsable", "--account=research", f"--output={tmp}/%A_%a.out", *opts, f"--wrap={wrap}"])
    assert cp.returncode == 0, cp.stderr
    return P.parse_sbatch_parsable(cp.stdout)[0]


def states(ids) -> dict[str, str]:
    return {r.id.raw: r.state.name for r in P.parse_squeue(squeue(ids))}


def wait(pred, timeout=120, poll=1.0):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(poll)
    raise TimeoutError("fixture scenario did not reach the expected state")


aid = sbatch("--array=0-2", "--gres=gpu:1", "--requeue", "--job-name=held-fixture", wrap="sleep 120")
wait(lambda: sum(s == "RUNNING" for s in states([aid]).values()) == 3)
raw(["scontrol", "requeuehold", f"{aid}_0"])
raw(["scontrol", "requeuehold", "State=SpecialExit", f"{aid}_1"])
raw(["scontrol", "requeue", f"{aid}_2"])
time.sleep(1)
raw(["scontrol", "hold", f"{aid}_2"])
time.sleep(3)
save("squeue_held.txt", squeue([aid]))
save("sacct_held.txt", sacct([aid]))
raw(["scancel", str(aid)])
wait(lambda: all(s == "CANCELLED" for s in states([aid]).values()), 60)
save("squeue_held_cancelled.txt", squeue([aid]))
save("sacct_held_cancelled.txt", sacct([aid]))
save("held_jobs.json", json.dumps({"held_array": aid}, indent=1) + "\n")
