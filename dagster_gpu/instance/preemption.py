"""Preemptions observed in the instance, per preemption pool: what the policy learns each pool's rate from.

The I/O adapter beside :mod:`dagster_gpu.instance.history` (durations). The estimate itself is pure:
:func:`dagster_gpu.policy.preemption.estimate_rate`. What is read, from the newest step launches back:

- launches: each ``STEP_WORKER_STARTING`` event gpu_executor wrote carries its pool
  (:data:`~dagster_gpu.instance.events.PREEMPTION_POOL_KEY`), the key naming its work unit (``slurm/job_id``,
  ``k8s/pod``, ``local/unit``) and, on a worker launched again after a preemption (Kubernetes),
  :data:`~dagster_gpu.instance.events.PREEMPTIONS_KEY`: each such launch is one preemption. Launches without a
  pool (earlier versions, other executors) are not read;
- the step worker's own engine event when it stopped for a preemption
  (:data:`~dagster_gpu.instance.events.PREEMPTED_PARTITION_KEY`), one per stop, in the launch's run;
- the scheduler's bills (``billing/source`` observations, one per partition of a unit, each carrying the unit's
  figures): the unit's GPU-seconds (``billing/unit_gpu_seconds``: every attempt of a requeued Slurm task, each
  pod of a relaunched step) and, for Slurm, ``slurm/attempt_states`` (``PREEMPTED,PREEMPTED,COMPLETED``: one
  PREEMPTED record per preempted attempt).

One step of one run on one pool is one :class:`~dagster_gpu.policy.preemption.PreemptionObservation`: its
preemptions are the largest of the three counts (the same preemption is seen by several of them: a relaunch, the
worker's event, sacct's record), its exposure the GPU-hours its units were billed. A step none of whose units'
bills has landed is left out (its exposure is not known yet).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import dagster as dg
from dagster import DagsterEventType, EventRecordsFilter

from dagster_gpu.billing.keys import GPU_SECONDS, SOURCE, UNIT_GPU_SECONDS, billed
from dagster_gpu.instance.bills import unit_of
from dagster_gpu.instance.events import (
    PREEMPTED_PARTITION_KEY,
    PREEMPTION_POOL_KEY,
    PREEMPTIONS_KEY,
    metadata_get,
    metadata_number,
)
from dagster_gpu.policy.preemption import PRIOR_GPU_HOURS, PreemptionObservation, with_rates

log = logging.getLogger(__name__)

#: The Slurm bill's per-attempt states (``dagster_gpu.slurm.sacct_bill``), and the state of a preempted attempt.
ATTEMPT_STATES_KEY = "slurm/attempt_states"
PREEMPTED_STATE = "PREEMPTED"
#: Launch events read (newest first) by :func:`fetch_observations`; bills and engine events are read for their runs.
DEFAULT_LAUNCHES = 200


@dataclass(frozen=True)
class LaunchSeen:
    """One recorded launch: its run, step, pool, unit key (``("slurm/job_id", "123_4")``, None if unknown) and
    ``preemptions`` (its :data:`PREEMPTIONS_KEY`, 0 on a first launch)."""

    run_id: str
    step_key: str
    pool: str
    unit: tuple[str, str] | None
    preemptions: int = 0


def launch_seen(run_id: str, step_key: str | None, md: Mapping[str, Any]) -> LaunchSeen | None:
    """A :class:`LaunchSeen` from a launch event's metadata; None without a pool or a step key."""
    pool = metadata_get(md, PREEMPTION_POOL_KEY)
    if not isinstance(pool, str) or not pool or not step_key:
        return None
    return LaunchSeen(run_id, step_key, pool, unit_of(md), int(metadata_number(md, PREEMPTIONS_KEY) or 0))


def bill_figures(md: Mapping[str, Any]) -> tuple[float, int]:
    """``(unit GPU-seconds, preempted attempts)`` of one bill observation's metadata: ``bill/unit_gpu_seconds``
    (else the partition's ``bill/gpu_seconds``; ``billing/*`` on an observation written before bills had their
    own keys) and the PREEMPTED entries of ``slurm/attempt_states``."""
    secs = metadata_number(md, billed(UNIT_GPU_SECONDS))
    secs = metadata_number(md, UNIT_GPU_SECONDS) if secs is None else secs  # an observation written under billing/*
    if secs is None:
        secs = metadata_number(md, billed(GPU_SECONDS))
    if secs is None:
        secs = metadata_number(md, GPU_SECONDS) or 0.0
    states = metadata_get(md, ATTEMPT_STATES_KEY)
    preempted = sum(1 for s in str(states).split(",") if s.strip().upper().startswith(PREEMPTED_STATE)) if states else 0
    return float(secs), preempted


def observations(launches: Iterable[LaunchSeen], stops: Mapping[tuple[str, str], int],
                 bills: Mapping[tuple[str, str], tuple[float, int]]) -> list[PreemptionObservation]:
    """One observation per (run, step, pool) of ``launches`` (module docstring), pure.

    Args:
        launches: the launches read.
        stops: ``(run id, step key)`` -> the worker's preemption engine events in that run.
        bills: unit key -> :func:`bill_figures` of its bill (units whose bill has not landed are absent).
    """
    groups: dict[tuple[str, str, str], list[LaunchSeen]] = {}
    for ls in launches:
        groups.setdefault((ls.run_id, ls.step_key, ls.pool), []).append(ls)
    out = []
    for (run_id, step_key, pool), group in sorted(groups.items()):
        units = {ls.unit for ls in group if ls.unit is not None and ls.unit in bills}
        if not units:
            continue
        gpu_s = sum(bills[u][0] for u in units)
        if gpu_s <= 0:
            continue
        relaunches = sum(1 for ls in group if ls.preemptions > 0)
        sacct = sum(bills[u][1] for u in units)
        n = max(relaunches, stops.get((run_id, step_key), 0), sacct)
        out.append(PreemptionObservation(pool, n, gpu_s / 3600.0))
    return out


def fetch_observations(instance: Any, limit: int = DEFAULT_LAUNCHES) -> list[PreemptionObservation]:
    """The :func:`observations` of the newest ``limit`` launch events of ``instance`` (a DagsterInstance).

    Reads: the launch events (``event_log_storage.get_event_records`` of ``STEP_WORKER_STARTING``), their runs
    (for the assets they selected), the bills of those assets (``fetch_observations``, newest
    :data:`BILLS_PER_ASSET` per asset) and the engine events (``get_records_for_run``) of the runs with a bill.
    Measured on a SQLite test instance of 160 runs with bills: 0.6-0.9 s (the per-run engine-event reads dominate),
    on a shared 2-core host. Raises what the instance raises.
    """
    recs = instance.event_log_storage.get_event_records(
        EventRecordsFilter(event_type=DagsterEventType.STEP_WORKER_STARTING), limit=limit, ascending=False)
    seen: list[LaunchSeen] = []
    for rec in recs:
        ev = rec.event_log_entry.dagster_event
        md = ev.engine_event_data.metadata if ev is not None and ev.engine_event_data else {}
        ls = launch_seen(rec.event_log_entry.run_id, ev.step_key if ev is not None else None, md or {})
        if ls is not None:
            seen.append(ls)
    assets: set = set()
    run_ids = sorted({ls.run_id for ls in seen})
    for run in instance.get_runs(filters=dg.RunsFilter(run_ids=run_ids)) if run_ids else ():  # one query
        assets.update(run.asset_selection or ())
    wanted = {ls.unit for ls in seen if ls.unit is not None}
    bills: dict[tuple[str, str], tuple[float, int]] = {}
    for key in sorted(assets, key=lambda k: k.to_user_string()):
        result = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=key), limit=BILLS_PER_ASSET,
                                             ascending=False)
        for r in result.records:
            obs = r.asset_observation
            md = obs.metadata if obs is not None else {}
            if metadata_get(md, billed(SOURCE)) is None and metadata_get(md, SOURCE) is None:
                continue
            unit = unit_of(md)
            if unit in wanted and unit not in bills:  # newest first: a unit's newest bill
                bills[unit] = bill_figures(md)
    stops: Counter[tuple[str, str]] = Counter()
    for run_id in sorted({ls.run_id for ls in seen if ls.unit in bills}):  # only steps that can be observed
        for r in instance.get_records_for_run(run_id, of_type=DagsterEventType.ENGINE_EVENT).records:
            ev = r.event_log_entry.dagster_event
            md = ev.engine_event_data.metadata if ev is not None and ev.engine_event_data else {}
            if md and PREEMPTED_PARTITION_KEY in md and ev.step_key:
                stops[(run_id, ev.step_key)] += 1
    return observations(seen, stops, bills)


#: Bill observations read per asset (newest first): one per partition of each unit, so a few thousand cover the
#: units of the launches read.
BILLS_PER_ASSET = 2000


def with_learned_rates(instance: Any, snapshot, limit: int = DEFAULT_LAUNCHES, prior_gpu_hours: float = PRIOR_GPU_HOURS):
    """``snapshot`` (a :class:`~dagster_gpu.policy.snapshot.Snapshot`) with each pool's rate learned from
    ``instance`` (:func:`~dagster_gpu.policy.preemption.with_rates`). The snapshot unchanged, with a warning in
    the log, when the instance cannot be read: the prior still applies, and placing never fails for it."""
    try:
        obs = fetch_observations(instance, limit)
    except Exception as e:  # noqa: BLE001 - learning is an improvement, never a reason not to place
        log.warning("dagster-gpu: preemptions not learned (%s: %s); the configured priors apply", type(e).__name__, e)
        return snapshot
    return with_rates(snapshot, obs, prior_gpu_hours)
