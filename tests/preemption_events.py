"""Helpers: the events a preempted step leaves in a real Dagster instance, shaped as gpu_executor, the step worker
and the bill writer write them (launch events with the pool, the worker's preemption engine event, bills)."""

from __future__ import annotations

import uuid

import dagster as dg
from dagster._core.events import EngineEventData
from dagster._core.storage.dagster_run import DagsterRun

from dagster_gpu.executor.bill_writer import store_observations
from dagster_gpu.instance.events import PREEMPTED_PARTITION_KEY, PREEMPTION_POOL_KEY, PREEMPTIONS_KEY

JOB = "__ASSET_JOB"


def new_run(instance: dg.DagsterInstance, asset: str = "emb") -> str:
    run_id = str(uuid.uuid4())
    instance.add_run(DagsterRun(job_name=JOB, run_id=run_id, status=dg.DagsterRunStatus.SUCCESS,
                                asset_selection=frozenset({dg.AssetKey(asset)})))
    return run_id


def launch(instance, run_id: str, step_key: str, pool: str | None, unit: tuple[str, str], preemptions: int = 0) -> None:
    """A ``STEP_WORKER_STARTING`` event as the step handler writes it (pool, unit key, preemptions)."""
    md = {unit[0]: dg.MetadataValue.text(unit[1])}
    if pool:
        md[PREEMPTION_POOL_KEY] = dg.MetadataValue.text(pool)
    if preemptions:
        md[PREEMPTIONS_KEY] = dg.MetadataValue.int(preemptions)
    instance.report_dagster_event(dg.DagsterEvent(event_type_value="STEP_WORKER_STARTING", job_name=JOB,
                                                  step_key=step_key, event_specific_data=EngineEventData(metadata=md)),
                                  run_id)


def worker_stopped(instance, run_id: str, step_key: str, partition: str) -> None:
    """The engine event the step worker records when it stopped for a preemption (worker/unit.py)."""
    md = {PREEMPTED_PARTITION_KEY: dg.MetadataValue.text(partition), "dagster_gpu/stop_signal": "SIGTERM"}
    instance.report_dagster_event(dg.DagsterEvent(event_type_value="ENGINE_EVENT", job_name=JOB, step_key=step_key,
                                                  event_specific_data=EngineEventData(metadata=md)), run_id)


def bill(instance, unit: tuple[str, str], unit_gpu_seconds: float, partitions=("p1", "p2"), source="sacct",
         attempt_states: str | None = None, asset: str = "emb") -> None:
    """A unit's bill as the bill writer stores it: one observation per partition, each with the unit's figures."""
    share = unit_gpu_seconds / len(partitions)
    obs = []
    for k in partitions:
        md = {unit[0]: unit[1], "billing/source": source, "billing/gpu_seconds": share,
              "billing/unit_gpu_seconds": unit_gpu_seconds, "billing/unit_partitions": len(partitions)}
        if attempt_states is not None:
            md["slurm/attempt_states"] = attempt_states
            md["slurm/attempts"] = attempt_states.count(",") + 1
        obs.append(dg.AssetObservation(dg.AssetKey(asset), partition=k, metadata=md))
    store_observations(instance, obs)


def record_preempted_steps(instance) -> None:
    """Two runs: a Kubernetes step preempted once (relaunched; the worker's event too) over 2 GPU-h on
    ``kubernetes:batch-low``; a Slurm task preempted twice and requeued (sacct) over 1 GPU-h on ``slurm:gpu/low``;
    plus a launch whose bill has not landed and one without a pool (neither teaches anything)."""
    r1 = new_run(instance)
    launch(instance, r1, "emb", "kubernetes:batch-low", ("k8s/pod", "pod-a"))
    worker_stopped(instance, r1, "emb", "p1")
    launch(instance, r1, "emb", "kubernetes:batch-low", ("k8s/pod", "pod-a-p1"), preemptions=1)
    bill(instance, ("k8s/pod", "pod-a"), 1800.0, source="pod-interval")
    bill(instance, ("k8s/pod", "pod-a-p1"), 5400.0, source="pod-interval")
    r2 = new_run(instance)
    launch(instance, r2, "emb", "slurm:gpu/low", ("slurm/job_id", "77_0"))
    worker_stopped(instance, r2, "emb", "p1")
    bill(instance, ("slurm/job_id", "77_0"), 3600.0, attempt_states="PREEMPTED,PREEMPTED,COMPLETED")
    r3 = new_run(instance)
    launch(instance, r3, "emb", "slurm:gpu/low", ("slurm/job_id", "78_0"))  # its bill has not landed
    launch(instance, r3, "other", None, ("local/unit", "u1"))  # no pool: an earlier version's launch
    bill(instance, ("local/unit", "u1"), 3600.0, source="process")
