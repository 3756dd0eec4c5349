"""Post-run billing from ``sacct``: one AssetObservation per partition with ``billing/source: sacct``.

Figures of one array task, summed over every attempt (a preempted and requeued task is billed for the
time each attempt held its GPUs):

- ``slurm/elapsed_seconds``: sum of ``ElapsedRaw``;
- ``billing/gpu_seconds``: sum of ``ElapsedRaw × (gres/gpu + gres/shard ÷ shards_per_gpu)``;
- ``slurm/billing_tres_seconds``: sum of ``ElapsedRaw × billing`` (TRESBillingWeights applied);
Pure: the Slurm backend (``dagster_gpu.slurm.accounting``) finds the finished tasks and
hands each task's figures to :class:`dagster_gpu.executor.bill_writer.ObservationWriter`, which splits them
over the partitions of the task's work unit (cost at the slurm rate card's GPU-hour rate, measured and
difference figures per partition).
"""

from __future__ import annotations

from typing import Any, Sequence

from dagster_gpu.billing.keys import GPU_SECONDS
from dagster_gpu.slurm.parse import AcctRow


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
        GPU_SECONDS: float(gpu_secs),
    }
