"""Post-run billing from ``sacct``: one AssetObservation per partition with ``billing/source: sacct``.

Figures of one array task, summed over every attempt (a preempted and requeued task is billed for the
time each attempt held its GPUs):

- ``slurm/elapsed_seconds``: sum of ``ElapsedRaw``;
- ``billing/gpu_seconds``: sum of ``ElapsedRaw × (gres/gpu + gres/shard ÷ shards_per_gpu)``;
- ``slurm/billing_tres_seconds``: sum of ``ElapsedRaw × billing`` (TRESBillingWeights applied);
- split over the partitions of the task's unit and written by
  :class:`dagster_gpu.executor.observations.ObservationWriter` (cost at the slurm rate card rate, measured
  and difference figures per partition).

:func:`sacct_figures` is pure; :func:`reconcile_spool` reads the spool and writes observations into the
Dagster instance of each task (from its serialized instance ref).
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

from dagster_gpu.slurm.parse import AcctRow

log = logging.getLogger(__name__)


def sacct_figures(rows: Sequence[AcctRow], shards_per_gpu: int) -> dict[str, Any]:
    """Totals over the attempts ``rows`` of one task (oldest first). Raises ValueError when empty."""
    if not rows:
        raise ValueError("no sacct records")
    spg = max(1, shards_per_gpu)
    elapsed = sum(r.elapsed_s for r in rows)
    gpu_secs = sum(r.elapsed_s * (r.gpus + r.shards / spg) for r in rows)
    billing = sum(r.elapsed_s * r.billing for r in rows)
    last = rows[-1]
    alloc = ",".join(f"{k}={v:g}" for k, v in sorted(last.alloc_tres.items()))
    return {
        "slurm/job_id": str(last.job_id),
        "slurm/array_job_id": int(last.array_job_id),
        "slurm/array_task_id": int(last.array_task_id) if last.array_task_id is not None else -1,
        "slurm/state": str(last.state),
        "slurm/exit_code": int(last.exit_code) if last.exit_code is not None else -1,
        "slurm/attempts": sum(1 for r in rows if r.start is not None),
        "slurm/attempt_states": ",".join(str(r.state) for r in rows),
        "slurm/elapsed_seconds": int(elapsed),
        "slurm/alloc_tres": alloc,
        "slurm/billing_tres_seconds": float(billing),
        "billing/gpu_seconds": float(gpu_secs),
    }


# ------------------------------------------------------------------------------------ the reporter
def _report_task(task: Mapping[str, Any], rows: Sequence[AcctRow], shards_per_gpu: int, writer) -> int:
    """Report the observations of one finished array task (its unit's partitions); returns how many."""
    import json

    from dagster_gpu.executor.observations import UnitBill
    from dagster_gpu.worker.context import ENV_VAR

    env = task["env"]
    rates = json.loads(env.get(ENV_VAR, "{}")).get("rates") or {"default": 0.0}
    figures = sacct_figures(rows, shards_per_gpu)
    md = {k: v for k, v in figures.items() if not k.startswith("billing/")}
    bill = UnitBill(
        gpu_seconds=figures["billing/gpu_seconds"],
        rate_usd_per_gpu_hour=None,
        rates=rates,
        metadata={**md, "billing/source": "sacct", "dagster_gpu/backend": "slurm"},
        match=("slurm/job_id", figures["slurm/job_id"]),
    )
    return writer.write(env, bill)


def reconcile_spool(spool, acct: Sequence[AcctRow], shards_per_gpu: int = 4) -> int:
    """Report sacct observations for every finished task of the spool's done job arrays not yet
    reported (each exactly once across processes: an O_EXCL marker per task). Returns observations written."""
    import time

    from dagster_gpu.slurm.spool import create_exclusive, read_json
    from dagster_gpu.slurm.status import records_for

    from dagster_gpu.executor.observations import ObservationWriter

    written = 0
    writer = ObservationWriter()
    for bdir in sorted(spool.batches.iterdir()):
        if not (bdir / "done").exists() or (bdir / "reconciled" / "all").exists():
            continue
        sub, man = read_json(bdir / "submitted.json"), read_json(bdir / "manifest.json")
        if not sub or not man:
            continue
        aid = int(sub["array_job_id"])
        complete = True
        for i, task in enumerate(man["tasks"]):
            marker = bdir / "reconciled" / f"{i}.json"
            if marker.exists():
                continue
            rows = records_for(aid, i, [], acct).acct
            if not rows or not rows[-1].state.final:
                complete = False
                continue
            if not create_exclusive(marker, {"at": time.time()}):
                continue
            try:
                written += _report_task(task, rows, shards_per_gpu, writer)
            except Exception:  # noqa: BLE001 - billing must never break a run
                log.exception("could not report the sacct observation of array task %s_%s", aid, i)
        if complete:
            create_exclusive(bdir / "reconciled" / "all", {"at": time.time()})
    writer.close()
    return written
