"""slurmrestd JSON -> the CLI path's rows (dagster_gpu/slurm/rest_parse.py), on responses recorded from the real
slurmrestd of Slurm 24.11.5 (tests/data/slurm/rest/record_rest_fixtures.py: data_parser v0.0.40, v0.0.41,
v0.0.42) and on v0.0.43 / v0.0.44 documents written from SchedMD/slurm's src/plugins/data_parser/<v>/parsers.c
at slurm-25-05-8-1 / slurm-25-11-7-1 (each file's ``_source`` says so)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from dagster_gpu.contracts import WorkerStatus
from dagster_gpu.slurm import rest_parse as RP
from dagster_gpu.slurm.gres import gpu_capacity
from dagster_gpu.slurm.parse import SlurmParseError

DATA = Path(__file__).parent / "data" / "slurm" / "rest"
LIVE = ("v0.0.40", "v0.0.41", "v0.0.42")
WRITTEN = ("v0.0.43", "v0.0.44")


def load(version: str, name: str) -> dict:
    return json.loads((DATA / version / name).read_text())


@pytest.mark.parametrize("version", LIVE)
def test_recorded_array_running_reads_as_squeue_array_rows(version):
    doc = load(version, "job_running.json")
    aid = load(version, "submit.json")["job_id"]
    rows = sorted(RP.queue_rows(doc), key=lambda r: r.array_task_id)
    assert [(r.array_job_id, r.array_task_id, r.state.name) for r in rows] == [
        (aid, 0, "RUNNING"), (aid, 1, "RUNNING"), (aid, 2, "PENDING")]
    # the running tasks have job ids of their own; the pending one carries the array job id (as squeue %A)
    assert rows[2].job_id == aid and len({rows[0].job_id, rows[1].job_id}) == 2 and min(rows[0].job_id, rows[1].job_id) > aid
    assert rows[2].reason == "JobArrayTaskLimit" and rows[2].start is None
    assert all(isinstance(r.start, datetime) for r in rows[:2])
    assert {r.tres_per_node for r in rows} == {"gres/gpu:1"} and {r.qos for r in rows} == {"normal"}
    assert {r.slurm_partition for r in rows} == {"gpu"} and {r.id.raw for r in rows} == {f"{aid}_{t}" for t in range(3)}


@pytest.mark.parametrize("version", LIVE)
def test_recorded_pending_array_record_is_one_row_per_task(version):
    rows = RP.queue_rows(load(version, "job_cancelled.json"))
    # a held 2-task array whose task 1 was cancelled: task 0 is left, from the array's pending record ("0")
    assert [(r.array_task_id, r.state.name, r.reason) for r in rows] == [(0, "PENDING", "JobHeldUser")]


@pytest.mark.parametrize("version", LIVE)
def test_recorded_accounting_reads_as_sacct_rows(version):
    aid = load(version, "submit.json")["job_id"]
    rows = sorted(RP.acct_rows(load(version, "slurmdb_jobs.json")), key=lambda r: r.id.task_id)
    assert [(r.id.job_id, r.id.task_id, r.state.name, r.exit_code) for r in rows] == [
        (aid, 0, "COMPLETED", 0), (aid, 1, "COMPLETED", 0), (aid, 2, "COMPLETED", 0)]
    for r in rows:
        assert r.alloc_tres["gres/gpu"] == 1.0 and r.alloc_tres["billing"] == 11.0 and "energy" not in r.alloc_tres
        assert 3.0 <= r.elapsed_s <= 6.0 and r.elapsed_s == (r.end - r.start).total_seconds()
        assert r.state.final and r.signal is None and r.node_list and r.slurm_partition == "gpu"


@pytest.mark.parametrize("version", LIVE)
def test_recorded_nodes_and_tres(version):
    nodes = RP.node_gres(load(version, "nodes.json"), "gpu")
    assert len(nodes) == 1 and nodes[0].usable
    cap = gpu_capacity(nodes)
    assert (cap.total, cap.usable, cap.used) == (4, 4, 2)  # two tasks of the array ran when it was recorded
    assert RP.node_gres(load(version, "nodes.json"), "no-such-slurm-partition") == []
    assert {"gres/gpu", "cpu", "billing"} <= set(RP.tracked_tres(load(version, "tres.json")))


@pytest.mark.parametrize("version", LIVE)
def test_recorded_jobs_state_is_a_list_per_job(version):
    jobs = load(version, "jobs_state.json")["jobs"]
    assert jobs and all(isinstance(j["state"], list) and isinstance(j["job_id"], str) for j in jobs)


@pytest.mark.parametrize("version", WRITTEN)
def test_written_versions_read_like_the_live_ones(version):
    doc = load(version, "job_running.json")
    assert "parsers.c" in doc["_source"]
    rows = {r.array_task_id: r for r in RP.queue_rows(doc)}
    assert rows[0].state.name == "RUNNING" and rows[0].job_id == 901
    assert rows[1].state.name == "REQUEUED" and rows[1].state.status == WorkerStatus.REQUEUED and rows[1].reason == "BeginTime"
    assert [rows[t].state.name for t in (2, 3, 4)] == ["PENDING"] * 3 and rows[2].job_id == 900
    acct = RP.acct_rows(load(version, "slurmdb_jobs.json"))
    attempts = [(r.id.task_id, r.state.name, r.signal, r.elapsed_s) for r in acct]
    assert attempts == [(0, "COMPLETED", None, 60.0), (1, "PREEMPTED", 15, 30.0), (1, "COMPLETED", None, 30.0)]
    assert acct[0].alloc_tres == {"cpu": 1.0, "mem": 1024.0 * 1024**2, "billing": 11.0, "gres/gpu": 1.0}
    steps = RP.step_usage(load(version, "slurmdb_jobs.json"))
    assert steps[0].id.raw == "900_0.batch" and steps[0].usage_ave == {"gres/gpuutil": 37.0}
    assert steps[0].usage_max == {"gres/gpumem": 2147483648.0}
    nodes = RP.node_gres(load(version, "nodes.json"), "gpu")
    assert [(n.name, n.state, n.usable) for n in nodes] == [("gpu01", "mixed", True), ("gpu02", "idle+drain", False)]
    cap = gpu_capacity(nodes, "a100")
    assert (cap.total, cap.usable, cap.used) == (8, 4, 3)


def test_v0_0_44_new_and_unknown_states_are_per_row():
    rows = {r.array_task_id: r for r in RP.queue_rows(load("v0.0.44", "job_running.json"))}
    assert rows[5].state.name == "EXPEDITING" and rows[5].state.status == WorkerStatus.REQUEUED
    # a flag this module does not know leaves the base state; a base state nobody knows is UNKNOWN for that row only
    assert rows[6].state.name == "PENDING"
    assert rows[7].state.name == "UNKNOWN" and rows[7].state.raw == "A_FUTURE_STATE"
    assert rows[0].state.name == "RUNNING"


def test_state_name_follows_job_state_string_order():
    assert RP.state_name(["RUNNING", "COMPLETING"]) == "COMPLETING"
    assert RP.state_name(["PENDING", "REQUEUED", "REQUEUE_HOLD"]) == "REQUEUED"
    assert RP.state_name(["PENDING", "RESV_DEL_HOLD"]) == "RESV_DEL_HOLD"
    assert RP.state_name(["CANCELLED"]) == "CANCELLED" and RP.state_name("RUNNING") == "RUNNING"
    assert RP.state_name([]) == "" and RP.job_state([]).name == "UNKNOWN"


def test_number_objects():
    assert RP.number({"set": True, "infinite": False, "number": 7}) == 7
    assert RP.number({"set": False, "infinite": False, "number": 0}) is None
    assert RP.number({"set": True, "infinite": True, "number": 0}) is None
    assert RP.number(5) == 5 and RP.number(None) is None
    with pytest.raises(SlurmParseError):
        RP.number("7")
    with pytest.raises(SlurmParseError):
        RP.number(True)
    assert RP.timestamp({"set": True, "infinite": False, "number": 0}) is None


def test_version_pick():
    openapi = {"paths": {"/slurm/v0.0.40/jobs/": {}, "/slurm/v0.0.42/jobs/": {}, "/slurmdb/v0.0.41/jobs/": {}, "/openapi/v3": {}}}
    assert RP.served_versions(openapi) == ["v0.0.40", "v0.0.41", "v0.0.42"]
    assert RP.pick_version(["v0.0.40", "v0.0.41", "v0.0.42"]) == "v0.0.42"
    assert RP.pick_version(["v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45"]) == "v0.0.44"
    assert RP.pick_version(["v0.0.40", "v0.0.42"], wanted="v0.0.40") == "v0.0.40"
    with pytest.raises(RP.NoCommonVersion, match=r"serves data_parser \['v0.0.38', 'v0.0.39'\]"):
        RP.pick_version(["v0.0.39", "v0.0.38"])
    with pytest.raises(RP.NoCommonVersion, match="v0.0.41 asked for"):
        RP.pick_version(["v0.0.42"], wanted="v0.0.41")


def test_job_description_from_sbatch_options():
    body = RP.job_description(
        ["--account=research", "--partition=gpu", "--qos=high", "--time=1-00:00:00", "--requeue", "--signal=B:USR1@90",
         "--gres=gpu:a100:2", "--constraint=h100", "--array=0-7%4", "--job-name=dagster-gpu-b1", "--output=/s/b1/%a.out"],
        "#!/bin/bash\n", ["/s/job.sh", "/py", "runner.py"], {"DAGSTER_HOME": "/h", "PATH": "/bin"}, "/tmp",
    )["job"]
    assert body["array"] == "0-7%4" and body["tres_per_node"] == "gres/gpu:a100:2" and body["constraints"] == "h100"
    assert body["time_limit"] == {"set": True, "infinite": False, "number": 1440} and body["requeue"] is True
    assert (body["kill_warning_signal"], body["kill_warning_delay"]["number"], body["kill_warning_flags"]) == ("USR1", 90, ["BATCH_JOB"])
    assert body["environment"] == ["DAGSTER_HOME=/h", "PATH=/bin"] and body["argv"] == ["/s/job.sh", "/py", "runner.py"]
    assert body["name"] == "dagster-gpu-b1" and body["standard_output"] == "/s/b1/%a.out" and body["qos"] == "high"
    assert RP.job_description(["--no-requeue", "--gres=shard:2"], "", [], {}, "/")["job"]["tres_per_node"] == "gres/shard:2"
    with pytest.raises(RP.UnsupportedOption, match="--mem-per-gpu=4G"):
        RP.job_description(["--mem-per-gpu=4G"], "", [], {}, "/")


def test_submit_response_and_errors():
    assert RP.submitted_job_id(load("v0.0.42", "submit.json")) > 0
    with pytest.raises(SlurmParseError, match="Invalid account"):
        RP.submitted_job_id({"errors": [{"description": "Batch job submission failed", "error": "Invalid account"}]})
    assert RP.slurm_release(load("v0.0.41", "submit.json")) == "24.11.5"


def test_the_shared_poll_stores_and_reads_slurmrestd_documents(tmp_path):
    """What RestSlurmClient.poll_query writes (one compact JSON document per line, per array) read back by every
    process from poll.json, beside the CLI format it keeps reading as before."""
    import time

    from dagster_gpu.slurm.poller import SharedPoller, parse_poll_acct, parse_poll_queue
    from dagster_gpu.slurm.spool import Spool, write_json

    lines = [json.dumps({"jobs": load(v, "job_running.json")["jobs"]}, separators=(",", ":")) for v in ("v0.0.42", "v0.0.44")]
    acct = json.dumps({"jobs": load("v0.0.42", "slurmdb_jobs.json")["jobs"]}, separators=(",", ":"))
    spool = Spool(tmp_path / "spool")
    write_json(spool.poll_file, {"started_at": time.time(), "ids": [1], "format": "rest", "squeue": "\n".join(lines) + "\n",
                                 "sacct": acct + "\n"})  # fmt: skip
    snap = SharedPoller(spool, client=None, interval_s=60)._read()  # type: ignore[arg-type]
    assert snap is not None and snap.ok
    assert len(snap.queue) == 3 + 8 and len(snap.acct) == 3  # 24.11's three tasks; the written v0.0.44's eight
    assert [r.state.name for r in snap.queue if r.array_job_id == 900 and r.array_task_id == 7] == ["UNKNOWN"]
    assert parse_poll_queue("cli", "") == [] and parse_poll_acct("rest", "") == []
    with pytest.raises(SlurmParseError, match="not a slurmrestd JSON"):
        parse_poll_queue("rest", "squeue text\n")


def test_recorded_pending_tasks_cancelled_inside_their_array_read_as_sacct_prints_them():
    rows = RP.acct_rows(load("v0.0.42", "slurmdb_jobs_terminated.json"))
    assert sorted((r.id.raw, r.state.name, r.elapsed_s > 0) for r in rows) == [
        ("628_0", "CANCELLED", True), ("628_1", "CANCELLED", True), ("628_[2-3,5%2]", "CANCELLED", False)]
    left = next(r for r in rows if r.id.task_id is None)
    assert left.id.task_ranges == ((2, 3), (5, 5)) and left.id.throttle == 2 and left.elapsed_s == 0.0
    assert RP.task_bitmap("0x2C") == "2-3,5" and RP.task_bitmap("0x1") == "0" and RP.task_bitmap("4-7") == "4-7"
