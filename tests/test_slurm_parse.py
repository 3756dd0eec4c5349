"""Parsers of Slurm output, on outputs recorded from the local cluster (tests/data/slurm, see
record_slurm_fixtures.py) plus the hand-written forms Slurm prints in other situations."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from dagster_gpu.contracts import WorkerStatus
from dagster_gpu.slurm import parse as P
from dagster_gpu.slurm.client import gpu_count
from dagster_gpu.slurm.ids import BadJobId, format_array_spec, parse_array_task_field, parse_job_id
from dagster_gpu.billing.apportion import apportion_unit_bill
from dagster_gpu.slurm.sacct_bill import sacct_figures
from dagster_gpu.slurm.states import STATE_MAP, UnknownSlurmState, parse_state, worker_status
from dagster_gpu.slurm.status import (
    SUBMIT_SLACK_S, WaitLimits, acct_since, queue_wait_class, records_for, task_state, task_wait_class,
)

DATA = Path(__file__).parent / "data" / "slurm"
JOBS = json.loads((DATA / "jobs.json").read_text())


def data(name: str) -> str:
    return (DATA / name).read_text()


# ------------------------------------------------------------------------------------------ states
@pytest.mark.parametrize(
    "text,name,uid,status",
    [
        ("RUNNING", "RUNNING", None, WorkerStatus.RUNNING),
        ("R", "RUNNING", None, WorkerStatus.RUNNING),
        ("PD", "PENDING", None, WorkerStatus.PENDING),
        ("CANCELLED by 0", "CANCELLED", 0, WorkerStatus.FAILED),
        ("CANCELLED by 1000", "CANCELLED", 1000, WorkerStatus.FAILED),
        ("CANCELLED+", "CANCELLED", None, WorkerStatus.FAILED),
        ("CANCELLED", "CANCELLED", None, WorkerStatus.FAILED),
        ("COMPLETED", "COMPLETED", None, WorkerStatus.SUCCEEDED),
        ("CD", "COMPLETED", None, WorkerStatus.SUCCEEDED),
        ("COMPLETING", "COMPLETING", None, WorkerStatus.RUNNING),
        ("CG", "COMPLETING", None, WorkerStatus.RUNNING),
        ("PREEMPTED", "PREEMPTED", None, WorkerStatus.REQUEUED),
        ("REQUEUED", "REQUEUED", None, WorkerStatus.REQUEUED),
        ("REQUEUE_HOLD", "REQUEUE_HOLD", None, WorkerStatus.REQUEUED),
        ("REQUEUE_FED", "REQUEUE_FED", None, WorkerStatus.REQUEUED),
        ("SPECIAL_EXIT", "SPECIAL_EXIT", None, WorkerStatus.REQUEUED),
        ("RESV_DEL_HOLD", "RESV_DEL_HOLD", None, WorkerStatus.PENDING),
        ("CONFIGURING", "CONFIGURING", None, WorkerStatus.PENDING),
        ("NODE_FAIL", "NODE_FAIL", None, WorkerStatus.FAILED),
        ("TIMEOUT", "TIMEOUT", None, WorkerStatus.FAILED),
        ("OUT_OF_MEMORY", "OUT_OF_MEMORY", None, WorkerStatus.FAILED),
        ("OUT_OF_ME+", "OUT_OF_MEMORY", None, WorkerStatus.FAILED),
        ("OOM", "OUT_OF_MEMORY", None, WorkerStatus.FAILED),
        ("BOOT_FAIL", "BOOT_FAIL", None, WorkerStatus.FAILED),
        ("DEADLINE", "DEADLINE", None, WorkerStatus.FAILED),
        ("REVOKED", "REVOKED", None, WorkerStatus.FAILED),
        ("SIGNALING", "SIGNALING", None, WorkerStatus.RUNNING),
        ("STAGE_OUT", "STAGE_OUT", None, WorkerStatus.RUNNING),
        ("STOPPED", "STOPPED", None, WorkerStatus.RUNNING),
        ("SUSPENDED", "SUSPENDED", None, WorkerStatus.RUNNING),
        ("RESIZING", "RESIZING", None, WorkerStatus.RUNNING),
        ("FAILED", "FAILED", None, WorkerStatus.FAILED),
        (" failed ", "FAILED", None, WorkerStatus.FAILED),
    ],
)
def test_state_map(text, name, uid, status):
    st = parse_state(text)
    assert (st.name, st.by_uid, st.status) == (name, uid, status)
    assert worker_status(text) == status


@pytest.mark.parametrize("bad", ["BOGUS", "C+", "RE+", "by 0", "CANCELLED by x"])
def test_unknown_states_raise(bad):
    with pytest.raises(UnknownSlurmState):
        parse_state(bad)


@pytest.mark.parametrize("text", ["", "Unknown", "None", "INVALID", "?", " n/a ", "(null)"])
def test_states_slurm_cannot_name_are_unknown(text):
    st = parse_state(text)
    assert (st.name, st.status, st.final, st.raw) == ("UNKNOWN", WorkerStatus.UNKNOWN, False, text)


def test_every_state_is_mapped_to_a_worker_status():
    assert set(STATE_MAP.values()) == {
        WorkerStatus.PENDING, WorkerStatus.RUNNING, WorkerStatus.SUCCEEDED, WorkerStatus.FAILED, WorkerStatus.REQUEUED,
        WorkerStatus.UNKNOWN,
    }  # fmt: skip
    assert str(parse_state("CANCELLED by 0")) == "CANCELLED by 0"
    assert parse_state("CANCELLED+").truncated


# --------------------------------------------------------------------------------------------- ids
def test_job_id_forms():
    j = parse_job_id("123_[4-9%2]")
    assert (j.job_id, j.task_id, j.task_ranges, j.throttle, j.is_compact) == (123, None, ((4, 9),), 2, True)
    assert list(j.task_ids()) == [4, 5, 6, 7, 8, 9]
    j = parse_job_id("123_[2,5,7-9]")
    assert list(j.task_ids()) == [2, 5, 7, 8, 9] and j.throttle is None
    j = parse_job_id("123_7")
    assert (j.job_id, j.task_id, j.is_array_task) == (123, 7, True)
    j = parse_job_id("123")
    assert (j.job_id, j.task_id, j.is_array_task) == (123, None, False)
    j = parse_job_id("123+0")
    assert (j.job_id, j.het_offset) == (123, 0)
    j = parse_job_id("123_7.batch")
    assert (j.job_id, j.task_id, j.step) == (123, 7, "batch")
    assert parse_job_id("5.extern").step == "extern"
    for bad in ("", "abc", "123_", "123_[9-4]", "123_[]", "_7"):
        with pytest.raises(BadJobId):
            parse_job_id(bad)


def test_array_task_field_and_spec():
    assert parse_array_task_field("N/A") == ((), None)
    assert parse_array_task_field("7") == (((7, 7),), None)
    assert parse_array_task_field("4-9%2") == (((4, 9),), 2)
    assert parse_array_task_field("2,5,7-9") == (((2, 2), (5, 5), (7, 9)), None)
    assert format_array_spec(range(40), 4) == "0-39%4"
    assert format_array_spec([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert format_array_spec([3], 0) == "3"
    with pytest.raises(ValueError):
        format_array_spec([])


# ---------------------------------------------------------------------------------- squeue (real)
def test_squeue_compact_running_recorded():
    rows = P.parse_squeue(data("squeue_compact_running.txt"))
    by_raw = {r.id.raw: r for r in rows}
    a = JOBS["array_throttled"]
    compact = by_raw[f"{a}_[2-9%2]"]
    assert compact.id.is_compact and compact.throttle == 2 and compact.array_task_ids == ((2, 9),)
    assert compact.state.name == "PENDING" and compact.reason == "JobArrayTaskLimit" and compact.start is None
    assert compact.job_id == a == compact.array_job_id
    assert by_raw[str(JOBS["exit3"])].state.status == WorkerStatus.FAILED
    assert by_raw[str(JOBS["exit3"])].reason == "NonZeroExitCode"
    held = by_raw[str(JOBS["held_cancelled"])]
    assert held.state.name == "PENDING" and held.reason == "BeginTime"
    s = JOBS["array_sparse_shard"]
    assert by_raw[f"{s}_[7-9]"].tres_per_node == "gres:shard:2"


def test_squeue_array_lines_recorded():
    rows = P.parse_squeue(data("squeue_array_running.txt"))
    a = JOBS["array_throttled"]
    tasks = {r.array_task_id: r for r in rows if r.array_job_id == a}
    assert sorted(tasks) == list(range(10))  # --array: every task on its own line, pending ones too
    assert tasks[0].state.name == "RUNNING" and tasks[0].job_id != a
    assert tasks[9].job_id == a  # the last task carries the array job id
    assert all(tasks[i].reason == "JobArrayTaskLimit" for i in range(2, 10))
    assert tasks[0].qos == "normal" and tasks[0].slurm_partition == "gpu" and tasks[0].name == "wrap"


def test_squeue_preempted_recorded():
    rows = P.parse_squeue(data("squeue_preempted.txt"))
    p = JOBS["preempted_array"]
    t0 = next(r for r in rows if r.array_job_id == p and r.array_task_id == 0)
    assert t0.state.name == "PENDING" and t0.reason == "BeginTime"  # requeued, waiting out the requeue delay
    hi = next(r for r in rows if r.job_id == JOBS["high_qos"])
    assert hi.qos == "high" and hi.state.status == WorkerStatus.RUNNING


def test_squeue_done_recorded_includes_cancelled_task():
    rows = P.parse_squeue(data("squeue_all_done.txt"))
    one = next(r for r in rows if r.id.raw == f"{JOBS['scancel_one']}_1")
    assert one.state.name == "CANCELLED" and one.state.status == WorkerStatus.FAILED
    assert next(r for r in rows if r.job_id == JOBS["timeout"]).state.name == "TIMEOUT"


def test_squeue_bad_line():
    with pytest.raises(P.SlurmParseError):
        P.parse_squeue("1|2|3\n")


# ----------------------------------------------------------------------------------- sacct (real)
def test_sacct_recorded_states_exit_codes_tres():
    rows = P.parse_sacct(data("sacct_all.txt"))
    by = {}
    for r in rows:
        by.setdefault(r.id.raw, []).append(r)
    f = by[str(JOBS["exit3"])][0]
    assert (f.state.name, f.exit_code, f.signal) == ("FAILED", 3, 0)
    assert f.alloc_tres == {"billing": 11.0, "cpu": 1.0, "gres/gpu": 1.0, "node": 1.0} and f.gpus == 1.0
    c = by[str(JOBS["held_cancelled"])][0]
    assert str(c.state) == "CANCELLED by 0" and c.state.by_uid == 0
    assert c.alloc_tres == {} and c.elapsed_s == 0  # cancelled while held: nothing allocated
    t = by[str(JOBS["timeout"])][0]
    assert t.state.name == "TIMEOUT" and t.elapsed_s >= 60 and t.shards == 1.0 and t.billing == 3.0
    s = by[f"{JOBS['array_sparse_shard']}_7"][0]
    assert s.shards == 2.0 and s.billing == 5.0 and s.elapsed_s == 4
    one = by[f"{JOBS['scancel_one']}_1"][0]
    assert str(one.state) == "CANCELLED by 0"


def test_sacct_recorded_preempted_then_completed():
    rows = P.parse_sacct(data("sacct_all.txt"))
    p = JOBS["preempted_array"]
    recs = records_for(p, 0, [], rows)
    assert [r.state.name for r in recs.acct] == ["PREEMPTED", "COMPLETED"]
    assert recs.attempts == 2
    figs = sacct_figures(recs.acct, shards_per_gpu=4)
    assert figs["billing/gpu_seconds"] == 1 + 15  # every attempt counts
    assert figs["slurm/attempts"] == 2 and figs["slurm/state"] == "COMPLETED"
    assert figs["slurm/billing_tres_seconds"] == 11.0 * 16
    # the unit's 16 GPU-seconds split over the partitions it materialized, by their measured figures
    parts = dict(apportion_unit_bill(figs["billing/gpu_seconds"], [("a", 10.5), ("b", 3.5)], []))
    assert parts == {"a": pytest.approx(12.0), "b": pytest.approx(4.0)}
    assert sum(parts.values()) == figs["billing/gpu_seconds"]


def test_sacct_pending_record_while_requeued():
    rows = P.parse_sacct(data("sacct_preempted_pending.txt"))
    recs = records_for(JOBS["preempted_array"], 0, P.parse_squeue(data("squeue_preempted.txt")), rows)
    assert [r.state.name for r in recs.acct] == ["PREEMPTED", "PENDING"]  # the requeued attempt waits
    st = task_state(recs, job_label="x_0", submitted_age_s=5)
    assert st.status == WorkerStatus.REQUEUED and "BeginTime" in st.message


def test_sacct_hand_forms():
    text = (
        "123_[4-9%2]|123|PENDING|0:0|0:0|00:00:00|0||normal|gpu|2026-11-30T00:00:00|Unknown|Unknown|None assigned|x\n"
        "124|124|CANCELLED+|0:15|0:0|1-02:03:04|93784|billing=11,cpu=1,gres/gpu:a100=2,mem=2G,node=1|high|gpu|"
        "2026-11-30T00:00:00|2026-11-30T00:00:01|2026-12-01T02:03:05|vm|name|with|bars\n"
        "124.batch|124.batch|CANCELLED|0:15|||0|cpu=1|||||||batch\n"
    )
    rows = P.parse_sacct(text)
    assert len(rows) == 2  # the .batch step line is skipped
    assert list(rows[0].id.task_ids()) == [4, 5, 6, 7, 8, 9] and rows[0].start is None
    r = rows[1]
    assert r.state.name == "CANCELLED" and r.state.truncated and (r.exit_code, r.signal) == (0, 15)
    assert r.gpus == 2.0 and r.alloc_tres["mem"] == 2 * 1024**3 and r.name == "name|with|bars"
    assert P.parse_duration("1-02:03:04") == 93784 and P.parse_duration("0:04") == 4
    assert P.parse_duration("UNLIMITED") is None


# ------------------------------------------------------------------------------- task_state rules
def test_task_state_rules_on_recorded_outputs():
    q = P.parse_squeue(data("squeue_all_done.txt"))
    a = P.parse_sacct(data("sacct_all.txt"))
    one = task_state(records_for(JOBS["scancel_one"], 1, q, a), job_label="38_1", submitted_age_s=100)
    assert one.status == WorkerStatus.FAILED and "CANCELLED" in one.message and "ExitCode 0:0" in one.message
    ok = task_state(records_for(JOBS["array_throttled"], 3, q, a), job_label="t", submitted_age_s=100)
    assert ok.status == WorkerStatus.SUCCEEDED and ok.exit_code == 0
    # purged from squeue: sacct decides; the preempted-then-completed task succeeded
    pre = task_state(records_for(JOBS["preempted_array"], 0, [], a), job_label="t", submitted_age_s=100)
    assert pre.status == WorkerStatus.SUCCEEDED
    fail = task_state(records_for(JOBS["exit3"], 0, [], []), job_label="t", submitted_age_s=5)
    assert fail.status == WorkerStatus.PENDING  # just submitted, not visible yet
    gone = task_state(records_for(JOBS["exit3"], 0, [], []), job_label="t", submitted_age_s=500)
    assert gone.status == WorkerStatus.FAILED and "unknown to squeue and sacct" in gone.message


# --------------------------------------------------- a runaway job: recorded with record_runaway_fixtures.py
def test_recorded_runaway_tasks_are_a_bounded_wait_until_sacct_has_their_end():
    aid = json.loads((DATA / "runaway_jobs.json").read_text())["runaway_array"]
    assert "Invalid job id specified" in data("squeue_runaway.txt")  # the controller lost the array
    a = P.parse_sacct(data("sacct_runaway.txt"))
    for tid in (0, 1):
        recs = records_for(aid, tid, [], a)
        assert [r.state.name for r in recs.acct] == ["RUNNING"] and recs.acct[0].end is None
        assert task_wait_class(recs) == "runaway"
        st = task_state(recs, job_label=f"{aid}_{tid}", submitted_age_s=10**5, waited_s=1799)
        assert (st.status, st.message) == (WorkerStatus.RUNNING, f"Slurm array task {aid}_{tid} is RUNNING (sacct)")
        late = task_state(recs, job_label=f"{aid}_{tid}", submitted_age_s=10**5, waited_s=1800)
        assert late.status == WorkerStatus.FAILED and "wait_limits_seconds.runaway = 1800 s" in late.message
        off = task_state(recs, job_label="x", submitted_age_s=10**6, waited_s=10**6, wait_limits=WaitLimits(runaway=0))
        assert off.status == WorkerStatus.RUNNING
    # the administrator's fix: COMPLETED, End = Start; a final record is no wait, and bills 0 s
    fixed = P.parse_sacct(data("sacct_runaway_fixed.txt"))
    recs = records_for(aid, 0, [], fixed)
    assert task_wait_class(recs) is None
    assert task_state(recs, job_label="x", submitted_age_s=10**5, waited_s=10**5).status == WorkerStatus.SUCCEEDED
    assert sacct_figures(recs.acct, shards_per_gpu=4)["billing/gpu_seconds"] == 0
    # a task squeue still lists is never runaway, whatever sacct says
    q = P.parse_squeue(f"{aid}_0|3|{aid}|0|RUNNING|None|N/A|normal|gpu|gres:gpu:1|runaway-fixture\n")
    assert task_wait_class(records_for(aid, 0, q, a)) is None


def test_recorded_reused_job_id_keeps_only_the_records_of_our_submission():
    ids = json.loads((DATA / "runaway_jobs.json").read_text())
    aid, ours = ids["reused_array"], ids["reused_id_submitted_at"]
    a = P.parse_sacct(data("sacct_reused_id.txt"))
    for tid in (0, 1):
        every = records_for(aid, tid, [], a)
        assert "CANCELLED" in [r.state.name for r in every.acct]  # the array slurmctld ended, then ours
        assert {r.id.raw for r in every.acct} == {f"{aid}_{tid}"} and len(every.acct) >= 2
        mine = records_for(aid, tid, [], a, submitted_at=ours)
        assert [(r.name, r.state.name) for r in mine.acct] == [("reused-id-fixture", "COMPLETED")] and mine.attempts == 1
        assert sacct_figures(mine.acct, shards_per_gpu=4)["billing/gpu_seconds"] == 4
        assert sacct_figures(every.acct, shards_per_gpu=4)["billing/gpu_seconds"] > 4  # the other job's time too
    assert acct_since(a, ours - SUBMIT_SLACK_S) == a  # within the slack: kept


# ------------------------------------------------------------------------- config / sdiag / sbatch
def test_show_config_recorded():
    cfg = P.parse_show_config(data("scontrol_show_config.txt"))
    assert P.max_array_size(cfg) == 1001
    assert cfg["SLURM_VERSION"] == "22.05.8" and cfg["ClusterName"] == "dagstergpu"
    assert cfg["PreemptType"] == "preempt/qos" and cfg["PreemptMode"] == "REQUEUE"
    assert cfg["GresTypes"] == "gpu,shard"
    with pytest.raises(P.SlurmParseError):
        P.max_array_size({})


def test_sdiag_recorded():
    s = P.parse_sdiag(data("sdiag.txt"))
    assert s.jobs_submitted >= 8 and s.jobs_started >= 8
    assert s.rpc_by_type["REQUEST_SUBMIT_BATCH_JOB"] >= 8
    assert s.rpc_by_user.get("root", 0) > 0 and s.rpc_total >= s.rpc_by_type["REQUEST_SUBMIT_BATCH_JOB"]


def test_sbatch_outputs_recorded():
    assert P.parse_sbatch_parsable("123\n") == (123, None)
    assert P.parse_sbatch_parsable("123;dagstergpu\n") == (123, "dagstergpu")
    with pytest.raises(P.SlurmParseError):
        P.parse_sbatch_parsable("sbatch: error\n")
    t = P.parse_test_only(data("sbatch_test_only.stderr.txt"))
    assert t.processors == 1 and t.nodes and t.slurm_partition == "gpu" and isinstance(t.start, datetime)
    assert P.error_message(data("sbatch_reject_array.stderr.txt")) == "Batch job submission failed: Invalid job array specification"
    assert "Invalid account" in P.error_message(data("sbatch_reject_account.stderr.txt"))
    assert "Invalid qos" in P.error_message(data("sbatch_reject_qos.stderr.txt"))
    assert "Requested node configuration is not available" in P.error_message(data("sbatch_reject_gres.stderr.txt"))
    assert P.error_message(data("sbatch_reject_partition.stderr.txt")).endswith("Invalid partition name specified")


def test_sinfo_gres_recorded():
    line = data("sinfo_gres.txt").strip()
    assert gpu_count(line.split("|", 1)[1]) == 4
    assert gpu_count("gpu:a100:2(S:0-1),shard:8") == 2 and gpu_count("(null)") == 0


# ------------------------------------------------- fields Slurm fills with a word instead of a value
UNKNOWN_WORDS = ["Unknown", "None", "INVALID", "Partition_Limit", "UNLIMITED", "N/A", "NOT_SET", "(null)", "", " unknown "]


@pytest.mark.parametrize("word", UNKNOWN_WORDS)
def test_unknown_words_parse_to_none_in_every_typed_field(word):
    assert P.parse_duration(word) is None
    assert P.parse_time(word) is None
    assert P.parse_count(word) is None
    assert P.parse_exit_code(word) == (None, None)
    assert P.parse_tres(f"cpu=1,billing={word},gres/gpu=1") == {"cpu": 1.0, "gres/gpu": 1.0}


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("1-02:03:04", 93784),  # sacct Elapsed of a long task
        ("45:30.500", 2730.5),  # minutes:seconds with milliseconds (sacct TotalCPU style)
        ("00:00:00.123", 0.123),
        ("02:03:04", 7384),
        ("0:04", 4),
        ("1-02:03", 93780),  # sbatch --time days-hours:minutes (not minutes:seconds)
        ("1-02", 93600),
        ("90", 5400),  # plain minutes
        ("2-00:00:00", 172800),
    ],
)
def test_durations_are_exact(text, seconds):
    assert P.parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["soon", "1:2:3:4", "-5", "1-", "12.5", "01:xx"])
def test_malformed_durations_still_raise(bad):
    with pytest.raises(P.SlurmParseError, match="not a Slurm duration"):
        P.parse_duration(bad)


def test_sacct_rows_with_unknown_words_parse_and_bill_exactly():
    text = (
        # cancelled while pending (recorded form: Start None)
        "35_0|36|CANCELLED by 0|0:0|0:0|00:00:00|0||normal|gpu|2026-11-30T15:32:16|None|2026-11-30T15:32:20|None assigned|n\n"
        # slurmdbd could not time it: ElapsedRaw INVALID, Elapsed known -> Elapsed counts
        "40|40|COMPLETED|0:0|0:0|1-02:03:04|INVALID|billing=11,gres/gpu=1|normal|gpu|2026-11-30T00:00:00|"
        "2026-11-30T00:00:01|2026-12-01T02:03:05|vm|n\n"
        # nothing known about time or exit code
        "41|41|PENDING|Unknown|Unknown|INVALID|Unknown|billing=INVALID|normal|gpu|Unknown|Unknown|Unknown|None assigned|n\n"
        "42|42|COMPLETED|0:0|0:0|45:30.500|Unknown|gres/gpu=2|normal|gpu|2026-11-30T00:00:00|2026-11-30T00:00:00|2026-11-30T00:45:30|vm|n\n"
    )
    a, b, c, d = P.parse_sacct(text)
    assert (a.start, a.elapsed_s, a.alloc_tres, a.gpus) == (None, 0, {}, 0.0)
    assert b.elapsed_s == 93784 and b.billing == 11.0
    assert (c.exit_code, c.signal, c.derived_exit_code, c.elapsed_s, c.submit, c.alloc_tres) == (None, None, None, 0, None, {})
    assert c.state.status == WorkerStatus.PENDING
    assert d.elapsed_s == 2730.5 and d.gpus * d.elapsed_s == 5461.0


def test_squeue_rows_with_unknown_words():
    text = "CLUSTER: gpu2\n77|77|77|N/A|PENDING|None|Unknown|normal|gpu|N/A|n\n78_1|79|78|1|Unknown|None|N/A|normal|gpu|gres:gpu:1|n\n"
    a, b = P.parse_squeue(text)  # the `squeue -M` banner is not a row
    assert (a.array_task_ids, a.start, a.state.name, a.reason) == ((), None, "PENDING", "None")
    assert (b.array_task_id, b.state.status) == (1, WorkerStatus.UNKNOWN)
    assert parse_array_task_field("None") == ((), None) and parse_array_task_field("(null)") == ((), None)


@pytest.mark.parametrize(
    "out, expected",
    [
        ("38;dagstergpu\n", (38, "dagstergpu")),  # recorded: sbatch --parsable -M dagstergpu on the local cluster
        ("123;gpu2", (123, "gpu2")),
        ("123;gpu2;extra", (123, "gpu2")),  # never the cluster "gpu2;extra"
        ("sbatch: warning: x\n123;gpu2\n", (123, "gpu2")),
        ("123;\n", (123, None)),
    ],
)
def test_sbatch_parsable_cluster(out, expected):
    assert P.parse_sbatch_parsable(out) == expected


@pytest.mark.parametrize("bad", ["123;-x", "123;gpu 2", "123;gpu/2", ";gpu2", "x;gpu2"])
def test_sbatch_parsable_rejects_a_malformed_cluster_or_id(bad):
    with pytest.raises(P.SlurmParseError):
        P.parse_sbatch_parsable(bad)


# --------------------------------------------------------- held tasks: recorded on the local cluster
HELD = json.loads((DATA / "held_jobs.json").read_text())["held_array"]


def test_recorded_held_tasks_are_held_waits():
    q = P.parse_squeue(data("squeue_held.txt"))
    a = P.parse_sacct(data("sacct_held.txt"))
    by_task = {r.array_task_id: r for r in q}
    assert (by_task[0].state.name, by_task[0].reason) == ("PENDING", "job requeued in held state")  # requeuehold
    assert (by_task[1].state.name, by_task[1].state.status) == ("SPECIAL_EXIT", WorkerStatus.REQUEUED)
    assert (by_task[2].state.name, by_task[2].reason) == ("PENDING", "JobHeldAdmin")  # scontrol hold
    for tid in (0, 1, 2):
        recs = records_for(HELD, tid, q, a)
        assert queue_wait_class(recs) == "held"
        st = task_state(recs, job_label=f"{HELD}_{tid}", submitted_age_s=100, waited_s=1799)
        assert st.status in (WorkerStatus.REQUEUED, WorkerStatus.PENDING), st
        late = task_state(recs, job_label=f"{HELD}_{tid}", submitted_age_s=2000, waited_s=1800)
        assert late.status == WorkerStatus.FAILED
        assert late.message.startswith(f"Slurm array task {HELD}_{tid} is {by_task[tid].state} (reason {by_task[tid].reason}): ")
        assert f"held until an administrator releases it (scontrol release {HELD}_{tid}); waited 1800 s, over the Slurm " \
               "backend's wait_limits_seconds.held = 1800 s, so the task is cancelled" in late.message
    # no limit: waits as long as it takes
    off = task_state(records_for(HELD, 1, q, a), job_label="x", submitted_age_s=10**6, waited_s=10**6, wait_limits=WaitLimits(held=0))
    assert off.status == WorkerStatus.REQUEUED


def test_recorded_held_tasks_cancelled():
    q = P.parse_squeue(data("squeue_held_cancelled.txt"))
    a = P.parse_sacct(data("sacct_held_cancelled.txt"))
    for tid in (0, 1, 2):
        recs = records_for(HELD, tid, q, a)
        assert [r.state.name for r in recs.acct] == ["REQUEUED", "CANCELLED"] and recs.acct[-1].start is None
        st = task_state(recs, job_label="x", submitted_age_s=100, waited_s=10**6)
        assert (st.status, st.message) == (WorkerStatus.FAILED, "Slurm array task x ended CANCELLED, ExitCode 0:0")
        assert sacct_figures(recs.acct, shards_per_gpu=4)["billing/gpu_seconds"] == 1  # the one attempt that ran 1 s


@pytest.mark.parametrize(
    "state, reason, wait, limit_field",
    [
        ("PREEMPTED", "None", "preempted", "preempted"),
        ("SUSPENDED", "None", "suspended", "suspended"),
        ("STOPPED", "None", "suspended", "suspended"),
        ("PENDING", "Resources", "pending", "pending"),
        ("PENDING", "JobHeldUser", "held", "held"),
        ("REQUEUE_HOLD", "None", "held", "held"),
        ("COMPLETING", "None", "completing", "completing"),
        ("CONFIGURING", "None", "pending", "pending"),
    ],
)
def test_every_non_terminal_wait_is_bounded(state, reason, wait, limit_field):
    row = P.parse_squeue(f"90_0|90|90|0|{state}|{reason}|N/A|normal|gpu|gres:gpu:1|n\n")
    recs = records_for(90, 0, row, [])
    assert queue_wait_class(recs) == wait
    limits = WaitLimits(**{limit_field: 7.0})
    assert task_state(recs, job_label="90_0", submitted_age_s=100, waited_s=6.9, wait_limits=limits).status != WorkerStatus.FAILED
    st = task_state(recs, job_label="90_0", submitted_age_s=100, waited_s=7.0, wait_limits=limits)
    assert st.status == WorkerStatus.FAILED
    assert f"is {state} (reason {reason})" in st.message and f"wait_limits_seconds.{wait} = 7 s" in st.message


def test_running_is_not_a_wait_and_limits_are_validated():
    recs = records_for(90, 0, P.parse_squeue("90_0|90|90|0|RUNNING|None|N/A|normal|gpu|gres:gpu:1|n\n"), [])
    assert queue_wait_class(recs) is None
    assert task_state(recs, job_label="x", submitted_age_s=1e9, waited_s=1e9).status == WorkerStatus.RUNNING
    assert WaitLimits.from_mapping({"held": 60}) == WaitLimits(held=60.0)
    assert WaitLimits.from_mapping(None) == WaitLimits()
    with pytest.raises(ValueError, match="unknown wait limit"):
        WaitLimits.from_mapping({"hold": 60})
    with pytest.raises(ValueError, match=">= 0"):
        WaitLimits.from_mapping({"held": -1})


def test_wait_limits_from_the_executor_config():
    from dagster._config import process_config

    from dagster_gpu.slurm.backend import SlurmSettings, config_field

    ok = process_config(config_field().config_type, {"wait_limits_seconds": {"held": 60, "pending": 0}})
    assert ok.success
    assert SlurmSettings.from_section(ok.value).wait_limits == WaitLimits(held=60.0, pending=0.0)
    assert SlurmSettings().wait_limits == WaitLimits()
    bad = process_config(config_field().config_type, {"wait_limits_seconds": {"hold": 60}})
    assert not bad.success and 'unexpected config entry "hold"' in bad.errors[0].message


# ------------------------------------------------------------------------------------------ requeue and slurmdbd lag
REQUEUE = DATA / "requeue"  # a real preemption with requeue on Slurm 22.05: see requeue/README.md
REQUEUED_ARRAY = 795


def _requeue(name: str) -> str:
    return (REQUEUE / name).read_text()


def test_recorded_rerun_is_billed_only_once_sacct_has_its_record():
    from dagster_gpu.slurm.status import sacct_caught_up

    done_q = P.parse_squeue(_requeue("squeue_rerun_completed.txt"))
    lagging = records_for(REQUEUED_ARRAY, 0, done_q, P.parse_sacct(_requeue("sacct_preempted_only.txt")))
    # squeue: the rerun COMPLETED; sacct (lagging): only the PREEMPTED attempt, which looks final
    assert lagging.queue.state.name == "COMPLETED" and [str(r.state) for r in lagging.acct] == ["PREEMPTED"]
    assert not sacct_caught_up(lagging.queue, lagging.acct)
    full = records_for(REQUEUED_ARRAY, 0, done_q, P.parse_sacct(_requeue("sacct_rerun_completed.txt")))
    assert sacct_caught_up(full.queue, full.acct)
    figures = sacct_figures(full.acct, shards_per_gpu=8)
    assert figures["slurm/attempts"] == 2 and figures["slurm/attempt_states"] == "PREEMPTED,COMPLETED"
    assert figures["slurm/elapsed_seconds"] == 1 + 10 and figures["billing/gpu_seconds"] == 11.0
    # the other tasks ran once: caught up
    for tid in (1, 2, 3):
        other = records_for(REQUEUED_ARRAY, tid, done_q, P.parse_sacct(_requeue("sacct_preempted_only.txt")))
        assert sacct_caught_up(other.queue, other.acct)
    # while the rerun is pending squeue's %S is its expected start; no record of it in sacct yet is "not caught up"
    # only for a started attempt: a pending row is never billed (it is not terminal)
    assert sacct_caught_up(None, lagging.acct) and not sacct_caught_up(done_q[0], ())


def _spool_with_array(tmp_path, tasks: int):
    from dagster_gpu.slurm.spool import Spool, write_json

    sp = Spool(tmp_path / "spool")
    bdir = sp.batch_dir("b1")
    bdir.mkdir(parents=True)
    submitted = datetime(2026, 12, 1, 23, 55, 2).timestamp()
    write_json(bdir / "submitted.json", {"array_job_id": REQUEUED_ARRAY, "tasks": tasks, "submitted_at": submitted})
    return sp, bdir


@pytest.mark.parametrize(
    "squeue_file,sacct_file,done",
    [
        ("squeue_rerun_completed.txt", "sacct_preempted_only.txt", False),  # slurmdbd lags the rerun
        ("squeue_rerun_completed.txt", "sacct_rerun_pending.txt", False),  # the rerun's record is not final
        ("squeue_preempted_pending.txt", "sacct_preempted_only.txt", False),  # squeue: the rerun is pending
        ("squeue_rerun_completed.txt", "sacct_rerun_completed.txt", True),
    ],
)
def test_recorded_requeue_marks_the_array_done_only_when_every_attempt_is_recorded(tmp_path, squeue_file, sacct_file, done):
    from dagster_gpu.slurm.poller import Poll, SharedPoller

    sp, bdir = _spool_with_array(tmp_path, 4)
    snap = Poll(started_at=0.0, ids=frozenset({REQUEUED_ARRAY}), queue=tuple(P.parse_squeue(_requeue(squeue_file))),
                acct=tuple(P.parse_sacct(_requeue(sacct_file))))  # fmt: skip
    SharedPoller(sp, client=None)._mark_done(snap)  # type: ignore[arg-type]
    assert (bdir / "done").exists() is done


# ------------------------------------------------- outputs recorded on other clusters (data/slurm/elsewhere)
ELSEWHERE = DATA / "elsewhere"


def test_a_refusal_after_a_job_submit_plugins_passed_line_is_the_error():
    """A site job_submit filter printed ``Verification: ***PASSED***`` and Slurm refused the job on the next
    line (recorded verbatim on a production cluster, see data/slurm/elsewhere/README.md): the error is the
    refusal, never the plugin's verdict."""
    stderr = (ELSEWHERE / "sbatch_job_submit_passed_then_refused.stderr.txt").read_text()
    assert P.error_message(stderr) == "allocation failure: Invalid account or account/partition combination specified"
    # the same plugin line before sbatch's own prefixed refusal
    stderr2 = "sbatch: error: Verification: ***PASSED***\nsbatch: error: Batch job submission failed: Invalid qos specification\n"
    assert P.error_message(stderr2) == "Batch job submission failed: Invalid qos specification"
    # a plugin that passed with nothing after it is still reported (last line), not dropped
    assert P.error_message("sbatch: error: Verification: ***PASSED***\n") == "sbatch: error: Verification: ***PASSED***"
    # the refusal the recorded 22.05 cluster prints stays as it was
    assert P.error_message(data("sbatch_reject_account.stderr.txt")).endswith("Invalid account or account/partition combination specified")


def test_a_tres_field_of_null_is_empty():
    """``AllocTRES=(null)``: a TRES string Slurm never set (a job still pending, or cancelled while pending)."""
    assert P.parse_tres("(null)") == {}
    assert P.parse_tres(" (null) ") == {}
    assert P.parse_tres("billing=2,cpu=1,gres/gpu=1,mem=4G,node=1")["gres/gpu"] == 1.0
    with pytest.raises(P.SlurmParseError):
        P.parse_tres("cpu")  # still a malformed item, not an unknown word


def test_a_pending_array_with_a_stepped_index_range_parses():
    j = parse_job_id("8123_[1-13:2%4]")
    assert (j.job_id, j.throttle, j.is_compact) == (8123, 4, True)
    assert list(j.task_ids()) == [1, 3, 5, 7, 9, 11, 13]
    assert list(parse_job_id("8123_[0,2-18:2]").task_ids()) == [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]
    assert parse_array_task_field("1-13:2%4") == (tuple((i, i) for i in range(1, 14, 2)), 4)
    assert parse_array_task_field("2-18:2%9")[1] == 9  # SchedMD's own unit test's string
    (row,) = P.parse_squeue((ELSEWHERE / "squeue_pending_stepped.txt").read_text())
    assert (row.array_job_id, row.throttle, row.state.status) == (8123, 4, WorkerStatus.PENDING)
    assert [a for a, _ in row.array_task_ids] == [1, 3, 5, 7, 9, 11, 13]
    for bad in ("8123_[1-13:0]", "8123_[1-13:]", "8123_[5:2]", "8123_[13-1:2]", "8123_[1-13:x]"):
        with pytest.raises(BadJobId):
            parse_job_id(bad)
