"""Benchmark: a backfill over slurmrestd with nothing shared against the same backfill with a shared spool, on
the 24.11 test cluster, in one run.

    bash resources/slurm/trixie.sh start            # the cluster, slurmrestd and the no-share mask
    PYTHONPATH=$PWD .venv/bin/python bench/rest_noshare.py [--partitions 6] [--reps 3] [--sleep 5]

Each rep runs, alternating the order, the same backfill of ``--partitions`` partitions (one run worker per
partition, each task sleeping ``--sleep`` s; the last partition's worker dies with exit 7) twice with
``transport: rest`` and ``events: relay`` from tasks that cannot open the database:

- **shared**: the spool under /tmp, which the cluster's root sees at the same path: manifests, the task runner,
  the tasks' logs and the relay channels are spool files;
- **noshare**: the spool under ``trixie.sh mask-noshare``'s directory, which no task can see, and ``relay_url``
  on a moto S3 server started here (``python -m moto.server``): manifests, channels and logs on it, the task
  runner in the job script.

Makespan: from the first run worker's start to the last one's exit. Prints every makespan and writes
``remote.rest_noshare_makespan_ratio`` (median noshare ÷ median shared) and ``remote.rest_noshare_log_tail_ok``
(every noshare rep's crashed partition has its shipped log's last line in its step failure) to
bench/results/summary.json. Holds the tests' host locks (tests/host_locks.py: the host shared, ``slurm-24.11``
exclusive) and starts on an idle cluster.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from summary import merge_summary  # noqa: E402

from tests import host_locks  # noqa: E402
from tests import noshare_helpers as N  # noqa: E402
from tests import rest_helpers as R  # noqa: E402
from tests import slurm_helpers as H  # noqa: E402
from tests.s3_helpers import moto_s3_process  # noqa: E402

BUCKET = "noshare-bench"


def _rest_env(home: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` with transport rest (a fresh 1 h token in a 0600 file), the database password in a 0600 env file,
    and no Slurm command on PATH (as tests/test_slurm_rest_e2e.py's rest_home)."""
    token = R.write_token(home / "slurmrestd.jwt", 3600)
    secrets = home / "worker-secrets.env"
    fd = os.open(secrets, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"DAGSTER_PG_PASSWORD={env['DAGSTER_PG_PASSWORD']}\n")
    return {**env, **H.SLURM_24_11.env(env), "DGPU_TEST_SLURM_TRANSPORT": "rest", "DGPU_TEST_REST_URL": R.URL,
            "DGPU_TEST_REST_CREDENTIAL_FILE": str(token), "DGPU_TEST_ENV_FILE": str(secrets),
            "SLURM_CONF": str(home / "no-slurm.conf"),
            "PATH": os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p not in H.WRAPPER_DIRS)}


def _one(mode: str, s3, partitions: int, sleep_s: float, first: int) -> dict:
    """One backfill in ``mode`` (``shared`` or ``noshare``) on a fresh Dagster home; returns its figures."""
    import dagster as dg

    home, env = H.make_dagster_home()
    env = _rest_env(home, env)
    if mode == "noshare":
        env, _, _ = N.noshare_env(env, home, s3.endpoint, s3.bucket(BUCKET))
    else:
        env.update(H.no_database_env(home))
    keys = [f"p{i:03d}" for i in range(first, first + partitions)]
    env["DGPU_TEST_CRASH"] = keys[-1]
    saved = dict(os.environ)
    os.environ.update(env)  # this process reads the instance for the failure message
    try:
        t0 = time.monotonic()
        codes = H.wait_all(H.start_runs(env, keys, sleep_s), 900)
        makespan = time.monotonic() - t0
        with dg.DagsterInstance.get() as instance:
            failures = [r.event_log_entry.dagster_event.step_failure_data.error.to_string()
                        for run in instance.get_runs() if run.tags.get("dagster/partition") == keys[-1]
                        for r in instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE).records]
    finally:
        os.environ.clear()
        os.environ.update(saved)
    ok = codes[:-1] == [0] * (partitions - 1) and codes[-1] != 0
    tail_ok = any(f"partition {keys[-1]} crashes here with exit 7" in f for f in failures)
    out = {"mode": mode, "makespan_s": round(makespan, 2), "codes_ok": ok, "log_tail_ok": tail_ok, "home": str(home)}
    print(json.dumps(out), flush=True)
    if not ok:
        raise SystemExit(f"{mode}: run workers exited {codes}\n{H.explain_failures(home, keys, codes)}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sleep", type=float, default=5.0)
    ap.add_argument("--no-summary", action="store_true")
    a = ap.parse_args()
    for reason in (H.cluster_unavailable_reason(H.SLURM_24_11), H.postgres_unavailable_reason(), R.unavailable_reason()):
        if reason:
            raise SystemExit(reason)
    results: list[dict] = []
    with ExitStack() as locks, moto_s3_process() as s3:
        host_locks._host_lock(locks, exclusive=False)
        host_locks._flock(locks, "slurm-24.11", fcntl.LOCK_EX)
        H.idle_cluster(H.SLURM_24_11)
        first = 100
        for rep in range(a.reps):
            for mode in (("shared", "noshare") if rep % 2 == 0 else ("noshare", "shared")):
                results.append(_one(mode, s3, a.partitions, a.sleep, first))
                first += a.partitions
                H.idle_cluster(H.SLURM_24_11)
    med = {m: statistics.median(r["makespan_s"] for r in results if r["mode"] == m) for m in ("shared", "noshare")}
    ratio = round(med["noshare"] / med["shared"], 3)
    tail_ok = all(r["log_tail_ok"] for r in results if r["mode"] == "noshare")
    print(json.dumps({"partitions": a.partitions, "reps": a.reps, "sleep_s": a.sleep, "median_makespan_s": med,
                      "rest_noshare_makespan_ratio": ratio, "rest_noshare_log_tail_ok": tail_ok}))
    if not a.no_summary:
        merge_summary({"remote.rest_noshare_makespan_ratio": ratio, "remote.rest_noshare_log_tail_ok": tail_ok})


if __name__ == "__main__":
    main()
