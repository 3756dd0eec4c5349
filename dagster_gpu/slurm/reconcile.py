"""Post-run billing from ``sacct``: one AssetObservation per partition with ``billing/source: sacct``.

Figures of one array task, summed over every attempt (a preempted and requeued task is billed for the
time each attempt held its GPUs):

- ``slurm/elapsed_seconds``: sum of ``ElapsedRaw``;
- ``billing/gpu_seconds``: sum of ``ElapsedRaw × (gres/gpu + gres/shard ÷ shards_per_gpu)``;
- ``slurm/billing_tres_seconds``: sum of ``ElapsedRaw × billing`` (TRESBillingWeights applied);
- ``billing/cost_usd`` at the slurm rate card rate; ``billing/measured_gpu_seconds`` and
  ``billing/difference_gpu_seconds`` (sacct − measured) when the materialization has a measured figure.

:func:`sacct_figures` and :func:`observation_metadata` are pure; :func:`reconcile_spool` reads the spool
and writes observations into the Dagster instance of each task (from its serialized instance ref).
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

from dagster_gpu.billing.metering import cost_usd
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


def observation_metadata(
    figures: Mapping[str, Any], rate_usd_per_gpu_hour: float, measured_gpu_seconds: float | None
) -> dict[str, Any]:
    """Metadata of the sacct observation (all numbers finite)."""
    md = dict(figures)
    md["billing/source"] = "sacct"
    md["billing/rate_usd_per_gpu_hour"] = float(rate_usd_per_gpu_hour)
    md["billing/cost_usd"] = cost_usd(figures["billing/gpu_seconds"], rate_usd_per_gpu_hour)
    md["dagster_gpu/backend"] = "slurm"
    if measured_gpu_seconds is not None:
        md["billing/measured_gpu_seconds"] = float(measured_gpu_seconds)
        md["billing/difference_gpu_seconds"] = float(figures["billing/gpu_seconds"] - measured_gpu_seconds)
    return md


# ------------------------------------------------------------------------------------ the reporter
def _step_args(env: Mapping[str, str]):
    import base64
    import zlib

    from dagster._grpc.types import ExecuteStepArgs
    from dagster._serdes import deserialize_value

    raw = env["DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS"]
    return deserialize_value(zlib.decompress(base64.b64decode(raw.encode())).decode(), ExecuteStepArgs)


def _report_task(task: Mapping[str, Any], rows: Sequence[AcctRow], shards_per_gpu: int, instances: dict) -> int:
    """Report the observation(s) of one finished array task; returns how many were written."""
    import json

    import dagster as dg
    from dagster import DagsterEventType, DagsterInstance

    from dagster_gpu.billing.ratecard import rate_from_table
    from dagster_gpu.worker.context import ENV_VAR

    env = task["env"]
    args = _step_args(env)
    from dagster._serdes import serialize_value

    key = serialize_value(args.instance_ref)
    if key not in instances:
        instances[key] = DagsterInstance.from_ref(args.instance_ref)
    instance = instances[key]
    rates = json.loads(env.get(ENV_VAR, "{}")).get("rates") or {"default": 0.0}
    figures = sacct_figures(rows, shards_per_gpu)
    targets: list[tuple[Any, str | None, Mapping[str, Any]]] = []
    for rec in instance.get_records_for_run(task["run_id"], of_type=DagsterEventType.ASSET_MATERIALIZATION).records:
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
        try:
            rate = rate_from_table(rates, device_v)
        except Exception:  # noqa: BLE001 - a rate table without default: bill at 0 rather than not at all
            rate = 0.0
        md = observation_metadata(figures, rate, measured_v)
        instance.report_runless_asset_event(
            dg.AssetObservation(asset_key=asset_key, partition=partition, metadata=md)
        )
    return len(targets)


def reconcile_spool(spool, acct: Sequence[AcctRow], shards_per_gpu: int = 4) -> int:
    """Report sacct observations for every finished task of the spool's done job arrays not yet
    reported (each exactly once across processes: an O_EXCL marker per task). Returns observations written."""
    import time

    from dagster_gpu.slurm.spool import create_exclusive, read_json
    from dagster_gpu.slurm.status import records_for

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
