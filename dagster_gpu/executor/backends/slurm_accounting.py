"""The Slurm backend's accounting: an ended array task's ``sacct`` bill, and who writes it (the spool's markers).

- :func:`task_bill`: the :class:`~dagster_gpu.executor.observations.UnitBill` of one array task from its
  sacct records (every attempt; figures from the pure :func:`dagster_gpu.slurm.sacct_bill.sacct_figures`,
  ``billing/source: sacct``), priced at the slurm rate table the task's step context carries.
- :func:`claim_task`: exactly one process writes a task's bill: the one that creates its O_EXCL marker
  ``<batch>/reconciled/<task>.json``; when every task of the array has one, ``reconciled/all`` stops the
  sweep from reading that array again.
- :func:`unsettled_tasks`: tasks of finished job arrays (``done``) that have no marker yet, whoever launched
  them, for the settler's sweep (``dagster_gpu.executor.settle``).
"""

from __future__ import annotations

import json
import time
from typing import Any, Mapping, Sequence

from dagster_gpu.executor.observations import UnitBill
from dagster_gpu.slurm.parse import AcctRow
from dagster_gpu.slurm.sacct_bill import sacct_figures
from dagster_gpu.slurm.spool import Spool, create_exclusive, read_json
from dagster_gpu.worker.context import ENV_VAR as STEP_CONTEXT_ENV


def task_bill(env: Mapping[str, str], rows: Sequence[AcctRow], shards_per_gpu: int) -> UnitBill:
    """The bill of one ended array task.

    Args:
        env: the task's worker environment (its manifest entry's ``env``): names the Dagster run and step,
            and carries the slurm rate table in ``DAGSTER_GPU_STEP_CONTEXT``.
        rows: the task's sacct records, oldest first (one per attempt), the last one final.
        shards_per_gpu: shard GRES per GPU (a ``gres/shard`` record is billed as that fraction of a GPU).

    Raises ValueError when ``rows`` is empty."""
    rates = json.loads(env.get(STEP_CONTEXT_ENV, "{}")).get("rates") or {"default": 0.0}
    figures = sacct_figures(rows, shards_per_gpu)
    return UnitBill(
        gpu_seconds=figures["billing/gpu_seconds"],
        rate_usd_per_gpu_hour=None,
        rates=rates,
        metadata={**{k: v for k, v in figures.items() if not k.startswith("billing/")},
                  "billing/source": "sacct", "dagster_gpu/backend": "slurm"},
        match=("slurm/job_id", figures["slurm/job_id"]),
        env=dict(env),
    )


def task_env(spool: Spool, batch: str, task_id: int) -> Mapping[str, str] | None:
    """The worker environment of task ``task_id`` in the batch's manifest; None when it cannot be read."""
    man = read_json(spool.batch_dir(batch) / "manifest.json")
    tasks = (man or {}).get("tasks") or []
    return dict(tasks[task_id].get("env") or {}) if 0 <= task_id < len(tasks) else None


def claim_task(spool: Spool, batch: str, task_id: int) -> bool:
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
