"""Pure logic of the fault-injection benchmark (bench/faults.py): which faults, when, and how the outcome
is counted. No I/O: the driver gathers the facts from the instance, Slurm and Kubernetes and hands them here.

Faults (issue 10 §3), each fired once at a seeded random moment of the backfill, except the worker kill,
fired ``kills`` times (5 % of the backfill's work units, at least one):

==================== ==========================================================================
``slurmctld_restart`` slurmctld stopped and started again (its state file keeps the queue)
``slurmdbd_down``     slurmdbd stopped for ``SLURMDBD_DOWN_S`` seconds (``sacct`` fails meanwhile)
``apiserver_restart`` kube-apiserver stopped and started again
``etcd_restart``      etcd stopped and started again (data kept)
``postgres_restart``  PostgreSQL restarted (``pg_ctl restart -m fast``: every connection dropped)
``daemon_restart``    dagster-daemon SIGKILLed, a new one started (the backfill must go on)
``worker_sigkill``    one running step worker (a Slurm array task's or a pod's process) SIGKILLed
``slurm_preempt``     a high-QOS job that needs the GPUs of two running array tasks (both preempted, requeued)
==================== ==========================================================================
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

SERVICE_FAULTS = ("slurmctld_restart", "slurmdbd_down", "apiserver_restart", "etcd_restart", "postgres_restart",
                  "daemon_restart")
FAULTS = (*SERVICE_FAULTS, "worker_sigkill", "slurm_preempt")
SLURMDBD_DOWN_S = 120.0
KILL_FRACTION = 0.05
PREEMPTED_TASKS = 2


@dataclass(frozen=True)
class PlannedFault:
    """One fault to fire ``at_s`` seconds after the backfill was submitted (``name`` is one of FAULTS;
    ``index`` numbers repeated kinds: the worker kills)."""

    name: str
    at_s: float
    index: int = 0

    @property
    def label(self) -> str:
        return self.name if self.name != "worker_sigkill" else f"{self.name}#{self.index + 1}"


def kills_for(units: int, fraction: float = KILL_FRACTION) -> int:
    """Step workers to SIGKILL: ``fraction`` of ``units`` work units, rounded, at least one."""
    if units < 0 or not 0 <= fraction <= 1:
        raise ValueError(f"units must be >= 0 and fraction in [0, 1], got {units}, {fraction}")
    return max(1, round(units * fraction))


def plan_faults(seed: int, window_s: float, kills: int, lead_s: float = 20.0,
                faults: Sequence[str] = FAULTS) -> list[PlannedFault]:
    """Every fault of ``faults`` once (``worker_sigkill`` ``kills`` times), each at a moment drawn uniformly
    from ``[lead_s, window_s]`` seconds after submission with ``random.Random(seed)``; sorted by time.

    Raises:
        ValueError: ``window_s <= lead_s``, ``kills < 1``, or an unknown fault name.
    """
    if window_s <= lead_s or lead_s < 0:
        raise ValueError(f"the window must end after its lead: lead {lead_s} s, window {window_s} s")
    if kills < 1:
        raise ValueError(f"kills must be >= 1, got {kills}")
    unknown = set(faults) - set(FAULTS)
    if unknown:
        raise ValueError(f"unknown fault(s) {sorted(unknown)}; known: {FAULTS}")
    rng = random.Random(seed)
    out = []
    for name in faults:
        for i in range(kills if name == "worker_sigkill" else 1):
            out.append(PlannedFault(name, round(rng.uniform(lead_s, window_s), 1), i))
    return sorted(out, key=lambda f: (f.at_s, f.name, f.index))


@dataclass
class Outcome:
    """The counted outcome of one benchmark run (see :func:`tally`); every list is sorted."""

    partitions: int
    materialized_once: int = 0
    duplicated: list[str] = field(default_factory=list)
    extra_materializations: int = 0
    failed_with_reason: list[str] = field(default_factory=list)
    lost_at_backfill_end: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    missing_after_recovery: list[str] = field(default_factory=list)

    @property
    def partitions_lost(self) -> int:
        """Partitions the backfill neither materialized nor failed with a reason, plus those still not
        materialized after the recovery (each counted once)."""
        return len(set(self.lost_at_backfill_end) | set(self.missing_after_recovery))


def tally(
    keys: Sequence[str],
    materializations: Iterable[tuple[str, str]],
    at_backfill_end: Mapping[str, tuple[str, str | None]],
) -> Outcome:
    """Count the outcome.

    Args:
        keys: every partition key of the backfill.
        materializations: ``(partition key, run id)`` of every materialization event of the asset, from the
            backfill's runs and the recovery's alike (after the recovery ended).
        at_backfill_end: partition key -> ``("ok" | "failed" | "running", failure reason or None)`` as the
            backfill's runs left it (a key absent: no run of the backfill covered it).

    A partition is ``failed_with_reason`` when the backfill run that covered it last failed with a reason
    (its step's failure message); ``lost_at_backfill_end`` when the backfill neither materialized it nor
    failed it with a reason; ``recovered`` when it was not materialized by the backfill but is afterwards;
    ``duplicated`` when it has more than one materialization event (``extra_materializations`` counts the
    events beyond the first).
    """
    counts: dict[str, int] = {}
    for key, _run in materializations:
        counts[key] = counts.get(key, 0) + 1
    out = Outcome(partitions=len(keys))
    for k in keys:
        n = counts.get(k, 0)
        state, reason = at_backfill_end.get(k, ("missing", None))
        if n == 1:
            out.materialized_once += 1
        elif n > 1:
            out.duplicated.append(k)
            out.extra_materializations += n - 1
        if state != "ok":
            if reason:
                out.failed_with_reason.append(k)
            else:
                out.lost_at_backfill_end.append(k)
            if n >= 1:
                out.recovered.append(k)
        if n == 0:
            out.missing_after_recovery.append(k)
    for lst in (out.duplicated, out.failed_with_reason, out.lost_at_backfill_end, out.recovered, out.missing_after_recovery):
        lst.sort()
    return out


def first_after(timestamps: Sequence[float], t: float | None) -> float | None:
    """Seconds from ``t`` to the first timestamp strictly after it (None when ``t`` is None or none is)."""
    if t is None:
        return None
    later = [x for x in timestamps if x > t]
    return round(min(later) - t, 1) if later else None


def summary_keys(injected: int, outcome: Outcome, leaked_objects: int) -> dict[str, int]:
    """The four ``faults.*`` keys of bench/results/summary.json."""
    return {
        "faults.injected": int(injected),
        "faults.partitions_lost": outcome.partitions_lost,
        "faults.duplicates": len(outcome.duplicated),
        "faults.leaked_objects": int(leaked_objects),
    }


def _cell(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.1f}" if math.isfinite(v) else "–"
    return str(v)


def fault_table(records: Sequence[Mapping]) -> str:
    """A Markdown table of the injected faults: fault, when (s after submission), outage (s until the
    component answered again), first materialization after it was back (s), and what it hit."""
    lines = ["| fault | at (s) | outage (s) | next materialization after recovery (s) | detail |",
             "|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['fault']} | {_cell(r.get('at_s'))} | {_cell(r.get('outage_s'))} | "
                     f"{_cell(r.get('next_materialization_s'))} | {str(r.get('detail', '')).replace('|', '/')} |")
    return "\n".join(lines)
