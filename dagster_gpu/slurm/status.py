"""The state of one array task from one squeue + sacct snapshot (pure, no I/O).

Rules (``A_i`` = array task i of array job A):

1. squeue lists ``A_i`` (it keeps finished jobs for MinJobAge, 300 s by default):
   a non-terminal state that has lasted longer than its class's limit (:class:`WaitLimits`; e.g.
   SPECIAL_EXIT or a hold for ``held`` seconds, PREEMPTED not requeued for ``preempted`` seconds)
   -> FAILED, naming the state, its reason and the limit (the caller cancels the task);
   PENDING after an earlier attempt (sacct has a PREEMPTED/REQUEUED record of it) -> REQUEUED,
   otherwise the state map of :mod:`dagster_gpu.slurm.states`.
2. squeue does not list it: the latest sacct record decides; a latest record of PREEMPTED means the
   job was not requeued -> FAILED. A latest record that is not final (RUNNING, PENDING, REQUEUED...)
   while the controller no longer knows the task is the ``runaway`` wait: either the task ended and
   slurmdbd has not recorded it yet (it was down; squeue forgets an ended job after MinJobAge), or
   slurmctld lost the job and sacct will show it running until an administrator fixes the record
   (``sacctmgr show runawayjobs``, Slurm's name for it). Past ``WaitLimits.runaway`` -> FAILED, naming
   both; nothing is cancelled (the controller has nothing to cancel).
3. Neither knows it: PENDING while the submission is younger than ``vanish_grace_s`` (squeue and
   slurmdbd lag a new submission slightly), then FAILED ("unknown to squeue and sacct").

The message always names the Slurm state and, when known, the exit code (``ExitCode 3:0``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Iterable, Mapping, Sequence

from dagster_gpu.contracts import WorkerState, WorkerStatus
from dagster_gpu.slurm.parse import AcctRow, QueueRow
from dagster_gpu.slurm.states import wait_class


@dataclass(frozen=True)
class WaitLimits:
    """The longest a task may stay in each kind of non-terminal wait (seconds; 0 = no limit), measured
    by the caller from when it first saw the task in that kind of wait (:func:`dagster_gpu.slurm.states.wait_class`).

    Attributes:
        held: REQUEUE_HOLD, SPECIAL_EXIT, RESV_DEL_HOLD, or PENDING held (``JobHeldAdmin``, ``JobHeldUser``,
            ``job requeued in held state``): nothing happens until someone runs ``scontrol release``.
        preempted: PREEMPTED still shown by squeue (not requeued).
        suspended: SUSPENDED or STOPPED.
        pending: PENDING / CONFIGURING / REQUEUED for any other reason (Resources, Priority, ...).
        completing: COMPLETING, SIGNALING, STAGE_OUT... after the batch script ended.
        runaway: squeue no longer lists the task, and its latest sacct record is not final (see rule 2
            of the module doc): its worker is not running, whatever sacct says.
    """

    held: float = 1800.0
    preempted: float = 300.0
    suspended: float = 3600.0
    pending: float = 86400.0
    completing: float = 1800.0
    runaway: float = 1800.0

    @classmethod
    def from_mapping(cls, m: Mapping[str, float] | None) -> "WaitLimits":
        """From a config mapping (missing keys keep their defaults). Raises ValueError on an unknown key
        or a negative limit."""
        m = dict(m or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(m) - known)
        if unknown:
            raise ValueError(f"unknown wait limit(s) {unknown}; known: {sorted(known)}")
        bad = {k: v for k, v in m.items() if v is None or float(v) < 0}
        if bad:
            raise ValueError(f"wait limits must be >= 0 seconds (0 = no limit), got {bad}")
        return cls(**{k: float(v) for k, v in m.items()})

    def limit(self, wait: str) -> float:
        """The limit of a wait class (seconds; 0 = none)."""
        return float(getattr(self, wait))


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


#: How much earlier than the submitting process's clock (after ``sbatch`` returned) Slurm may have recorded
#: the array's Submit time (seconds): one sbatch attempt (cut at ``SlurmClient.timeout_s``, 30 s) plus
#: clock skew between the hosts.
SUBMIT_SLACK_S = 120.0


def acct_since(acct: Iterable[AcctRow], submitted_at: float | None) -> list[AcctRow]:
    """The sacct records of our job: those submitted at most :data:`SUBMIT_SLACK_S` before ``submitted_at``
    (epoch seconds: when our ``sbatch`` of the array returned; None keeps all). An older record with the
    same id is another job's: Slurm numbers jobs from ``FirstJobId`` again after ``MaxJobId`` or when
    slurmctld loses its state, and ``sacct --duplicates`` lists every job that ever had the id (sacct(1),
    ``--duplicates``). Sacct prints local time; the controller's clock and time zone are assumed to be
    this host's."""
    if submitted_at is None:
        return list(acct)
    since = datetime.fromtimestamp(submitted_at - SUBMIT_SLACK_S)
    return [r for r in acct if r.submit is None or r.submit >= since]


def records_for(
    array_job_id: int, task_id: int, queue: Iterable[QueueRow], acct: Iterable[AcctRow], submitted_at: float | None = None,
) -> TaskRecords:
    """Select task ``array_job_id``_``task_id`` from a snapshot (compact pending lines included); sacct
    records older than the array's ``submitted_at`` are another job's (:func:`acct_since`)."""
    q = None
    for r in queue:
        if r.array_job_id == array_job_id and any(a <= task_id <= b for a, b in r.array_task_ids):
            q = r
            if r.array_task_id == task_id:
                break
    rows = [
        r
        for r in acct_since(acct, submitted_at)
        if r.id.job_id == array_job_id and (r.id.task_id == task_id or any(a <= task_id <= b for a, b in r.id.task_ranges))
    ]
    # a requeued attempt gets a new Submit time; the sort is stable, so sacct's order breaks ties
    rows.sort(key=lambda r: r.submit or datetime.min)
    return TaskRecords(queue=q, acct=tuple(rows))


#: How much earlier than squeue's start time sacct may print the same attempt's start (seconds): both print
#: whole seconds, from clocks read a moment apart.
START_SLACK_S = 1.0


def sacct_caught_up(queue: QueueRow | None, acct: Sequence[AcctRow]) -> bool:
    """Whether the task's sacct records (oldest first) include the attempt squeue shows.

    squeue's ``%S`` of a started task is the start of its latest attempt, and each attempt gets its own sacct
    record (``--duplicates``). A requeued task's rerun is known to slurmctld before slurmdbd records it (3 s
    on an idle 22.05, ``tests/data/slurm/requeue``): while slurmdbd lags, sacct's latest record is the
    earlier attempt (PREEMPTED, or a final NODE_FAIL when the node failed and Slurm requeued the job) and a
    bill from it would miss the rerun. False then (and when sacct has no record at all); True when squeue does not list
    the task or shows no start (nothing to compare: the sacct records decide)."""
    if queue is None or queue.start is None:
        return True
    if not acct:
        return False
    last = acct[-1].start
    return last is not None and (last - queue.start).total_seconds() >= -START_SLACK_S


def _exit_text(rows: Sequence[AcctRow]) -> tuple[int | None, str]:
    if not rows:
        return None, ""
    last = rows[-1]
    if last.exit_code is None:
        return None, ""
    return last.exit_code, f", ExitCode {last.exit_code}:{last.signal or 0}"


def queue_wait_class(recs: TaskRecords) -> str | None:
    """The wait class of the task's squeue row (None when squeue does not list it, or it is RUNNING or final)."""
    if recs.queue is None:
        return None
    return wait_class(recs.queue.state.name, recs.queue.reason)


def task_wait_class(recs: TaskRecords) -> str | None:
    """The task's wait class: its squeue row's (:func:`queue_wait_class`), or ``runaway`` when squeue does
    not list it and its latest sacct record is not final (rule 2 of the module doc); else None."""
    if recs.queue is not None:
        return queue_wait_class(recs)
    last = recs.acct[-1].state if recs.acct else None
    if last is not None and not last.final and last.name != "PREEMPTED" and last.status != WorkerStatus.UNKNOWN:
        return "runaway"
    return None


def task_state(
    recs: TaskRecords,
    *,
    job_label: str,
    submitted_age_s: float,
    waited_s: float = 0.0,
    wait_limits: WaitLimits = WaitLimits(),
    vanish_grace_s: float = 60.0,
) -> WorkerState:
    """The WorkerState of one task (see the module rules).

    Args:
        recs: the task's records from one snapshot.
        job_label: ``A_i`` for messages.
        submitted_age_s: seconds since the array was submitted.
        waited_s: seconds the caller has seen the task in its current wait class (:func:`task_wait_class`).
        wait_limits: the limit of each wait class; past it the task is FAILED (the caller cancels it).
    """
    exit_code, exit_txt = _exit_text(recs.acct)
    earlier = [r for r in recs.acct[:-1] if r.state.status == WorkerStatus.REQUEUED] if recs.acct else []
    if recs.queue is not None:
        st = recs.queue.state
        status = st.status
        msg = f"Slurm array task {job_label} is {st} (reason {recs.queue.reason})"
        wait = queue_wait_class(recs)
        limit = wait_limits.limit(wait) if wait else 0.0
        if wait and limit > 0 and waited_s >= limit:
            what = {
                "held": f"held until an administrator releases it (scontrol release {job_label})",
                "preempted": "preempted and not requeued",
                "suspended": "suspended",
                "pending": "not started",
                "completing": "still completing after its batch script ended",
            }[wait]
            return WorkerState(
                WorkerStatus.FAILED, exit_code,
                f"{msg}: {what}; waited {waited_s:.0f} s, over the Slurm backend's wait_limits_seconds.{wait} "
                f"= {limit:g} s, so the task is cancelled{exit_txt}",
            )  # fmt: skip
        if status == WorkerStatus.PENDING and (earlier or any(r.state.name == "PREEMPTED" for r in recs.acct)):
            return WorkerState(WorkerStatus.REQUEUED, message=f"{msg} after {len(earlier) or 1} preemption/requeue")
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
        limit = wait_limits.limit("runaway")
        if task_wait_class(recs) == "runaway" and limit > 0 and waited_s >= limit:
            return WorkerState(
                WorkerStatus.FAILED, None,
                f"Slurm array task {job_label} is {last.state} in sacct but unknown to the controller (squeue) for "
                f"{waited_s:.0f} s, over the Slurm backend's wait_limits_seconds.runaway = {limit:g} s: it ended while "
                f"slurmdbd was behind, or slurmctld lost it (a runaway job: sacctmgr show runawayjobs)",
            )  # fmt: skip
        return WorkerState(status, None, f"Slurm array task {job_label} is {last.state} (sacct)")
    if submitted_age_s < vanish_grace_s:
        return WorkerState(WorkerStatus.PENDING, None, f"Slurm array task {job_label} submitted {submitted_age_s:.0f}s ago")
    return WorkerState(
        WorkerStatus.FAILED, None, f"Slurm array task {job_label} is unknown to squeue and sacct {submitted_age_s:.0f}s after submission"
    )
