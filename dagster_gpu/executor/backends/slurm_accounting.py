"""Writes the ``sacct`` bill of each finished array task into Dagster: one AssetObservation per partition.

The task's figures come from the pure :func:`dagster_gpu.slurm.sacct_bill.sacct_figures`
(``billing/source: sacct``); this module finds the finished tasks in the spool and hands each task's bill to
:class:`dagster_gpu.executor.observations.ObservationWriter`, which splits it over the partitions of the
task's work unit and writes them into the task's own Dagster instance.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Mapping, Sequence

from dagster_gpu.executor.observations import ObservationWriter, UnitBill
from dagster_gpu.slurm.parse import AcctRow
from dagster_gpu.slurm.sacct_bill import sacct_figures
from dagster_gpu.slurm.spool import Spool, create_exclusive, read_json
from dagster_gpu.slurm.status import records_for
from dagster_gpu.worker.context import ENV_VAR as STEP_CONTEXT_ENV

log = logging.getLogger(__name__)


def _report_task(task: Mapping[str, Any], rows: Sequence[AcctRow], shards_per_gpu: int, writer: ObservationWriter) -> int:
    """Report the observations of one finished array task (a manifest entry: its unit's partitions);
    returns how many were written."""
    env = task["env"]
    rates = json.loads(env.get(STEP_CONTEXT_ENV, "{}")).get("rates") or {"default": 0.0}
    figures = sacct_figures(rows, shards_per_gpu)
    bill = UnitBill(
        gpu_seconds=figures["billing/gpu_seconds"],
        rate_usd_per_gpu_hour=None,
        rates=rates,
        metadata={**{k: v for k, v in figures.items() if not k.startswith("billing/")},
                  "billing/source": "sacct", "dagster_gpu/backend": "slurm"},
        match=("slurm/job_id", figures["slurm/job_id"]),
    )
    return writer.write(env, bill)


def report_sacct_bills(spool: Spool, acct: Sequence[AcctRow], shards_per_gpu: int = 4) -> int:
    """Report sacct observations for every finished task of the spool's done job arrays not yet
    reported (each exactly once across processes: an O_EXCL marker per task). Returns observations written."""
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
