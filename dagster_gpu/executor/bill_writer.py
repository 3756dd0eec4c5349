"""One writer for the scheduler's bill of a work unit: an AssetObservation per partition it covered.

The Slurm backend (``sacct`` after an array task ends), the Kubernetes backend (the pod's running interval
after it ends) and the local backend (the worker process's interval) bill a whole unit:
``Backend.accounting(handle)`` returns it as a :class:`UnitBill` and the settler
(:mod:`dagster_gpu.executor.settle`) hands it to :class:`ObservationWriter`, the only code that writes
scheduler bills into Dagster. :func:`write_unit_bill` splits that bill over the unit's
partitions with :func:`dagster_gpu.billing.apportion.apportion_unit_bill` (materialized partitions in
proportion to their measured GPU-seconds, what is left over to the partitions the unit did not finish)
and writes one ``AssetObservation`` per partition into the Dagster instance named by the step's own
arguments. The parts add up to the scheduler's figure (each rounded to 4 significant digits, as the
materialization's figures are). Its keys are the ``bill/*`` names of :func:`dagster_gpu.billing.keys.billed`
(``bill/gpu_seconds``, ``bill/cost_usd``, ``bill/unit_gpu_seconds`` …), apart from the materialization's
measured ``billing/*``; a step that asked for no GPU (the vector index) is billed in CPU-seconds
(``bill/cpu_seconds``, ``bill/unit_cpu_seconds``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Mapping

import dagster as dg
from dagster import serialize_value
from dagster._grpc.types import ExecuteStepArgs

from dagster_gpu.billing.apportion import apportion_unit_bill
from dagster_gpu.billing.keys import (
    COST_USD,
    DEVICE_TYPE,
    DEVICES,
    DIFFERENCE_GPU_SECONDS,
    GPU_SECONDS,
    MEASURED_GPU_SECONDS,
    NOTE,
    PREFIX,
    RATE_USD_PER_GPU_HOUR,
    SOURCE,
    UNIT_GPU_SECONDS,
    UNIT_PARTITIONS,
    WHAT,
    billed,
    what_billed,
)
from dagster_gpu.billing.measured import billed_device
from dagster_gpu.billing.metering import cost_usd
from dagster_gpu.billing.ratecard import gpu_hour_rate
from dagster_gpu.contracts import UnitBill, read_step_context
from dagster_gpu.instance.events import metadata_get, metadata_number
from dagster_gpu.instance.step_args import step_args_from_env
from dagster_gpu.partitions.run_ranges import run_partition_keys
from dagster_gpu.relay.channel import RELAY_ENV
from dagster_gpu.worker.metadata import SETTING_KEYS, rounded

log = logging.getLogger(__name__)


def unit_rate(bill: UnitBill, device_type: str | None, parent_product: str | None = None) -> float:
    """USD per GPU-hour ``bill`` is charged at: its own ``rate_usd_per_gpu_hour`` when set, else the rate of
    ``device_type`` (``default`` when None) and ``parent_product`` in its rate table by the one pricing rule
    (:func:`dagster_gpu.billing.ratecard.gpu_hour_rate`); 0.0 when the table has neither that rate nor a
    ``default`` (a unit is billed at 0 rather than not at all)."""
    if bill.rate_usd_per_gpu_hour is not None:
        return float(bill.rate_usd_per_gpu_hour)
    try:
        return gpu_hour_rate(bill.rates or {}, device_type or "default", parent_product)
    except Exception:  # noqa: BLE001 - a rate table without default: bill at 0 rather than not at all
        return 0.0


class ObservationWriter:
    """Writes unit bills into the instances named by steps' args (one instance per ref, reused)."""

    def __init__(self) -> None:
        self._instances: dict[str, dg.DagsterInstance] = {}
        self._lock = threading.Lock()

    def instance_for(self, args: ExecuteStepArgs) -> dg.DagsterInstance:
        key = serialize_value(args.instance_ref)
        with self._lock:
            if key not in self._instances:
                self._instances[key] = dg.DagsterInstance.from_ref(args.instance_ref)
            return self._instances[key]

    def ready(self, bill: UnitBill) -> bool:
        """Whether ``bill`` may be written by a process that did not run its unit's step: False for a relayed unit
        (``DAGSTER_GPU_RELAY`` in ``bill.env``: its events reach the instance only when its run worker reads its
        channel) whose run has not finished, since its materializations may not be stored yet and the bill would
        be split as if none were; that run worker bills the unit itself once the channel is read to the end (or a
        later sweep, once the run ended). True otherwise. Raises what the instance raises."""

        args = step_args_from_env(bill.env) if not bill.empty and RELAY_ENV in bill.env else None
        if args is None:
            return True
        run = self.instance_for(args).get_run_by_id(args.run_id)
        return run is None or run.is_finished

    def write(self, bill: UnitBill) -> int:
        """Write the observations of the unit launched with worker environment ``bill.env``; returns how many
        (0 for an empty bill, or an environment that names no step). Raises what the instance raises."""
        if bill.empty:
            return 0
        env = bill.env
        args = step_args_from_env(env)
        if args is None:
            return 0
        pdef = (read_step_context(env).get("extra") or {}).get("partitions_def")
        return write_unit_bill(self.instance_for(args), args.run_id, args.step_keys_to_execute[0], pdef, bill)

    def close(self) -> None:
        with self._lock:
            for inst in self._instances.values():
                inst.dispose()
            self._instances.clear()


def write_unit_bill(
    instance: dg.DagsterInstance, run_id: str, step_key: str, partitions_def: str | None, bill: UnitBill
) -> int:
    """One observation per partition of the unit (see module doc); returns how many were written."""
    run = instance.get_run_by_id(run_id)
    assets = list(run.asset_selection or []) if run else []
    materialized: dict[str, tuple[dg.AssetKey, Mapping[str, Any]]] = {}
    done_in_run: set[str] = set()
    for rec in instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records:
        ev = rec.event_log_entry.dagster_event
        if ev is None or ev.step_key != step_key:
            continue
        mat = ev.step_materialization_data.materialization
        done_in_run.add(mat.partition or "")
        unit = metadata_get(mat.metadata, bill.match[0]) if bill.match is not None else None
        if unit is not None and str(unit) != bill.match[1]:
            continue  # materialized by another unit of the step (an earlier attempt)
        materialized[mat.partition or ""] = (mat.asset_key, mat.metadata)
    try:
        keys = run_partition_keys(instance, run.tags, partitions_def) if run else ()
    except ValueError:
        keys = ()
    failed = [k for k in keys if k not in done_in_run]
    if not materialized and not failed:
        failed = list(keys) or [""]
    measured = [(k, float(metadata_get(md, GPU_SECONDS) or 0.0)) for k, (_, md) in materialized.items()]
    first = next((md for _, md in materialized.values() if md.get(DEVICE_TYPE) is not None), {})
    total = bill.gpu_seconds
    if bill.wall_seconds is not None:  # no scheduler counted the devices: those the unit's materializations report
        devices = metadata_number(first, DEVICES)
        total = bill.wall_seconds * (devices if devices is not None else 1.0)
    parts = apportion_unit_bill(total, measured, failed)
    n = len(parts)
    product = metadata_get(first, "gpu/product_name")
    rate = unit_rate(bill, metadata_get(first, DEVICE_TYPE) or bill.device_type,
                     billed_device("cuda", str(product), 1, None)[1] if product else None)
    # a partition the unit did not materialize belongs to the run's asset (a run without an asset selection:
    # the asset its other partitions materialized)
    fallback = assets[0] if assets else next((ak for ak, _ in materialized.values()), None)
    ctx = read_step_context(bill.env)
    cpu = ran_on_cpu(ctx.get("gpu_count"), metadata_get(first, DEVICE_TYPE), scheduler_counted=bill.wall_seconds is None)
    cluster = (ctx.get("placement") or {}).get("cluster")  # a fleet's cluster: billed by its own accounting and rates
    observations: list[dg.AssetObservation] = []
    for key, share in parts:
        asset_key, mat_md = materialized.get(key, (fallback, {}))
        if asset_key is None:
            continue
        md = {
            **bill.metadata,
            GPU_SECONDS: float(share),
            RATE_USD_PER_GPU_HOUR: rate,
            COST_USD: cost_usd(share, rate),
            UNIT_GPU_SECONDS: float(total),
            UNIT_PARTITIONS: n,
            WHAT: what_billed(str(bill.metadata.get(SOURCE, "scheduler"))),
            **({"dagster_gpu/cluster": cluster} if cluster else {}),
        }
        m = metadata_get(mat_md, GPU_SECONDS)
        if isinstance(m, (int, float)):
            md[MEASURED_GPU_SECONDS] = float(m)
            md[DIFFERENCE_GPU_SECONDS] = float(share) - float(m)
        if key not in materialized:
            md[NOTE] = "not materialized by this unit: its share of the unit's time not accounted to materialized partitions"
        observations.append(dg.AssetObservation(asset_key=asset_key, partition=key or None,
                                                metadata=observation_metadata(md, cpu)))
    store_observations(instance, observations)
    log.info("run %s step %s: %d observation(s) of %s", run_id, step_key, len(observations), bill.metadata.get(SOURCE))
    return len(observations)


def ran_on_cpu(gpu_count: Any, device_type: Any, scheduler_counted: bool = False) -> bool:
    """Whether a unit's seconds are CPU seconds: its step asked for no GPU (``gpu_count`` 0: the vector index), or no
    scheduler counted its devices (the local backend's process interval) and its materializations say it ran on the
    CPU (``billing/device_type`` ``cpu``: ``ComputeSpec(device="cpu")``, or a host without a GPU). A scheduler's
    bill (``scheduler_counted``: sacct's allocated GPUs, a pod's claimed devices) stays GPU-seconds whatever device
    the worker then used: the allocation is what it billed. Pure."""
    return gpu_count == 0 or (not scheduler_counted and str(device_type or "") == "cpu")


def observation_metadata(md: Mapping[str, Any], cpu: bool) -> dict[str, Any]:
    """``md`` as a bill observation stores it: each ``billing/*`` key under its bill name
    (:func:`dagster_gpu.billing.keys.billed`: ``bill/gpu_seconds``, or ``bill/cpu_seconds`` when ``cpu``),
    every measured float rounded as the materialization rounds it (:func:`dagster_gpu.worker.metadata.rounded`,
    4 significant digits); a setting of the step (:data:`dagster_gpu.worker.metadata.SETTING_KEYS`: the device
    fraction, the rate) and other keys and values as they are."""
    out: dict[str, Any] = {}
    for k, v in md.items():
        if isinstance(v, float) and k not in SETTING_KEYS:
            v = rounded(v)
        out[billed(k, cpu) if k.startswith(PREFIX) else k] = v
    return out


def store_observations(instance: dg.DagsterInstance, observations: list[dg.AssetObservation]) -> None:
    """Store runless ``observations`` as ``report_runless_asset_event`` would, but one storage batch per asset
    key (``EventLogStorage.store_event_batch``: on PostgreSQL a single INSERT, so a unit's bill lands
    whole or not at all, and 500 partitions cost one statement instead of 500 connections)."""
    from dagster import DagsterEvent, DagsterEventType, EventLogEntry
    from dagster._core.events import AssetObservationData
    from dagster._core.instance.utils import RUNLESS_JOB_NAME, RUNLESS_RUN_ID
    from dagster._time import get_current_timestamp

    by_asset: dict[dg.AssetKey, list[EventLogEntry]] = {}
    for obs in observations:
        event = DagsterEvent(event_type_value=DagsterEventType.ASSET_OBSERVATION.value,
                             event_specific_data=AssetObservationData(obs), job_name=RUNLESS_JOB_NAME)
        by_asset.setdefault(obs.asset_key, []).append(EventLogEntry(
            user_message="", level=logging.INFO, job_name=RUNLESS_JOB_NAME, run_id=RUNLESS_RUN_ID, error_info=None,
            timestamp=get_current_timestamp(), step_key=None, dagster_event=event))
    for entries in by_asset.values():
        instance.event_log_storage.store_event_batch(entries)
