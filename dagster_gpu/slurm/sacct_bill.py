"""Post-run billing from ``sacct``: one AssetObservation per partition with ``billing/source: sacct``.

Figures of one array task, summed over every attempt (a preempted and requeued task is billed for the
time each attempt held its GPUs):

- ``slurm/elapsed_seconds``: sum of ``ElapsedRaw``;
- ``billing/gpu_seconds``: sum of ``ElapsedRaw × (gres/gpu + gres/shard ÷ shards_per_gpu)``;
- ``slurm/billing_tres_seconds``: sum of ``ElapsedRaw × billing`` (TRESBillingWeights applied);
- ``billing/cost_usd`` at the slurm rate card rate; ``billing/measured_gpu_seconds`` and
  ``billing/difference_gpu_seconds`` (sacct − measured) when the materialization has a measured figure.

Pure: the Slurm backend (``dagster_gpu.executor.backends.slurm_accounting``) finds the finished tasks and
writes the observations into Dagster.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from dagster_gpu.billing.metering import cost_usd
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
