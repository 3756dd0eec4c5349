"""Benchmark: the same ranged backfill with Slurm reached from this host (``transport: local``), over SSH and
through slurmrestd.

    eval "$(bash resources/slurm/cluster.sh env)"; bash resources/postgres/postgres.sh start; bash resources/ssh/sshd.sh start
    .venv/bin/python bench/remote_backfill.py [--files 1000] [--per-run 500] [--order local,ssh]
    # rest: the 24.11 cluster's slurmrestd (resources/slurm/trixie.sh), local on the same cluster as the baseline
    eval "$(bash resources/slurm/trixie.sh env)"; export DGPU_TEST_SLURM_PYTHON=$DAGSTER_GPU_SLURM_WORKER_PYTHON
    .venv/bin/python bench/remote_backfill.py --files 100 --per-run 50 --order local,rest --out remote_backfill_rest_100.json
    # all three on the 24.11 cluster: --order local,ssh,rest (ssh finds the cluster's commands by SLURM_CONF)
    # the relay (events: relay; the tasks get a wrong database password): a variant's name + "-relay", e.g.
    .venv/bin/python bench/remote_backfill.py --files 1000 --per-run 500 --order local,ssh-relay

Side by side, in one command, on one generated corpus (bench/make_corpus.py), each variant a backfill of every
file through gpu_executor's slurm backend in runs of ``--per-run`` partitions (bench/ranged_backfill.py's
``run_backfill``, same settings):

  1. ``local``: Slurm's commands run on this host, the spool is this host's (Dagster on a login node);
  2. ``ssh``: every Slurm command and every cluster-side spool file goes through the test sshd
     (resources/ssh/sshd.sh, 127.0.0.1) over one shared OpenSSH ControlMaster, as from a Dagster host off the
     cluster (tests/slurm_pipeline.py ``ssh_transport_config``); the spool the array tasks read is the
     cluster's (``ssh.remote_spool_dir``);
  3. ``rest``: every Slurm call through the 24.11 test cluster's slurmrestd with a JWT (tests/slurm_pipeline.py
     ``rest_transport_config``); the spool is this host's (the cluster's root shares /tmp), the tasks read the
     PostgreSQL password from an env_files file.

A variant named ``<transport>-relay`` is that transport with ``events: relay``: the array tasks load a wrong
database password and no DAGSTER_HOME (tests/slurm_helpers.py ``no_database_env``), so each event reaches the
instance through the run workers' relay; it reports the relay's delay (:func:`relay_figures`).

Reported per variant: makespan (submission to the end of the last run), runs, sbatch calls, partitions ok,
useful fraction; for ``ssh`` the TCP connections sshd accepted during the backfill (its log's "Accepted
publickey" lines: one per ControlMaster). Ratios: each remote variant's makespan ÷ ``local``'s, measured in
the same run. Writes ``remote.ssh_makespan_ratio``, ``remote.ssh_connections_per_backfill`` and
``remote.rest_makespan_ratio`` (and for a relay variant ``remote.<variant>_makespan_ratio``, ``remote.relay_delay_p50_s``,
``remote.relay_delay_p95_s``) to bench/results/summary.json only at the issue's size (1,000 partitions), and the run's figures to
bench/results/remote_backfill.json (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

import rest_helpers as R  # noqa: E402
import slurm_helpers as H  # noqa: E402
import ssh_helpers as SSH  # noqa: E402
from make_corpus import make_corpus  # noqa: E402
from ranged_backfill import run_backfill  # noqa: E402
from summary import merge_summary  # noqa: E402

from dagster_gpu.slurm import ssh_command as C  # noqa: E402


def transport_env(variant: str, sshd: dict[str, str] | None, workdir: Path) -> tuple[dict[str, str], str | None]:
    """The environment that puts ``variant``'s transport in tests/slurm_pipeline.py's executor config, and the
    ControlMaster socket to close afterwards (None for ``local``)."""
    if variant == "local":
        return {"DGPU_TEST_SLURM_TRANSPORT": "local", "DGPU_TEST_REMOTE_SPOOL": ""}, None
    if variant == "rest":
        reason = R.unavailable_reason()
        if reason:
            sys.exit(f"cannot run the rest variant: {reason}")
        token = R.write_token(workdir / "slurmrestd.jwt", 4 * 3600)
        secrets = workdir / "worker-secrets.env"
        fd = os.open(secrets, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"DAGSTER_PG_PASSWORD={(H.PG_DIR / 'password').read_text().strip()}\n")
        return {"DGPU_TEST_SLURM_TRANSPORT": "rest", "DGPU_TEST_REST_URL": R.URL, "DGPU_TEST_REST_CREDENTIAL_FILE": str(token),
                "DGPU_TEST_ENV_FILE": str(secrets), "DGPU_TEST_REMOTE_SPOOL": ""}, None
    if sshd is None:
        sys.exit("cannot run the ssh variant: the test sshd did not start (resources/ssh/sshd.sh start)")
    ctl = SSH.short_dir("dgs-bench-")
    spool = workdir / "ssh-cluster-spool"
    shutil.rmtree(spool, ignore_errors=True)
    env = {**sshd, "DGPU_TEST_SLURM_TRANSPORT": "ssh", "DGPU_TEST_SSH_CONTROL_DIR": ctl, "DGPU_TEST_REMOTE_SPOOL": str(spool)}
    for cluster in H.CLUSTERS.values():  # the 24.11 cluster's commands are wrappers the login shell has not on PATH
        if cluster.bin_dir and cluster.conf == os.environ.get("SLURM_CONF"):
            env["DGPU_TEST_SLURM_BIN_DIR"] = str(cluster.bin_dir)
    return env, C.control_path(SSH.target(sshd), ctl)


def relay_figures(home: str) -> dict:
    """What the run workers' relay reported (tests/slurm_helpers.py ``relay_reports``) for the backfill stored at
    DAGSTER_HOME ``home``: materializations relayed, torn or refused lines, and the delay from a partition's
    materialization on the compute node to its store in the instance: p50 = the units' p50s weighted by their
    materializations, p95 = the largest unit p95 (an upper bound of the backfill's p95); the channels' reads (each
    one a command on the login node over ssh) against the executor's polls, which read at every poll before the
    quiet-channel back-off."""
    import dagster as dg

    os.environ.setdefault("DAGSTER_PG_PASSWORD", (H.PG_DIR / "password").read_text().strip())
    with dg.DagsterInstance.from_config(home) as instance:
        reports = H.relay_reports(instance, [r.run_id for r in instance.get_runs()])
    n = sum(r["dagster_gpu/relay_materializations"] for r in reports)
    return {"relay_reports": len(reports), "relay_materializations": n,
            "relay_bad_lines": sum(r["dagster_gpu/relay_bad_lines"] for r in reports),
            "relay_refused": sum(r["dagster_gpu/relay_refused"] for r in reports),
            "relay_reads": sum(r.get("dagster_gpu/relay_reads", 0) for r in reports),
            "relay_polls": sum(r.get("dagster_gpu/relay_polls", 0) for r in reports),
            "relay_delay_p50_s": round(sum(r["dagster_gpu/relay_delay_p50_s"] * r["dagster_gpu/relay_materializations"]
                                           for r in reports) / max(n, 1), 3),
            "relay_delay_p95_s": max((r["dagster_gpu/relay_delay_p95_s"] for r in reports), default=None)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--records", type=int, default=20)
    ap.add_argument("--per-run", type=int, default=500)
    ap.add_argument("--max-runs", type=int, default=8)
    ap.add_argument("--order", default="local,ssh", help="variants, in the order they run")
    ap.add_argument("--out", default="remote_backfill.json", help="the run's figures, under bench/results/")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "dagster-gpu-bench-remote")
    a = ap.parse_args()
    reason = H.cluster_unavailable_reason() or H.postgres_unavailable_reason()
    if reason:
        sys.exit(f"cannot run: {reason}")
    variants = a.order.split(",")
    sshd = SSH.sshd_env() if any(v.startswith("ssh") for v in variants) else None
    corpus = a.workdir / "corpus"
    shutil.rmtree(corpus, ignore_errors=True)  # exactly --files files, whatever an earlier run left there
    make_corpus(corpus, a.files, a.records)
    keys = sorted(p.name for p in corpus.iterdir())
    res: dict[str, dict] = {}
    for v in variants:
        transport, relay = v.removesuffix("-relay"), v.endswith("-relay")
        env, socket = transport_env(transport, sshd, a.workdir)
        if relay:  # the tasks load a wrong database password: every event comes back through the relay
            env.update(H.no_database_env(a.workdir))
        before = SSH.logins(sshd) if sshd else 0
        try:
            res[v] = run_backfill(v, corpus, keys, a.per_run, a.max_runs, a.workdir, extra_env=env)
        finally:
            if socket:
                subprocess.run(["ssh", "-O", "exit", "-S", socket, "dagster-gpu-bench"], capture_output=True)
        if transport == "ssh":
            res[v]["ssh_connections"] = SSH.logins(sshd) - before
        if relay:
            res[v].update(relay_figures(res[v]["home"]))
        print(json.dumps(res[v]), flush=True)
    ratios = {}
    if "local" in res and "ssh" in res:
        ratios["remote.ssh_makespan_ratio"] = round(res["ssh"]["makespan_s"] / res["local"]["makespan_s"], 3)
        ratios["remote.ssh_connections_per_backfill"] = res["ssh"]["ssh_connections"]
    if "local" in res and "rest" in res:
        ratios["remote.rest_makespan_ratio"] = round(res["rest"]["makespan_s"] / res["local"]["makespan_s"], 3)
    for v in (v for v in variants if v.endswith("-relay")):
        if "local" in res:
            ratios[f"remote.{v.replace('-', '_')}_makespan_ratio"] = round(res[v]["makespan_s"] / res["local"]["makespan_s"], 3)
        ratios["remote.relay_delay_p50_s"] = res[v]["relay_delay_p50_s"]
        ratios["remote.relay_delay_p95_s"] = res[v]["relay_delay_p95_s"]
    print(json.dumps({"files": a.files, "per_run": a.per_run, **ratios}), flush=True)
    (REPO / "bench" / "results" / a.out).write_text(
        json.dumps({"files": a.files, "per_run": a.per_run, "order": variants, **res, "summary": ratios}, indent=1) + "\n")
    if a.files == 1000 and ratios and all(r["succeeded"] == len(keys) for r in res.values()):
        merge_summary(ratios)


if __name__ == "__main__":
    main()
