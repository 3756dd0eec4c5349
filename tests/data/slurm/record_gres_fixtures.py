"""Record what Slurm prints for GPUs in use (about 10 seconds; the cluster's 4 GPUs should be idle first).

    eval "$(resources/slurm/cluster.sh env)"; .venv/bin/python tests/data/slurm/record_gres_fixtures.py

Submits a job with ``--gres=gpu:2`` (tres-per-node), one with ``--gpus=1`` (tres-per-job) and one more
``--gres=gpu:2`` that cannot start while the others hold 3 of the 4 GPUs, then records
``sinfo -N -O <SINFO_NODE_FORMAT>`` into ``sinfo_gres_used_busy.txt`` and squeue's ``%T|%b`` into
``squeue_gres_busy.txt``, and cancels the jobs. On 22.05 the ``--gpus`` job's ``%b`` is ``N/A`` (its GPUs are
in tres-per-job), while sinfo's ``GresUsed`` counts all 3.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from dagster_gpu.slurm import gres as G
from dagster_gpu.slurm.client import SlurmClient

OUT = Path(__file__).resolve().parent
C = SlurmClient()


def raw(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, env=C.env(), check=True).stdout


def main() -> None:
    account = sys.argv[1] if len(sys.argv) > 1 else "research"
    base = ["sbatch", "--parsable", f"--account={account}", "--output=/dev/null", "--time=2"]
    ids = [raw([*base, "--gres=gpu:2", "--wrap", "sleep 30"]).strip(),
           raw([*base, "--gpus=1", "--wrap", "sleep 30"]).strip()]
    time.sleep(4)
    ids.append(raw([*base, "--gres=gpu:2", "--wrap", "sleep 30"]).strip())
    time.sleep(2)
    try:
        (OUT / "sinfo_gres_used_busy.txt").write_text(raw(["sinfo", "--noheader", "--Node", "-O", G.SINFO_NODE_FORMAT]))
        (OUT / "squeue_gres_busy.txt").write_text(raw(["squeue", "--noheader", f"--jobs={','.join(ids)}", "-o", "%T|%b"]))
    finally:
        subprocess.run(["scancel", *ids], env=C.env(), check=False)
    print("wrote sinfo_gres_used_busy.txt, squeue_gres_busy.txt", file=sys.stderr)


if __name__ == "__main__":
    main()
