"""Record what slurmrestd (Slurm 24.11.5, Debian trixie's ``slurmrestd``; resources/slurm/trixie.sh) answers, for
each data_parser version it serves (v0.0.40, v0.0.41, v0.0.42), into ``<version>/``. About a minute:

    eval "$(resources/slurm/trixie.sh env)"; bash resources/slurm/trixie.sh token 600 root >/tmp/tok; chmod 600 /tmp/tok
    .venv/bin/python tests/data/slurm/rest/record_rest_fixtures.py /tmp/tok

Per version: ``submit.json`` (job/submit of a 3-task array, throttle 2, ``sleep 3``), ``job_running.json``
(``job/<array job id>`` a second later: two tasks RUNNING, one PENDING as JobArrayTaskLimit),
``job_cancelled.json`` (a 2-task array whose task 1 was cancelled while pending), ``slurmdb_jobs.json``
(``slurmdb/jobs/?step=<id>&show_duplicates`` after both ended), ``nodes.json``, ``tres.json`` and
``jobs_state.json`` (``jobs/state/`` with no filter). The token is read from the file named by the
first argument and never written anywhere. ``v0.0.42/submit_expired_token.json`` is a ``job/submit`` sent with a
token (``trixie.sh token 1``) that had expired 2 s earlier: HTTP 511, error 1007, and no job created (squeue and
sacct know no job of its name), recorded by hand; its ``_source`` says so.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from dagster_gpu.slurm.rest import RestSlurmClient, TokenSource

OUT = Path(__file__).resolve().parent
VERSIONS = ("v0.0.40", "v0.0.41", "v0.0.42")


def save(version: str, name: str, doc: dict) -> None:
    d = OUT / version
    d.mkdir(exist_ok=True)
    (d / name).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def record(token_file: str, version: str) -> None:
    c = RestSlurmClient(url="http://127.0.0.1:6820", user="root", tokens=TokenSource(file=token_file), version=version)
    job = {"script": "#!/bin/sh\nsleep 3\n", "argv": ["job.sh"], "current_working_directory": "/tmp",
           "environment": ["PATH=/usr/bin:/bin"], "account": "research", "partition": "gpu", "tres_per_node": "gres/gpu:1",
           "standard_output": "/dev/null", "name": f"rest-fixture-{version}"}
    sub = c.request("POST", "slurm/job/submit", body={"job": {**job, "array": "0-2%2"}})
    save(version, "submit.json", sub)
    aid = sub["job_id"]
    held = c.request("POST", "slurm/job/submit", body={"job": {**job, "array": "0-1", "hold": True}})
    time.sleep(1.5)
    save(version, "job_running.json", c.request("GET", f"slurm/job/{aid}"))
    save(version, "jobs_state.json", c.request("GET", "slurm/jobs/state/"))
    c.scancel([f"{held['job_id']}_1"])
    time.sleep(0.5)
    save(version, "job_cancelled.json", c.request("GET", f"slurm/job/{held['job_id']}"))
    c.scancel([str(held["job_id"])])
    save(version, "nodes.json", c.request("GET", "slurm/nodes/"))
    save(version, "tres.json", c.request("GET", "slurmdb/tres/"))
    deadline = time.time() + 60
    while time.time() < deadline:
        doc = c.request("GET", "slurmdb/jobs/", query={"step": str(aid), "show_duplicates": "true"})
        if len(doc.get("jobs") or []) == 3 and all(j["state"]["current"] == ["COMPLETED"] for j in doc["jobs"]):
            save(version, "slurmdb_jobs.json", doc)
            break
        time.sleep(1)
    else:
        raise SystemExit(f"{version}: array {aid} did not complete in sacct within 60 s")
    print(f"{version}: array {aid}, held {held['job_id']}", file=sys.stderr)


if __name__ == "__main__":
    for v in VERSIONS:
        record(sys.argv[1], v)
