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
``slurm_preempt``     a high-QOS job that needs the GPUs of two running array tasks (both preempted: their QOS
                      ``preemptible`` gives them GraceTime and a warning signal; requeued)
``image_pull_fail``   one queued run's pods name an image the registry does not have (ErrImagePull, then
                      ImagePullBackOff); its unit is forced onto Kubernetes (``dagster-gpu/backend`` tag)
``dra_prepare_fail``  one queued run's claim carries a TimeSlicing sharing config the DRA driver refuses at
                      NodePrepareResources (its ``TimeSlicingSettings`` gate is off, as the driver ships):
                      FailedPrepareDynamicResources, the pod stays ContainerCreating
``k8s_preempt``       one queued run's pod runs at the recommended batch PriorityClass asking 40 of the node's 64
                      CPUs; once it runs, an online pod of a higher PriorityClass asks 40 more: kube-scheduler
                      preempts the step pod (``DisruptionTarget``, ``PreemptionByScheduler``) and the executor
                      launches the unit again (``-p1``)
``kueue_reclaim``     one queued run's pod is a Kueue workload of LocalQueue ``batch`` (one MIG 1g.10gb slice): its
                      ClusterQueue has no quota and borrows ``online``'s idle slices through their cohort
                      (resources/k8s/kueue/example/mixed-cluster.yaml); once it runs, an online pod asking for both
                      slices arrives in LocalQueue ``online``; Kueue evicts the borrower to reclaim them
                      (``InCohortReclamation``) and the executor launches the unit again through the queue (``-p1``)
==================== ==========================================================================

The four Kubernetes faults aim at one run each (:data:`TARGETED_FAULTS`): a run still queued when the fault
fires, so its step worker reads the fault's run tags and per-run overrides (bench/fault_state.py) when it
starts. Their moments are drawn from the first half of the window, while the run queue still holds runs.
:func:`run_fault_outcome` checks what a user must see: the step's attempt failed with an error naming the
cause (not a timeout), and every partition of that run is materialized exactly once: by a retry the
executor launched without the cause (a shared claim that failed to prepare is retried unshared), or by the
rerun after the backfill left it failed with that reason and the fault was removed (the image).
A preemption (kube-scheduler's or Kueue's) is no failure: :func:`preempt_fault_outcome` checks that the run itself materialized each of its
partitions exactly once after launching its unit again, and that every launch (the preempted pod included)
has its scheduler bill.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

SERVICE_FAULTS = ("slurmctld_restart", "slurmdbd_down", "apiserver_restart", "etcd_restart", "postgres_restart",
                  "daemon_restart")
#: faults aimed at one queued run; each is drawn from the first half of the window (see plan_faults)
RUN_FAULTS = ("image_pull_fail", "dra_prepare_fail")
#: faults whose run is preempted and must finish by itself after a relaunch (:func:`preempt_fault_outcome`)
PREEMPT_FAULTS = ("k8s_preempt", "kueue_reclaim")
FAULTS = (*SERVICE_FAULTS, "worker_sigkill", "slurm_preempt", *RUN_FAULTS, *PREEMPT_FAULTS)
#: faults aimed at one queued run (their moments come from the first half of the window)
TARGETED_FAULTS = (*RUN_FAULTS, *PREEMPT_FAULTS)
#: what a failure of each run fault's partitions must say: every string of the first tuple, and one of the second
RUN_FAULT_REASONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "image_pull_fail": ((), ("ErrImagePull", "ImagePullBackOff")),  # the image name is added by the driver
    "dra_prepare_fail": (("FailedPrepareDynamicResources", "NodePrepareResources"), ()),
}
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
    from ``[lead_s, window_s]`` seconds after submission with ``random.Random(seed)`` (a fault of
    :data:`TARGETED_FAULTS` from ``[lead_s, (lead_s + window_s) / 2]``); sorted by time. The draws follow the
    order of :data:`FAULTS`, so adding a fault at its end leaves the others' moments as they were.

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
        end = (lead_s + window_s) / 2 if name in TARGETED_FAULTS else window_s
        for i in range(kills if name == "worker_sigkill" else 1):
            out.append(PlannedFault(name, round(rng.uniform(lead_s, end), 1), i))
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


def reason_names(fault: str, reason: str | None, must: Sequence[str] = ()) -> bool:
    """True when ``reason`` says what :data:`RUN_FAULT_REASONS` requires for ``fault``, and contains every
    string of ``must`` (e.g. the missing image's name)."""
    if not reason:
        return False
    every, one_of = RUN_FAULT_REASONS[fault]
    return all(s in reason for s in (*every, *must)) and (not one_of or any(s in reason for s in one_of))


def run_fault_outcome(
    fault: str,
    run_id: str | None,
    at_backfill_end: Mapping[str, tuple[str, str | None, str | None]],
    materializations: Iterable[tuple[str, str]],
    attempt_errors: Sequence[str] = (),
    must: Sequence[str] = (),
) -> dict:
    """What a fault aimed at run ``run_id`` did to that run's partitions.

    Args:
        fault: one of :data:`RUN_FAULTS`.
        run_id: the run it hit (None: not injected).
        at_backfill_end: partition key -> ``(state, failure reason or None, run id)`` of the backfill run
            that covered it last.
        materializations: ``(partition key, run id)`` of every materialization event of the asset.
        attempt_errors: the error message of each failed attempt of the run's step (retry requests and the
            final failure), oldest first.
        must: strings a reason must contain besides :data:`RUN_FAULT_REASONS` (the image's name).

    Returns a dict: ``partitions`` (of that run); ``named_attempts`` (failed attempts whose error names the
    cause); ``failed_with_named_reason`` (partitions the backfill left failed with such a reason);
    ``materialized_once`` (partitions with exactly one materialization, by any run);
    ``by_retry`` (those the faulted run materialized itself: a retry launched without the cause, as the
    Kubernetes backend does after a shared claim failed to prepare) and ``by_rerun`` (those another run
    materialized); ``reason`` (the first named error); and ``ok``: the fault hit (a named attempt), every
    partition is materialized exactly once, and each one either by a retry of the faulted run or by a rerun
    after the backfill left it failed with a reason naming the cause.
    """
    keys = sorted(k for k, (_st, _r, run) in at_backfill_end.items() if run_id and run == run_id)
    by_key: dict[str, list[str]] = {}
    for key, run in materializations:
        by_key.setdefault(key, []).append(run)
    named_errors = [e for e in attempt_errors if reason_names(fault, e, must)]
    named = [k for k in keys if at_backfill_end[k][0] == "failed" and reason_names(fault, at_backfill_end[k][1], must)]
    once = [k for k in keys if len(by_key.get(k, [])) == 1]
    by_retry = [k for k in once if by_key[k][0] == run_id]
    by_rerun = [k for k in once if by_key[k][0] != run_id and k in named]
    return {"fault": fault, "run_id": run_id, "partitions": len(keys), "named_attempts": len(named_errors),
            "attempts": len(attempt_errors), "failed_with_named_reason": len(named), "materialized_once": len(once),
            "by_retry": len(by_retry), "by_rerun": len(by_rerun),
            "reason": named_errors[0] if named_errors else next((at_backfill_end[k][1] for k in keys if at_backfill_end[k][1]), None),
            "ok": bool(keys) and bool(named_errors) and len(once) == len(keys) == len(by_retry) + len(by_rerun)}


def preempt_fault_outcome(
    run_id: str | None,
    at_backfill_end: Mapping[str, tuple[str, str | None, str | None]],
    materializations: Iterable[tuple[str, str]],
    launches: Sequence[str],
    billed: Iterable[str],
    disruption: str | None = None,
    fault: str = "k8s_preempt",
) -> dict:
    """What ``fault`` (one of :data:`PREEMPT_FAULTS`) did to the run ``run_id`` whose step pod it preempted.

    Args:
        run_id: the run (None: not injected).
        at_backfill_end: as for :func:`run_fault_outcome`.
        materializations: ``(partition key, run id)`` of every materialization event of the asset.
        launches: the pod of each launch of the run's step, in launch order (``STEP_WORKER_STARTING``).
        billed: every pod with a scheduler bill (``bill/source`` pod-interval).
        disruption: the preempted pod's ``DisruptionTarget`` reason as read while it terminated, if it was
            (``kueue_reclaim``: its Workload's ``Evicted`` and ``Preempted`` reasons, ``Preempted/InCohortReclamation``).
        fault: which preemption fault it was (the result's ``fault``).

    Returns a dict: ``partitions`` (of that run), ``launches``, ``unbilled_launches`` (launched pods without a bill:
    every attempt must be billed), ``materialized_once`` and ``by_run`` (exactly once, by the preempted run itself),
    ``failed`` (its partitions the backfill left failed), ``disruption``; ``ok`` when the unit was launched again
    (at least two launches), each partition is materialized exactly once by that run, none failed, and every
    launch is billed.
    """
    keys = sorted(k for k, (_st, _r, run) in at_backfill_end.items() if run_id and run == run_id)
    by_key: dict[str, list[str]] = {}
    for key, run in materializations:
        by_key.setdefault(key, []).append(run)
    once = [k for k in keys if len(by_key.get(k, [])) == 1]
    by_run = [k for k in once if by_key[k][0] == run_id]
    failed = [k for k in keys if at_backfill_end[k][0] != "ok"]
    bills = set(billed)
    unbilled = [p for p in launches if p not in bills]
    return {"fault": fault, "run_id": run_id, "partitions": len(keys), "launches": len(launches),
            "unbilled_launches": len(unbilled), "materialized_once": len(once), "by_run": len(by_run),
            "failed": len(failed), "disruption": disruption,
            "ok": bool(keys) and len(launches) >= 2 and not unbilled and not failed and len(by_run) == len(keys)}


def attempt_seconds(events: Sequence[tuple[str, float]]) -> list[float]:
    """Seconds from each step-worker launch to the step's next failure or retry request (``events``:
    ``(event type value, timestamp)`` of one step, any order: ``STEP_WORKER_STARTING``, ``STEP_FAILURE``,
    ``STEP_UP_FOR_RETRY``; others are ignored). A launch with no failure after it is left out."""
    out, started = [], None
    for kind, t in sorted(events, key=lambda e: e[1]):
        if kind == "STEP_WORKER_STARTING":
            started = t
        elif kind in ("STEP_FAILURE", "STEP_UP_FOR_RETRY") and started is not None:
            out.append(round(t - started, 1))
            started = None
    return out


def summary_keys(injected: int, outcome: Outcome, leaked_objects: int,
                 run_faults: Sequence[Mapping] = (), units_without_bill: int | None = None) -> dict[str, int]:
    """The ``faults.*`` keys of bench/results/summary.json: the four counts (and ``faults.units_without_bill``
    when given), plus for each fault of ``run_faults`` (:func:`run_fault_outcome` dicts)
    ``faults.<fault>.named_attempts``, ``faults.<fault>.failed_with_named_reason`` and
    ``faults.<fault>.materialized_once`` (partitions of the faulted run); for a :func:`preempt_fault_outcome`
    dict ``faults.<fault>.launches``, ``.unbilled_launches`` and ``.materialized_once``."""
    out = {
        "faults.injected": int(injected),
        "faults.partitions_lost": outcome.partitions_lost,
        "faults.duplicates": len(outcome.duplicated),
        "faults.leaked_objects": int(leaked_objects),
    }
    if units_without_bill is not None:
        out["faults.units_without_bill"] = int(units_without_bill)
    for r in run_faults:
        names = (("launches", "unbilled_launches", "materialized_once") if r["fault"] in PREEMPT_FAULTS
                 else ("named_attempts", "failed_with_named_reason", "materialized_once"))
        for k in names:
            out[f"faults.{r['fault']}.{k}"] = int(r[k])
    return out


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
