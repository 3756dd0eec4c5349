"""The Slurm backend's accounting: an ended array task's ``sacct`` bill, and who writes it (the spool's markers).

- :func:`task_bill`: the :class:`~dagster_gpu.contracts.UnitBill` of one array task from its
  sacct records (every attempt; figures from the pure :func:`dagster_gpu.slurm.sacct_bill.sacct_figures`,
  ``billing/source: sacct``), priced at the slurm rate table the task's step context carries.
- :func:`elect_task_bill_writer`: exactly one process writes a task's bill: the one that creates its O_EXCL marker
  ``<batch>/reconciled/<task>.json``; when every task of the array has one, ``reconciled/all`` stops the
  sweep from reading that array again.
- :func:`unsettled_tasks`: tasks of finished job arrays (``done``) that have no marker yet, whoever launched
  them, for the settler's sweep (``dagster_gpu.executor.settle``).
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from dagster_gpu.billing.keys import GPU_SECONDS, NOTE, PREFIX, SOURCE
from dagster_gpu.contracts import UnitBill, read_step_context
from dagster_gpu.slurm.parse import AcctRow, StepUsage
from dagster_gpu.slurm.sacct_bill import sacct_figures
from dagster_gpu.slurm.spool import Spool, create_exclusive, read_json


def task_bill(env: Mapping[str, str], rows: Sequence[AcctRow], shards_per_gpu: int, *, gpu_tres_tracked: bool = True,
              step_usage: Mapping[str, float] | None = None) -> UnitBill:
    """The bill of one ended array task.

    Args:
        env: the task's worker environment (its manifest entry's ``env``): names the Dagster run and step,
            and carries the slurm rate table and what sbatch asked (``slurm_request``: GPU equivalents, the
            product to price at, the fraction of a GPU one GPU GRES is for a MIG type) in ``DAGSTER_GPU_STEP_CONTEXT``.
        rows: the task's sacct records, oldest first (one per attempt), the last one final.
        shards_per_gpu: shard GRES per GPU (a ``gres/shard`` record is billed as that fraction of a GPU).
        gpu_tres_tracked: whether sacct's AllocTRES carries GPUs (``AccountingStorageTRES=gres/gpu``). When
            not, GPU-seconds are the requested GPU equivalents × ElapsedRaw of each attempt and
            ``billing/source`` is ``sacct-requested``; else sacct's ``gres/gpu`` (× the MIG fraction) ×
            ElapsedRaw, ``billing/source: sacct``.
        step_usage: the task's ``gres/gpuutil`` / ``gres/gpumem`` step usage from sacct (:func:`step_gpu_usage`),
            put on the bill as ``slurm/gpuutil_ave_percent`` / ``slurm/gpumem_max_bytes``.

    Raises ValueError when ``rows`` is empty."""
    ctx = read_step_context(env)
    rates = ctx.get("rates") or {"default": 0.0}
    req = ctx.get("slurm_request") or {}
    figures = sacct_figures(rows, shards_per_gpu)
    meta = {k: v for k, v in figures.items() if not k.startswith(PREFIX)}
    if gpu_tres_tracked:
        gpu_seconds = figures[GPU_SECONDS] * float(req.get("fraction_per_gpu_gres", 1.0))
        source = "sacct"
    else:
        requested = float(req.get("gpus", ctx.get("gpu_count", 1) * (ctx.get("device_fraction") or 1.0)))
        gpu_seconds = figures["slurm/elapsed_seconds"] * requested
        source = "sacct-requested"
        meta[NOTE] = ("AccountingStorageTRES has no gres/gpu: requested GRES "
                                f"({req.get('gres') or 'gpu'}, {requested:g} GPU) x ElapsedRaw")
    if req.get("gres"):
        meta["slurm/requested_gres"] = str(req["gres"])
    for key, value in (step_usage or {}).items():
        meta[key] = value
    return UnitBill(
        gpu_seconds=gpu_seconds,
        rate_usd_per_gpu_hour=None,
        rates=rates,
        metadata={**meta, SOURCE: source, "dagster_gpu/backend": "slurm"},
        match=("slurm/job_id", figures["slurm/job_id"]),
        env=dict(env),
        device_type=req.get("product"),
    )


def step_gpu_usage(steps: Sequence[StepUsage]) -> dict[str, float]:
    """``slurm/gpuutil_ave_percent`` (the highest step average of ``gres/gpuutil``) and
    ``slurm/gpumem_max_bytes`` (the highest step maximum of ``gres/gpumem``) of one task's steps; {} when
    sacct recorded neither (Slurm < 23.02, or no GPU TRES accounting)."""
    out: dict[str, float] = {}
    util = [s.usage_ave["gres/gpuutil"] for s in steps if "gres/gpuutil" in s.usage_ave]
    mem = [s.usage_max["gres/gpumem"] for s in steps if "gres/gpumem" in s.usage_max]
    if util:
        out["slurm/gpuutil_ave_percent"] = float(max(util))
    if mem:
        out["slurm/gpumem_max_bytes"] = float(max(mem))
    return out


def task_env(spool: Spool, batch: str, task_id: int) -> Mapping[str, str] | None:
    """The worker environment of task ``task_id`` in the batch's manifest; None when it cannot be read."""
    man = read_json(spool.batch_dir(batch) / "manifest.json")
    tasks = (man or {}).get("tasks") or []
    return dict(tasks[task_id].get("env") or {}) if 0 <= task_id < len(tasks) else None


def elect_task_bill_writer(spool: Spool, batch: str, task_id: int) -> bool:
    """Create the task's marker; True for exactly one caller across processes (it writes the bill)."""
    bdir = spool.batch_dir(batch)
    if not create_exclusive(bdir / "reconciled" / f"{task_id}.json", {"at": time.time()}):
        return False
    sub = read_json(bdir / "submitted.json") or {}
    n = int(sub.get("tasks", 0))
    if n and all((bdir / "reconciled" / f"{i}.json").exists() for i in range(n)):
        create_exclusive(bdir / "reconciled" / "all", {"at": time.time()})
    return True


def unsettled_tasks(spool: Spool) -> list[tuple[str, Mapping[str, Any], int]]:
    """``(batch, submitted.json, task id)`` of every task of a done job array without a marker, oldest first."""
    out = []
    for bdir in sorted(spool.batches.iterdir()):
        if not (bdir / "done").exists() or (bdir / "reconciled" / "all").exists():
            continue
        sub = read_json(bdir / "submitted.json")
        if not sub:
            continue
        for i in range(int(sub.get("tasks", 0))):
            if not (bdir / "reconciled" / f"{i}.json").exists():
                out.append((bdir.name, sub, i))
    return out
