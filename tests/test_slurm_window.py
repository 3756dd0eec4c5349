"""The coalescing window rule (pure) and the coalescer applying it per sbatch-options group on a real spool.

sbatch is replaced by a recording client here only: the coalescer's real submissions are covered on the
cluster by tests/test_slurm_e2e.py."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from dagster_gpu.slurm.client import SlurmClient, SubmittedJob
from dagster_gpu.slurm.coalescer import ArrayCoalescer, TaskRequest, group_key
from dagster_gpu.slurm.spool import Spool, write_json
from dagster_gpu.slurm.window import WindowRule, decide_flush

RULE = WindowRule(window_s=2.0, max_window_s=15.0, hard_cap_s=120.0)


@pytest.mark.parametrize(
    "created, backlog, throttle, due, reason_has",
    [
        ([101.0, 109.0], None, 4, False, "window open"),  # last launch 1 s ago, oldest 9 s
        ([100.0, 107.5], None, 4, True, "no launch for 2.5s"),  # quiet gap
        ([100.0, 105.0, 109.5], None, 4, True, "waited 10.0s (max window 10s)"),  # not quiet, but long enough
        ([100.0, 107.5], 4, 4, False, "4 pending tasks"),  # quiet, but the earlier arrays' backlog holds it
        ([100.0, 107.5], 3, 4, True, "no launch for 2.5s"),  # backlog below the throttle
        ([100.0, 107.5], 1, 0, False, "1 pending tasks (hold at >= 1)"),  # unthrottled: any backlog holds
        ([100.0, 107.5], 0, 0, True, "no launch"),
    ],
)
def test_decide_flush(created, backlog, throttle, due, reason_has):
    rule = WindowRule(window_s=2.0, max_window_s=10.0, hard_cap_s=120.0)
    d = decide_flush(rule, 110.0, created, chunk=100, backlog=backlog, throttle=throttle)
    assert (d.due, reason_has in d.reason) == (due, True), d


def test_hard_cap_and_full_array_override_the_backlog_hold():
    d = decide_flush(RULE, 1000.0, [879.0, 999.9], chunk=100, backlog=50, throttle=4)
    assert d.due and "waited 121.0s (cap 120s)" in d.reason
    d = decide_flush(RULE, 1000.0, [999.0] * 3, chunk=3, backlog=50, throttle=4)
    assert d.due and "3 launches fill an array of 3" in d.reason
    held = decide_flush(RULE, 1000.0, [881.0, 990.0], chunk=100, backlog=50, throttle=4)
    assert not held.due


def test_explicit_backlog_threshold_and_off():
    assert not decide_flush(WindowRule(backlog_tasks=2), 10.0, [0.0], 100, backlog=2, throttle=8).due
    assert decide_flush(WindowRule(backlog_tasks=2), 10.0, [0.0], 100, backlog=1, throttle=8).due
    assert decide_flush(WindowRule(backlog_tasks=0), 10.0, [0.0], 100, backlog=500, throttle=8).due


def test_rule_validation():
    with pytest.raises(ValueError, match="must not be negative"):
        WindowRule(window_s=-1)
    with pytest.raises(ValueError, match="no pending launches"):
        decide_flush(RULE, 0.0, [], 10, None)


@dataclass
class RecordingClient(SlurmClient):
    """Stands in for sbatch: records each call's options (``submitted``) and hands out job ids 500, 501, …"""

    submitted: list[list[str]] = field(default_factory=list)

    def submit(self, script, options, *, script_args=(), attempts=None) -> int:
        self.submitted.append(list(options))
        return 500 + len(self.submitted) - 1

    def submit_job(self, script, options, *, script_args=(), attempts=None) -> SubmittedJob:
        return SubmittedJob(self.submit(script, options, script_args=script_args, attempts=attempts))

    def max_array_size(self) -> int:
        return 1001


def _queue(spool: Spool, options: tuple[str, ...], created: float, key: str, to_come: int | None = None,
           partitions: int = 1) -> None:
    req = TaskRequest(
        options=options, throttle=4, argv=("true",), env={}, run_id="r", step_key="s", launches_to_come=to_come,
        partition_keys=(key, *(f"{key}-{i}" for i in range(1, partitions))),
    )
    doc = {**req.__dict__, "options": list(options), "argv": ["true"], "env": {}, "created": created}
    write_json(spool.pending / f"{time.time_ns():020d}-{req.launch_id}.json", doc)


def test_backlog_holds_only_the_group_whose_arrays_have_pending_tasks(tmp_path):
    spool = Spool(tmp_path / "spool")
    client = RecordingClient()
    pending: dict[int, int] = {}
    co = ArrayCoalescer(spool, client, python="python3", rule=RULE, pending_tasks=lambda: pending)
    gpu, shard = ("--gres=gpu:1",), ("--gres=shard:1",)
    old = time.time() - 5  # quiet for 5 s: due by the window alone
    for i in range(3):
        _queue(spool, gpu, old, f"g{i}")
    assert co.flush_due() == 1 and client.submitted[0][-4].startswith("--array=0-2%4")
    sub = spool.active_batches()[0][1]
    assert sub["array_job_id"] == 500 and sub["group"] == group_key(gpu, 4)

    pending[500] = 4  # array 500 still has 4 pending tasks (>= throttle 4): the next gpu launches wait
    for i in range(2):
        _queue(spool, gpu, old, f"g{3 + i}")
        _queue(spool, shard, old, f"s{i}")
    assert co.flush_due() == 1  # only the shard group (no backlog of its own) goes
    assert client.submitted[1][0] == "--gres=shard:1" and "4 pending tasks" in co.last_decisions[group_key(gpu, 4)].reason
    assert len(list(spool.pending.glob("*.json"))) == 2

    pending[500] = 3  # backlog below the throttle: the held launches go as one array
    assert co.flush_due() == 1 and client.submitted[2][0] == "--gres=gpu:1" and client.submitted[2][-4].startswith("--array=0-1%4")
    assert not list(spool.pending.glob("*.json"))


def test_unknown_backlog_never_holds(tmp_path):
    spool = Spool(tmp_path / "spool")
    client = RecordingClient()
    co = ArrayCoalescer(spool, client, python="python3", rule=RULE, pending_tasks=lambda: None)
    _queue(spool, ("--gres=gpu:1",), time.time() - 5, "a")
    assert co.flush_due() == 1


def test_hold_cap_must_fit_in_the_submit_timeout(tmp_path):
    with pytest.raises(ValueError, match="at most 144s"):
        ArrayCoalescer(Spool(tmp_path), RecordingClient(), python="p", rule=WindowRule(hard_cap_s=150.0), max_wait_s=180.0)


@pytest.mark.parametrize(
    "created, to_come, partitions, due, reason_has",
    [
        ([100.0, 108.0], 5, None, False, "5 more run(s) of the backfill can start: holding 2 launch(es) (2 partition(s)) for an array of 4"),
        ([100.0, 108.0], 0, None, True, "no launch for 2.0s"),  # the backfill has no more runs to start
        ([100.0, 108.0], None, None, True, "no launch for 2.0s"),  # not a backfill: the quiet gap alone
        ([100.0, 101.0, 102.0, 108.0], 5, None, True, "no launch for 2.0s"),  # the target of 4 is reached
        ([80.0, 90.0], 5, None, True, "no launch for 20.0s"),  # launches stopped coming: no hold past max_window_s
        ([0.0, 108.0], 5, None, True, "oldest launch waited 110.0s (cap 100s)"),
        ([100.0, 108.0], 5, 3, False, "holding 2 launch(es) (3 partition(s))"),  # small ranges: still below 4
        ([108.0], 5, None, False, "holding 1 launch(es) (1 partition(s))"),
        ([108.0], 5, 500, True, "no launch for 2.0s"),  # a ranged launch of 500 partitions: the quiet gap only
    ],
)
def test_backfill_hold(created, to_come, partitions, due, reason_has):
    rule = WindowRule(window_s=2.0, max_window_s=15.0, hard_cap_s=100.0, target_tasks=4)
    d = decide_flush(rule, 110.0, created, chunk=100, backlog=None, throttle=4, to_come=to_come, partitions=partitions)
    assert d.due == due and reason_has in d.reason, d


def test_backfill_hold_uses_the_newest_launch_and_can_be_turned_off(tmp_path):
    spool = Spool(tmp_path / "spool")
    client = RecordingClient()
    co = ArrayCoalescer(spool, client, python="python3", rule=WindowRule(window_s=2.0, target_tasks=4))
    now = time.time()
    _queue(spool, ("--gres=gpu:1",), now - 9, "a", to_come=None)
    _queue(spool, ("--gres=gpu:1",), now - 5, "b", to_come=3)  # the newest knows the backfill goes on
    assert co.flush_due() == 0 and "3 more run(s)" in next(iter(co.last_decisions.values())).reason
    off = ArrayCoalescer(spool, client, python="python3", rule=WindowRule(window_s=2.0, target_tasks=0))
    assert off.flush_due() == 1 and client.submitted[0][-4].startswith("--array=0-1%4")


def test_a_ranged_runs_launch_is_not_held_for_the_next_run(tmp_path):
    spool = Spool(tmp_path / "spool")
    client = RecordingClient()
    co = ArrayCoalescer(spool, client, python="python3", rule=WindowRule(window_s=2.0, target_tasks=10))
    now = time.time()
    _queue(spool, ("--gres=gpu:1",), now - 3, "r0", to_come=1, partitions=500)  # the unit of a 500-partition run
    assert co.flush_due() == 1 and client.submitted[0][-4] == "--array=0%4"
    _queue(spool, ("--gres=gpu:1",), now - 3, "p0", to_come=1, partitions=1)  # a one-partition run: held
    assert co.flush_due() == 0 and "(1 partition(s)) for an array of 10" in next(iter(co.last_decisions.values())).reason
