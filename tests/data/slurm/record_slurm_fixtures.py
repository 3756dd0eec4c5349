"""Re-record the Slurm outputs under tests/data/slurm/ from the local cluster (about 4 minutes).

    eval "$(resources/slurm/cluster.sh env)"; .venv/bin/python tests/data/slurm/record_slurm_fixtures.py

Uses exactly the formats of dagster_gpu.slurm.parse, so the parser tests read what the client reads.
Writes raw stdout (``*.txt``) or stderr (``*.stderr.txt``) and a ``jobs.json`` naming the job ids.
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
ACC = ["--account=research"]


def raw(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, env=C.env(), check=False)


def save(name: str, text: str) -> None:
    (OUT / name).write_text(text)
    print(f"wrote {name} ({len(text.splitlines())} lines)", file=sys.stderr)


def squeue(ids, array=True) -> str:
    argv = ["squeue", "--noheader", "--states=all", f"--jobs={','.join(map(str, ids))}", "-o", P.SQUEUE_FORMAT]
    if array:
        argv.insert(2, "--array")
    return raw(argv).stdout


def sacct(ids) -> str:
    return raw(
        ["sacct", "--parsable2", "--noheader", "--allocations", "--duplicates", "--allusers",
         f"--jobs={','.join(map(str, ids))}", "--format", P.SACCT_FORMAT]
    ).stdout  # fmt: skip


def sbatch(*opts: str, wrap: str) -> int:
    cp = raw(["sbatch", "--parsable", *ACC, f"--output={tmp}/%A_%a.out", *opts, f"--wrap={wrap}"])
    assert cp.returncode == 0, cp.stderr
    return P.parse_sbatch_parsable(cp.stdout)[0]


def wait(pred, timeout=300, poll=1.0):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(poll)
    raise TimeoutError("fixture scenario did not reach the expected state")


def states(ids) -> dict[str, str]:
    return {r.id.raw: r.state.name for r in P.parse_squeue(squeue(ids))}


tmp = tempfile.mkdtemp(prefix="slurm-fixtures-")
jobs: dict[str, int] = {}

# 1. a throttled GPU array, a sparse shard array, a failing job, a held job cancelled by root, a timeout.
jobs["array_throttled"] = sbatch("--array=0-9%2", "--gres=gpu:1", "--requeue", wrap="sleep 3")
jobs["array_sparse_shard"] = sbatch("--array=2,5,7-9", "--gres=shard:2", wrap="sleep 4")
jobs["exit3"] = sbatch("--gres=gpu:1", wrap="exit 3")
jobs["held_cancelled"] = sbatch("--gres=gpu:1", "--begin=now+600", wrap="true")
jobs["timeout"] = sbatch("--gres=shard:1", "--time=1", wrap="sleep 300")
ids1 = list(jobs.values())
time.sleep(1.5)
save("squeue_array_running.txt", squeue(ids1))
save("squeue_compact_running.txt", squeue(ids1, array=False))
raw(["scancel", str(jobs["held_cancelled"])])

# 2. an external scancel of exactly one running task.
jobs["scancel_one"] = sbatch("--array=0-2", "--gres=shard:1", wrap="sleep 8")
wait(lambda: all(s == "RUNNING" for s in states([jobs["scancel_one"]]).values()))
raw(["scancel", f"{jobs['scancel_one']}_1"])

wait(lambda: all(s not in ("PENDING", "RUNNING", "COMPLETING") for s in states(ids1[:3]).values()), 120)
save("squeue_array_done.txt", squeue(ids1 + [jobs["scancel_one"]]))

# 3. preemption: 4 normal tasks hold all GPUs, a high-QOS job preempts one, which is requeued.
jobs["preempted_array"] = sbatch("--array=0-3", "--gres=gpu:1", "--requeue", "--qos=normal", wrap="sleep 15")
wait(lambda: sum(s == "RUNNING" for s in states([jobs["preempted_array"]]).values()) == 4)
jobs["high_qos"] = sbatch("--gres=gpu:1", "--qos=high", wrap="sleep 3")
time.sleep(2)
save("squeue_preempted.txt", squeue([jobs["preempted_array"], jobs["high_qos"]]))
save("sacct_preempted_pending.txt", sacct([jobs["preempted_array"], jobs["high_qos"]]))

cp = raw(["sbatch", "--test-only", *ACC, "--gres=gpu:1", "--wrap=true"])
save("sbatch_test_only.stderr.txt", cp.stderr)
for name, opts in {
    "sbatch_reject_array": ["--array=0-1001"],
    "sbatch_reject_account": ["--account=nosuch"],
    "sbatch_reject_qos": ["--qos=nosuch"],
    "sbatch_reject_gres": ["--gres=gpu:9"],
    "sbatch_reject_partition": ["--partition=nosuch"],
}.items():
    cp = raw(["sbatch", "--parsable", *ACC, *opts, "--wrap=true"])
    assert cp.returncode != 0, name
    save(f"{name}.stderr.txt", cp.stderr)
save("scontrol_show_config.txt", raw(["scontrol", "show", "config"]).stdout)
save("sinfo_gres.txt", raw(["sinfo", "--noheader", "--Node", "-o", "%N|%G"]).stdout)

# the preempted task comes back after the requeue delay (~2 min) and completes
print("waiting for the preempted task to be requeued and complete (~2.5 min)", file=sys.stderr)
wait(lambda: all(s == "COMPLETED" for s in states([jobs["preempted_array"]]).values()), 400, 3)
all_ids = list(jobs.values())
save("squeue_all_done.txt", squeue(all_ids))
save("sacct_all.txt", sacct(all_ids))
save("sdiag.txt", raw(["sdiag"]).stdout)
(OUT / "jobs.json").write_text(json.dumps(jobs, indent=1) + "\n")
print(json.dumps(jobs), file=sys.stderr)
