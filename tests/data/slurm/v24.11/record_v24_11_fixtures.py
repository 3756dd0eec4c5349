"""Record Slurm 24.11's outputs into tests/data/slurm/v24.11/ from the 24.11 cluster (about 3 minutes).

    bash resources/slurm/trixie.sh start
    eval "$(resources/slurm/trixie.sh env)"; .venv/bin/python tests/data/slurm/v24.11/record_v24_11_fixtures.py

The cluster is resources/slurm/trixie.sh's (Debian 13 trixie ``slurm-wlm`` 24.11.5, configured from the same
templates as the 22.05 one: 4 untyped GPUs, 8 shards, QOS normal/high, ``AccountingStorageTRES=gres/gpu,
gres/shard``), so these files and the 22.05 ones under ``..`` differ only by version. The same scenarios as
``../record_slurm_fixtures.py`` and ``../record_gres_fixtures.py``, with the formats the client uses
(``dagster_gpu.slurm.parse``), plus: the GRES of a running and a pending GPU job in squeue's ``%b`` and in
``sinfo -N -O``, ``sbatch --test-only`` while the GPUs are busy, and ``sacct`` with the steps' usage TRES.
Writes raw stdout (``*.txt``) or stderr (``*.stderr.txt``), ``jobs.json`` naming the job ids and
``VERSION`` (``sinfo -V``). Refuses to run against a controller that is not 24.11.
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

try:
    from dagster_gpu.slurm.gres import SINFO_NODE_FORMAT
except ImportError:  # before the GRES module existed
    SINFO_NODE_FORMAT = "NodeList:|,StateLong:|,Gres:|,GresUsed:"

OUT = Path(__file__).resolve().parent
C = SlurmClient()
ACC = ["--account=research"]
#: squeue's GRES columns: %b is tres-per-node (``gres/gpu:N`` since 23.11), then tres-per-job/-task
#: (--gpus / --gpus-per-task) and the TRES the job was allocated.
SQUEUE_GRES_FORMAT = "%i|%T|%b|tres-per-job|tres-per-task|tres-alloc"
SACCT_STEP_FORMAT = "JobID,State,ElapsedRaw,AllocTRES,TRESUsageInAve,TRESUsageInMax,TRESUsageInTot"


def raw(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, env=C.env(), check=False)


def save(name: str, text: str) -> None:
    (OUT / name).write_text(text)
    print(f"wrote {name} ({len(text.splitlines())} lines)", file=sys.stderr)


def squeue(ids, array=True, fmt=P.SQUEUE_FORMAT) -> str:
    argv = ["squeue", "--noheader", "--states=all", f"--jobs={','.join(map(str, ids))}", "-o", fmt]
    if array:
        argv.insert(2, "--array")
    return raw(argv).stdout


def squeue_gres(ids) -> str:
    # -O takes the long field names; %b's long name is tres-per-node
    fields = "JobID:|,State:|,tres-per-node:|,tres-per-job:|,tres-per-task:|,tres-alloc:"
    return raw(["squeue", "--noheader", "--array", f"--jobs={','.join(map(str, ids))}", "-O", fields]).stdout


def sacct(ids, fmt=P.SACCT_FORMAT, allocations=True) -> str:
    argv = ["sacct", "--parsable2", "--noheader", "--duplicates", "--allusers",
            f"--jobs={','.join(map(str, ids))}", "--format", fmt]  # fmt: skip
    if allocations:
        argv.insert(3, "--allocations")
    return raw(argv).stdout


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


version = raw(["sinfo", "-V"]).stdout.strip()
if not version.startswith("slurm") or " 24.11." not in f" {version.split()[-1]}":
    sys.exit(f"not a Slurm 24.11 client ({version!r}): eval \"$(resources/slurm/trixie.sh env)\" first")
if P.parse_squeue(raw(["squeue", "--noheader", "--array", "-o", P.SQUEUE_FORMAT]).stdout):
    sys.exit("the 24.11 cluster has jobs queued: record on an idle cluster")
save("VERSION", version + "\n")
tmp = tempfile.mkdtemp(prefix="slurm-fixtures-2411-")
jobs: dict[str, int] = {}

# 1. GRES in use: --gres=gpu:2 (tres-per-node), --gpus=1 (tres-per-job), a pending array that cannot start.
jobs["gres_node_running"] = sbatch("--gres=gpu:2", "--time=2", wrap="sleep 30")
jobs["gpus_job_running"] = sbatch("--gpus=1", "--time=2", wrap="sleep 30")
wait(lambda: all(s == "RUNNING" for s in states([jobs["gres_node_running"], jobs["gpus_job_running"]]).values()), 60)
jobs["gres_array_pending"] = sbatch("--array=0-1", "--gres=gpu:1", "--time=2", wrap="sleep 30")
jobs["gres_pending"] = sbatch("--gres=gpu:2", "--time=2", wrap="sleep 30")
time.sleep(2)
gres_ids = [jobs[k] for k in ("gres_node_running", "gpus_job_running", "gres_array_pending", "gres_pending")]
save("squeue_gres_busy.txt", raw(["squeue", "--noheader", f"--jobs={','.join(map(str, gres_ids))}", "-o", "%T|%b"]).stdout)
save("squeue_gres_busy_array.txt", raw(["squeue", "--noheader", "--array", "-t", "RUNNING,PENDING", "-o", "%T|%b"]).stdout)
save("squeue_gres_fields.txt", squeue_gres(gres_ids))
save("squeue_gres_busy_full.txt", squeue(gres_ids))
save("sinfo_gres_used_busy.txt", raw(["sinfo", "--noheader", "--Node", "-O", SINFO_NODE_FORMAT]).stdout)
save("sinfo_node_host_gres_used.txt", raw(["sinfo", "--noheader", "-N", "-O", "NodeHost:|,GresUsed:|,StateLong:"]).stdout)
cp = raw(["sbatch", "--test-only", *ACC, "--gres=gpu:2", "--time=2", "--wrap=true"])
save("sbatch_test_only_busy.stderr.txt", cp.stderr)
raw(["scancel", *map(str, gres_ids)])
wait(lambda: not P.parse_squeue(raw(["squeue", "--noheader", "--array", "-o", P.SQUEUE_FORMAT]).stdout), 60)

# 2. as ../record_slurm_fixtures.py: a throttled GPU array, a sparse shard array, a failing job, a held job
#    cancelled by root, a timeout.
jobs["array_throttled"] = sbatch("--array=0-9%2", "--gres=gpu:1", "--requeue", wrap="sleep 3")
jobs["array_sparse_shard"] = sbatch("--array=2,5,7-9", "--gres=shard:2", wrap="sleep 4")
jobs["exit3"] = sbatch("--gres=gpu:1", wrap="exit 3")
jobs["held_cancelled"] = sbatch("--gres=gpu:1", "--begin=now+600", wrap="true")
jobs["timeout"] = sbatch("--gres=shard:1", "--time=1", wrap="sleep 300")
ids1 = [jobs[k] for k in ("array_throttled", "array_sparse_shard", "exit3", "held_cancelled", "timeout")]
time.sleep(1.5)
save("squeue_array_running.txt", squeue(ids1))
save("squeue_compact_running.txt", squeue(ids1, array=False))
raw(["scancel", str(jobs["held_cancelled"])])

# 3. an external scancel of exactly one running task.
jobs["scancel_one"] = sbatch("--array=0-2", "--gres=shard:1", wrap="sleep 8")
wait(lambda: all(s == "RUNNING" for s in states([jobs["scancel_one"]]).values()))
raw(["scancel", f"{jobs['scancel_one']}_1"])

wait(lambda: all(s not in ("PENDING", "RUNNING", "COMPLETING") for s in states(ids1[:3]).values()), 120)
save("squeue_array_done.txt", squeue(ids1 + [jobs["scancel_one"]]))

# 4. preemption: 4 normal tasks hold all GPUs, a high-QOS job preempts one, which is requeued. First the
#    timeout job must end: on 24.11 a GPU with a shard in use is not allocated as gres/gpu (recorded here:
#    with one shard:1 job running, the fourth --gres=gpu:1 job pends with reason Resources).
wait(lambda: all(s not in ("PENDING", "RUNNING", "COMPLETING") for s in states(ids1 + [jobs["scancel_one"]]).values()), 180)
jobs["preempted_array"] = sbatch("--array=0-3", "--gres=gpu:1", "--requeue", "--qos=normal", wrap="sleep 15")
wait(lambda: sum(s == "RUNNING" for s in states([jobs["preempted_array"]]).values()) == 4)
cp = raw(["sbatch", "--test-only", *ACC, "--gres=gpu:1", "--wrap=true"])
save("sbatch_test_only_all_busy.stderr.txt", cp.stderr)
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

print("waiting for the preempted task to be requeued and complete (~2.5 min)", file=sys.stderr)
wait(lambda: all(s == "COMPLETED" for s in states([jobs["preempted_array"]]).values()), 400, 3)
all_ids = list(jobs.values())
save("squeue_all_done.txt", squeue(all_ids))
time.sleep(2)  # slurmdbd receives the last records asynchronously
save("sacct_all.txt", sacct(all_ids))
save("sacct_steps.txt", sacct([jobs["array_throttled"], jobs["exit3"], jobs["gres_node_running"]], SACCT_STEP_FORMAT, allocations=False))
save("sdiag.txt", raw(["sdiag"]).stdout)
(OUT / "jobs.json").write_text(json.dumps(jobs, indent=1) + "\n")
print(json.dumps(jobs), file=sys.stderr)
