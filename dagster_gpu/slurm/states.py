"""Slurm job states -> :class:`~dagster_gpu.contracts.WorkerStatus` (pure, no I/O).

Slurm prints a job's state as a long name (``squeue %T``, ``sacct State``: ``RUNNING``,
``CANCELLED by 0``), a short code (``squeue %t``: ``R``, ``CA``), or a name truncated to the column
width with a ``+`` (``sacct`` without ``--parsable``: ``CANCELLED+``). :func:`parse_state` accepts all
three; :func:`worker_status` maps the result.

The map (Slurm 22.05 ``job_state_string``; base states and the flags printed instead of them):

==============================================================  ================
Slurm state                                                     WorkerStatus
==============================================================  ================
PENDING, CONFIGURING, POWER_UP_NODE, RESV_DEL_HOLD              PENDING
RUNNING, COMPLETING, SUSPENDED, STOPPED, SIGNALING, STAGE_OUT,  RUNNING
RESIZING, UPDATE_DB
COMPLETED                                                       SUCCEEDED
FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY,           FAILED
BOOT_FAIL, DEADLINE, REVOKED, RECONFIG_FAIL
PREEMPTED, REQUEUED, REQUEUE_FED, REQUEUE_HOLD, SPECIAL_EXIT,   REQUEUED
LAUNCH_FAILED, EXPEDITING (25.11)
==============================================================  ================

Notes on the less obvious rows:

- COMPLETING: the batch script ended but processes or the epilog are still being cleaned up; the
  outcome is not final, so the step is still RUNNING.
- PREEMPTED: the attempt was preempted. With ``PreemptMode=REQUEUE`` and a requeueable job Slurm puts
  the job back to PENDING (``sacct -D`` keeps the PREEMPTED record of that attempt); the caller must
  decide when a PREEMPTED job that never comes back is final (see ``SlurmBackend``).
- REQUEUE_HOLD / SPECIAL_EXIT: requeued and held until someone releases it; the job will run again
  only then, so it is REQUEUED (never SUCCEEDED/FAILED). Such a job, and a PENDING one whose reason is a
  hold (``JobHeldAdmin``, ``JobHeldUser``, ``job requeued in held state``: what ``scontrol requeuehold``
  shows), never ends by itself: :func:`wait_class` calls it ``held``, and the Slurm backend bounds each
  non-terminal wait class with a limit (:class:`dagster_gpu.slurm.status.WaitLimits`).
- REVOKED: a federated sibling started the job elsewhere; on this cluster it is over (FAILED).
- LAUNCH_FAILED: slurmctld could not launch the batch script and requeues the job.
- EXPEDITING (Slurm 25.11, ``sbatch --requeue=expedite`` with ``SlurmctldParameters=enable_expedited_requeue``):
  slurmctld sets it together with the REQUEUE flag on a job it requeues at the highest priority
  (SchedMD/slurm slurm-25-11-0-1 ``slurm/slurm.h`` ``JOB_EXPEDITING``, ``src/slurmctld/job_mgr.c``); it
  has no short code (``squeue %t`` prints the base state).
- ``Unknown``, ``None``, ``INVALID``, ``?`` (what Slurm prints for a state it cannot name) and empty
  text parse to the pseudo-state UNKNOWN -> WorkerStatus.UNKNOWN, which never changes a step's state.
- A state name a later Slurm adds (not in :data:`STATE_MAP`) raises :class:`UnknownSlurmState` in
  :func:`parse_state`; the squeue/sacct parsers read it with ``strict=False`` instead, so that row alone is
  UNKNOWN (its ``raw`` keeps the name, logged once) and every other row of the poll still counts.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from dagster_gpu.contracts import WorkerStatus

log = logging.getLogger(__name__)

#: Long state name -> WorkerStatus.
STATE_MAP: dict[str, WorkerStatus] = {
    # not started
    "PENDING": WorkerStatus.PENDING,
    "CONFIGURING": WorkerStatus.PENDING,
    "POWER_UP_NODE": WorkerStatus.PENDING,
    "RESV_DEL_HOLD": WorkerStatus.PENDING,
    # holding resources, outcome not final
    "RUNNING": WorkerStatus.RUNNING,
    "COMPLETING": WorkerStatus.RUNNING,
    "SUSPENDED": WorkerStatus.RUNNING,
    "STOPPED": WorkerStatus.RUNNING,
    "SIGNALING": WorkerStatus.RUNNING,
    "STAGE_OUT": WorkerStatus.RUNNING,
    "RESIZING": WorkerStatus.RUNNING,
    "UPDATE_DB": WorkerStatus.RUNNING,
    # final
    "COMPLETED": WorkerStatus.SUCCEEDED,
    "FAILED": WorkerStatus.FAILED,
    "CANCELLED": WorkerStatus.FAILED,
    "TIMEOUT": WorkerStatus.FAILED,
    "NODE_FAIL": WorkerStatus.FAILED,
    "OUT_OF_MEMORY": WorkerStatus.FAILED,
    "BOOT_FAIL": WorkerStatus.FAILED,
    "DEADLINE": WorkerStatus.FAILED,
    "REVOKED": WorkerStatus.FAILED,
    "RECONFIG_FAIL": WorkerStatus.FAILED,
    # will run again
    "PREEMPTED": WorkerStatus.REQUEUED,
    "REQUEUED": WorkerStatus.REQUEUED,
    "REQUEUE_FED": WorkerStatus.REQUEUED,
    "REQUEUE_HOLD": WorkerStatus.REQUEUED,
    "SPECIAL_EXIT": WorkerStatus.REQUEUED,
    "LAUNCH_FAILED": WorkerStatus.REQUEUED,
    "EXPEDITING": WorkerStatus.REQUEUED,
    # Slurm printed no state it could name (see the module doc)
    "UNKNOWN": WorkerStatus.UNKNOWN,
}

#: Texts (lower case) that parse to the UNKNOWN pseudo-state.
UNKNOWN_STATE_WORDS = frozenset({"", "unknown", "none", "invalid", "n/a", "(null)", "?"})

#: Short codes (``squeue %t``) -> long names.
SHORT_CODES: dict[str, str] = {
    "PD": "PENDING",
    "CF": "CONFIGURING",
    "PU": "POWER_UP_NODE",
    "RD": "RESV_DEL_HOLD",
    "R": "RUNNING",
    "CG": "COMPLETING",
    "S": "SUSPENDED",
    "ST": "STOPPED",
    "SI": "SIGNALING",
    "SO": "STAGE_OUT",
    "RS": "RESIZING",
    "CD": "COMPLETED",
    "F": "FAILED",
    "CA": "CANCELLED",
    "TO": "TIMEOUT",
    "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY",
    "BF": "BOOT_FAIL",
    "DL": "DEADLINE",
    "RV": "REVOKED",
    "PR": "PREEMPTED",
    "RQ": "REQUEUED",
    "RF": "REQUEUE_FED",
    "RH": "REQUEUE_HOLD",
    "SE": "SPECIAL_EXIT",
}

#: The states after which a job holds no resources and will not run again by itself.
FINAL_STATES = frozenset(k for k, v in STATE_MAP.items() if v in (WorkerStatus.SUCCEEDED, WorkerStatus.FAILED))

#: Non-terminal states, by the kind of wait they are (see :func:`wait_class`). RUNNING is absent: the
#: job's own time limit bounds it.
WAIT_CLASSES: dict[str, str] = {
    "REQUEUE_HOLD": "held",
    "SPECIAL_EXIT": "held",
    "RESV_DEL_HOLD": "held",
    "PREEMPTED": "preempted",
    "SUSPENDED": "suspended",
    "STOPPED": "suspended",
    "PENDING": "pending",
    "CONFIGURING": "pending",
    "POWER_UP_NODE": "pending",
    "REQUEUED": "pending",
    "REQUEUE_FED": "pending",
    "LAUNCH_FAILED": "pending",
    "EXPEDITING": "pending",
    "COMPLETING": "completing",
    "SIGNALING": "completing",
    "STAGE_OUT": "completing",
    "RESIZING": "completing",
    "UPDATE_DB": "completing",
}

#: squeue ``%r`` reasons of a PENDING job that waits for someone to release it (``scontrol release``).
HELD_REASONS = frozenset({"JobHeldAdmin", "JobHeldUser", "job requeued in held state"})


def wait_class(state_name: str, reason: str = "") -> str | None:
    """The kind of wait a non-terminal job is in: ``held``, ``preempted``, ``suspended``, ``pending`` or
    ``completing``; None for RUNNING and the final states. A PENDING job whose reason is in
    :data:`HELD_REASONS` is ``held``."""
    cls = WAIT_CLASSES.get(state_name)
    if cls == "pending" and reason.strip() in HELD_REASONS:
        return "held"
    return cls

_BY_UID = re.compile(r"^(?P<name>[A-Z_]+)\+?(?:\s+BY\s+(?P<uid>\d+))?$")


class UnknownSlurmState(ValueError):
    """The text is not a Slurm job state this module knows (the message quotes it)."""


@dataclass(frozen=True)
class JobState:
    """One parsed job state.

    Attributes:
        name: the long state name (``CANCELLED``), upper case.
        by_uid: the uid in ``CANCELLED by <uid>`` (who cancelled), else None.
        raw: the text as Slurm printed it.
        truncated: True when Slurm truncated the name (``CANCELLED+``) and it was completed by prefix.
    """

    name: str
    by_uid: int | None = None
    raw: str = ""
    truncated: bool = False

    @property
    def status(self) -> WorkerStatus:
        """The WorkerStatus of this state (see the module table)."""
        return STATE_MAP[self.name]

    @property
    def final(self) -> bool:
        """True for COMPLETED and the failure states."""
        return self.name in FINAL_STATES

    def __str__(self) -> str:
        return self.name if self.by_uid is None else f"{self.name} by {self.by_uid}"


_WARNED_UNKNOWN: set[str] = set()


def parse_state(text: str, strict: bool = True) -> JobState:
    """Parse ``RUNNING``, ``R``, ``CANCELLED by 0``, ``CANCELLED+`` or ``CANC+`` into a :class:`JobState`.

    A truncated name (ending in ``+``) is completed when exactly one known state starts with it.
    ``Unknown``/``None``/``INVALID``/``?``/empty give the UNKNOWN pseudo-state. Any other text raises
    :class:`UnknownSlurmState`, or with ``strict=False`` gives the UNKNOWN pseudo-state with ``raw``
    keeping the text (a WARNING is logged once per text): what the squeue/sacct parsers use, so a state a
    newer Slurm adds makes its own row unknown, never the whole poll unreadable.
    """
    if strict:
        return _parse_state(text)
    try:
        return _parse_state(text)
    except UnknownSlurmState as e:
        if text not in _WARNED_UNKNOWN:
            _WARNED_UNKNOWN.add(text)
            log.warning("%s: that job's state counts as unknown (add it to dagster_gpu.slurm.states.STATE_MAP)", e)
        return JobState("UNKNOWN", raw=text)


def _parse_state(text: str) -> JobState:
    raw = text
    if text.strip().lower() in UNKNOWN_STATE_WORDS:
        return JobState("UNKNOWN", raw=raw)
    t = text.strip().upper()
    if t in SHORT_CODES:
        return JobState(SHORT_CODES[t], raw=raw)
    m = _BY_UID.match(t)
    if not m:
        raise UnknownSlurmState(f"not a Slurm job state: {raw!r}")
    name, uid = m.group("name"), m.group("uid")
    truncated = "+" in t
    if name not in STATE_MAP:
        if not truncated:
            raise UnknownSlurmState(f"not a Slurm job state: {raw!r}")
        candidates = [s for s in STATE_MAP if s.startswith(name)]
        if len(candidates) != 1:
            raise UnknownSlurmState(f"truncated Slurm job state {raw!r} matches {sorted(candidates) or 'nothing'}")
        name = candidates[0]
    # "CANCELLED+" is how sacct shortens "CANCELLED by <uid>" to fit its 10-character column.
    return JobState(name=name, by_uid=int(uid) if uid is not None else None, raw=raw, truncated=truncated)


def worker_status(text: str) -> WorkerStatus:
    """Shorthand: ``parse_state(text).status``. Raises :class:`UnknownSlurmState`."""
    return parse_state(text).status
