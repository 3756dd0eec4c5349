"""The state of one array task from one squeue + sacct snapshot (pure, no I/O).

Rules (``A_i`` = array task i of array job A):

1. squeue lists ``A_i`` (it keeps finished jobs for MinJobAge, 300 s by default):
   PENDING after an earlier attempt (sacct has a PREEMPTED/REQUEUED record of it) -> REQUEUED,
   a PREEMPTED that squeue still shows after ``preempt_grace_s`` -> FAILED (preempted, not requeued),
   otherwise the state map of :mod:`dagster_gpu.slurm.states`.
2. squeue does not list it: the latest sacct record decides; a latest record of PREEMPTED means the
   job was not requeued -> FAILED.
3. Neither knows it: PENDING while the submission is younger than ``vanish_grace_s`` (squeue and
   slurmdbd lag a new submission slightly), then FAILED ("unknown to squeue and sacct").

The message always names the Slurm state and, when known, the exit code (``ExitCode 3:0``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Iterable, Sequence

from dagster_gpu.contracts import WorkerState, WorkerStatus
from dagster_gpu.slurm.parse import AcctRow, QueueRow


@dataclass(frozen=True)
class TaskRecords:
    """What one snapshot says about one array task: its squeue row (or None) and its sacct records
    (one per attempt, oldest first)."""

    queue: QueueRow | None
    acct: tuple[AcctRow, ...]

    @property
    def attempts(self) -> int:
        """Attempts that started (sacct records with a start time)."""
        return sum(1 for r in self.acct if r.start is not None)


def records_for(array_job_id: int, task_id: int, queue: Iterable[QueueRow], acct: Iterable[AcctRow]) -> TaskRecords:
    """Select task ``array_job_id``_``task_id`` from a snapshot (compact pending lines included)."""
    q = None
    for r in queue:
        if r.array_job_id == array_job_id and any(a <= task_id <= b for a, b in r.array_task_ids):
            q = r
            if r.array_task_id == task_id:
                break
    rows = [
        r
        for r in acct
        if r.id.job_id == array_job_id and (r.id.task_id == task_id or any(a <= task_id <= b for a, b in r.id.task_ranges))
    ]
    # a requeued attempt gets a new Submit time; the sort is stable, so sacct's order breaks ties
    rows.sort(key=lambda r: r.submit or datetime.min)
    return TaskRecords(queue=q, acct=tuple(rows))


def _exit_text(rows: Sequence[AcctRow]) -> tuple[int | None, str]:
    if not rows:
        return None, ""
    last = rows[-1]
    if last.exit_code is None:
        return None, ""
    return last.exit_code, f", ExitCode {last.exit_code}:{last.signal or 0}"


def task_state(
    recs: TaskRecords,
    *,
    job_label: str,
    submitted_age_s: float,
    preempted_for_s: float = 0.0,
    vanish_grace_s: float = 60.0,
    preempt_grace_s: float = 300.0,
) -> WorkerState:
    """The WorkerState of one task (see the module rules).

    Args:
        recs: the task's records from one snapshot.
        job_label: ``A_i`` for messages.
        submitted_age_s: seconds since the array was submitted.
        preempted_for_s: seconds the caller has seen squeue report PREEMPTED for this task.
    """
    exit_code, exit_txt = _exit_text(recs.acct)
    earlier = [r for r in recs.acct[:-1] if r.state.status == WorkerStatus.REQUEUED] if recs.acct else []
    if recs.queue is not None:
        st = recs.queue.state
        status = st.status
        msg = f"Slurm array task {job_label} is {st} (reason {recs.queue.reason})"
        if status == WorkerStatus.PENDING and (earlier or any(r.state.name == "PREEMPTED" for r in recs.acct)):
            return WorkerState(WorkerStatus.REQUEUED, message=f"{msg} after {len(earlier) or 1} preemption/requeue")
        if st.name == "PREEMPTED" and preempted_for_s >= preempt_grace_s:
            return WorkerState(WorkerStatus.FAILED, exit_code, f"{msg}: preempted and not requeued{exit_txt}")
        if status in (WorkerStatus.SUCCEEDED, WorkerStatus.FAILED):
            # the sacct record of the final attempt carries the exit code
            code = exit_code if recs.acct and recs.acct[-1].state.final else None
            txt = exit_txt if code is not None else ""
            return WorkerState(status, code, f"Slurm array task {job_label} ended {st}{txt}")
        return WorkerState(status, None, msg)
    if recs.acct:
        last = recs.acct[-1]
        if last.state.name == "PREEMPTED":
            return WorkerState(WorkerStatus.FAILED, exit_code, f"Slurm array task {job_label} was PREEMPTED and not requeued{exit_txt}")
        status = last.state.status
        if status in (WorkerStatus.SUCCEEDED, WorkerStatus.FAILED):
            return WorkerState(status, exit_code, f"Slurm array task {job_label} ended {last.state}{exit_txt}")
        return WorkerState(status, None, f"Slurm array task {job_label} is {last.state} (sacct)")
    if submitted_age_s < vanish_grace_s:
        return WorkerState(WorkerStatus.PENDING, None, f"Slurm array task {job_label} submitted {submitted_age_s:.0f}s ago")
    return WorkerState(
        WorkerStatus.FAILED, None, f"Slurm array task {job_label} is unknown to squeue and sacct {submitted_age_s:.0f}s after submission"
    )
