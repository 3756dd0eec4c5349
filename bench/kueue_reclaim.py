"""Benchmark: Kueue reclaims borrowed GPUs from a dagster-gpu backfill; the evicted units resume (Kueue v0.17.0).

    resources/k8s/cluster.sh start; resources/postgres/postgres.sh start
    .venv/bin/python bench/kueue_reclaim.py

Runs tests/test_kueue_e2e.py (the mixed cluster of resources/k8s/kueue/example/mixed-cluster.yaml: ClusterQueue
``online`` owns two MIG slices and reclaims them, ``batch`` borrows them for a 4-partition backfill; an online pod
asking for both arrives while two batch units run) and records what it measured:

* ``kueue.reclaimed_ok``: the run passed: every partition materialized once, both borrowers evicted by
  ``InCohortReclamation`` for the online workload and launched again, every pod billed, nothing left behind;
* ``kueue.online_wait_s``: the online pod's creation -> its Workload ``Admitted`` (s, polled every 0.1 s), while
  the batch units held the borrowed quota;
* ``kueue.units_without_bill``: pods that ran without a pod-interval bill (0).

Writes ``bench/results/kueue_reclaim.json`` and merges the ``kueue.*`` keys into bench/results/summary.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench")]

from summary import merge_summary  # noqa: E402

OUT = REPO / "bench" / "results" / "kueue_reclaim.json"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="kueue-reclaim-") as tmp:
        result = Path(tmp) / "result.json"
        env = {**os.environ, "DAGSTER_GPU_KUEUE_RESULT": str(result), "PYTHONPATH": str(REPO)}
        rc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_kueue_e2e.py", "-q", "-p", "no:cacheprovider"],
                            cwd=REPO, env=env).returncode
        got = json.loads(result.read_text()) if rc == 0 and result.exists() else {"reclaimed_ok": False}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(got, indent=1) + "\n")
    print(json.dumps(got))
    merge_summary({"kueue.reclaimed_ok": bool(got.get("reclaimed_ok")), "kueue.online_wait_s": got.get("online_wait_s"),
                   "kueue.units_without_bill": got.get("units_without_bill")})
    return 0 if got.get("reclaimed_ok") else 1


if __name__ == "__main__":
    sys.exit(main())
