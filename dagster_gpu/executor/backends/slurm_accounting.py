"""Writes the ``sacct`` bill of each finished array task into Dagster: one AssetObservation per partition.

The figures and the observation's metadata are computed by the pure functions of
:mod:`dagster_gpu.slurm.sacct_bill` (``billing/source: sacct``); this module finds the finished tasks in the
spool, the Dagster instance of each (from the serialized instance ref in the task's step args), the
materializations its step recorded, and writes the observations.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Mapping, Sequence

import dagster as dg
from dagster._serdes import serialize_value

from dagster_gpu.billing.ratecard import gpu_hour_rate
from dagster_gpu.executor.backends.step_args import step_args_from_env
from dagster_gpu.slurm.parse import AcctRow
from dagster_gpu.slurm.sacct_bill import observation_metadata, sacct_figures
from dagster_gpu.slurm.spool import Spool, create_exclusive, read_json
from dagster_gpu.slurm.status import records_for
from dagster_gpu.worker.billing import billed_device
from dagster_gpu.worker.context import ENV_VAR as STEP_CONTEXT_ENV

log = logging.getLogger(__name__)


def _report_task(task: Mapping[str, Any], rows: Sequence[AcctRow], shards_per_gpu: int, instances: dict) -> int:
    """Report the observation(s) of one finished array task (a manifest entry); returns how many were written."""
    env = task["env"]
    args = step_args_from_env(env)
    if args is None:
        return 0
    key = serialize_value(args.instance_ref)
    if key not in instances:
        instances[key] = dg.DagsterInstance.from_ref(args.instance_ref)
    instance = instances[key]
    rates = json.loads(env.get(STEP_CONTEXT_ENV, "{}")).get("rates") or {"default": 0.0}
    figures = sacct_figures(rows, shards_per_gpu)
    targets: list[tuple[Any, str | None, Mapping[str, Any]]] = []
    for rec in instance.get_records_for_run(task["run_id"], of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records:
        ev = rec.event_log_entry.dagster_event
        if ev is None or ev.step_key != task["step_key"]:
            continue
        mat = ev.step_materialization_data.materialization
        targets.append((mat.asset_key, mat.partition, mat.metadata))
    if not targets:  # the step failed: bill the partition of the assets the run selected
        run = instance.get_run_by_id(task["run_id"])
        for ak in (run.asset_selection or []) if run else []:
            targets.append((ak, task.get("partition_key"), {}))
    for asset_key, partition, mat_md in targets:
        measured = mat_md.get("billing/gpu_seconds")
        measured_v = float(getattr(measured, "value", measured)) if measured is not None else None
        device = mat_md.get("billing/device_type")
        device_v = str(getattr(device, "value", device)) if device is not None else "default"
        product = mat_md.get("gpu/product_name")
        parent = billed_device("cuda", str(getattr(product, "value", product)), 1, None)[1] if product is not None else None
        try:  # sacct GPU-seconds are whole-GPU equivalents: the GPU-hour rate, as every meter charges
            rate = gpu_hour_rate(rates, device_v, parent)
        except Exception:  # noqa: BLE001 - a rate table without default: bill at 0 rather than not at all
            rate = 0.0
        md = observation_metadata(figures, rate, measured_v)
        instance.report_runless_asset_event(dg.AssetObservation(asset_key=asset_key, partition=partition, metadata=md))
    return len(targets)


def report_sacct_bills(spool: Spool, acct: Sequence[AcctRow], shards_per_gpu: int = 4) -> int:
    """Report sacct observations for every finished task of the spool's done job arrays not yet
    reported (each exactly once across processes: an O_EXCL marker per task). Returns observations written."""
    written = 0
    instances: dict = {}
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
                written += _report_task(task, rows, shards_per_gpu, instances)
            except Exception:  # noqa: BLE001 - billing must never break a run
                log.exception("could not report the sacct observation of array task %s_%s", aid, i)
        if complete:
            create_exclusive(bdir / "reconciled" / "all", {"at": time.time()})
    for inst in instances.values():
        inst.dispose()
    return written
