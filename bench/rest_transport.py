"""Benchmark: the rest transport's calls against the local transport's commands, on the same 24.11 cluster.

    eval "$(bash resources/slurm/trixie.sh env)"
    bash resources/slurm/trixie.sh token 3600 root /tmp/bench-jwt
    .venv/bin/python bench/rest_transport.py /tmp/bench-jwt [--tasks 100] [--reps 15]

One job array of ``--tasks`` tasks (``exit 0``) is submitted and waited for; then, alternating, ``--reps`` times
each: the shared poll's query of that array (``poll_query``: squeue + sacct through the 24.11 wrappers for
``local``, ``job/<id>`` + ``slurmdb/jobs`` through slurmrestd for ``rest``) parsed into rows, and the submission
of a held one-task array (``sbatch`` vs ``job/submit``, cancelled at once). The local transport is the baseline
measured in the same run: prints each median and the ratios rest ÷ local, and writes ``rest.*`` keys to
bench/results/summary.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from summary import merge_summary  # noqa: E402

from dagster_gpu.slurm.client import SlurmClient  # noqa: E402
from dagster_gpu.slurm.poller import parse_poll_acct, parse_poll_queue  # noqa: E402
from dagster_gpu.slurm.rest import RestSlurmClient, TokenSource  # noqa: E402

SCRIPT = "#!/bin/sh\nexit 0\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("token_file")
    ap.add_argument("--url", default="http://127.0.0.1:6820")
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--no-summary", action="store_true")
    a = ap.parse_args()
    cli = SlurmClient()
    rest = RestSlurmClient(url=a.url, user="root", tokens=TokenSource(file=a.token_file))
    work = Path("/tmp/dagster-gpu-bench-rest")
    work.mkdir(exist_ok=True)
    script = work / "job.sh"
    script.write_text(SCRIPT)
    base = ["--account=research", "--gres=gpu:1", "--output=/dev/null", "--time=2"]
    aid = cli.submit(script, [*base, f"--array=0-{a.tasks - 1}"])
    deadline = time.time() + 600
    while time.time() < deadline:
        acct = cli.sacct([aid])
        if len(acct) == a.tasks and all(r.state.final for r in acct):
            break
        time.sleep(2)
    else:
        raise SystemExit(f"array {aid} did not finish within 600 s")
    times: dict[str, list[float]] = {"poll_local": [], "poll_rest": [], "submit_local": [], "submit_rest": []}
    rows = {}
    for _ in range(a.reps):
        for name, client in (("local", cli), ("rest", rest)):
            t0 = time.perf_counter()
            q, s = client.poll_query([aid])
            queue, acct = parse_poll_queue(client.poll_format, q), parse_poll_acct(client.poll_format, s)
            times[f"poll_{name}"].append(time.perf_counter() - t0)
            rows[name] = (len(queue), len(acct), sorted(r.state.name for r in acct).count("COMPLETED"))
            t0 = time.perf_counter()
            if name == "local":
                jid = cli.submit(script, [*base, "--array=0", "--hold"])
            else:
                jid = _rest_submit_held(rest, script, base)
            times[f"submit_{name}"].append(time.perf_counter() - t0)
            cli.scancel([str(jid)])
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {
        "tasks": a.tasks, "reps": a.reps, "array_job_id": aid, "rows_local": rows["local"], "rows_rest": rows["rest"],
        **{f"{k}_median_s": round(v, 4) for k, v in med.items()},
        "poll_ratio_rest_vs_local": round(med["poll_rest"] / med["poll_local"], 3),
        "submit_ratio_rest_vs_local": round(med["submit_rest"] / med["submit_local"], 3),
        "rest_calls": rest.calls.get("slurmrestd", 0), "data_parser": rest.data_parser(),
    }
    print(json.dumps(out))
    assert rows["local"][1:] == rows["rest"][1:] == (a.tasks, a.tasks), rows
    if not a.no_summary:
        merge_summary({"rest.poll_s_median": out["poll_rest_median_s"], "rest.poll_ratio_vs_local": out["poll_ratio_rest_vs_local"],
                       "rest.submit_s_median": out["submit_rest_median_s"],
                       "rest.submit_ratio_vs_local": out["submit_ratio_rest_vs_local"]})


def _rest_submit_held(rest: RestSlurmClient, script: Path, base: list[str]) -> int:
    """A held one-task array through job/submit (``--hold`` has no option mapping: the body is built here)."""
    from dagster_gpu.slurm import rest_parse as RP

    body = RP.job_description([*base, "--array=0"], script.read_text(), [str(script)], rest.job_environment(), "/tmp")
    body["job"]["hold"] = True
    return RP.submitted_job_id(rest.request("POST", "slurm/job/submit", body=body, only_unsent=True))


if __name__ == "__main__":
    main()
