"""A Slurm work unit's handle: one array task of one job array in the spool, as the executor records it in the
event log (STEP_WORKER_STARTING metadata, so a resumed run re-attaches) and the sweep rebuilds it from the spool."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class SlurmHandle:
    """One array task.

    Attributes:
        array_job_id, array_task_id: Slurm's ids (``<array_job_id>_<array_task_id>`` is the task's job id).
        batch: the job array's folder in the spool (its manifest, the tasks' logs and markers).
        submitted_at: when sbatch returned (Unix seconds); sacct records submitted before it (an earlier job
            that had the same id) are not this task's. 0.0 when unknown.
        tasks_in_array: how many tasks the job array has (0 when unknown).
        log_file: the task's stdout/stderr file ("" when unknown).
        spool: the spool's root folder ("" when unknown).
        cluster: the Slurm cluster (``-M``) of a multi-cluster site, None for the default one.
    """

    array_job_id: int
    array_task_id: int
    batch: str
    submitted_at: float = 0.0
    tasks_in_array: int = 0
    log_file: str = ""
    spool: str = ""
    cluster: str | None = None

    @property
    def job_id(self) -> str:
        """``<array_job_id>_<array_task_id>``: what squeue, sacct and scancel call the task."""
        return f"{self.array_job_id}_{self.array_task_id}"

    def to_handle(self) -> dict[str, Any]:
        """The handle as the executor stores it (JSON values; ``job_id`` included for readers of the event log)."""
        return {
            "job_id": self.job_id, "cluster": self.cluster, "array_job_id": self.array_job_id,
            "array_task_id": self.array_task_id, "batch": self.batch, "submitted_at": self.submitted_at,
            "tasks_in_array": self.tasks_in_array, "log_file": self.log_file, "spool": self.spool,
        }

    @classmethod
    def from_handle(cls, handle: Mapping[str, Any]) -> "SlurmHandle":
        """The handle from its stored form (:meth:`to_handle`). Raises KeyError without the task's ids or
        batch, ValueError for ids that are not integers."""
        return cls(
            array_job_id=int(handle["array_job_id"]), array_task_id=int(handle["array_task_id"]),
            batch=str(handle["batch"]), submitted_at=float(handle.get("submitted_at") or 0.0),
            tasks_in_array=int(handle.get("tasks_in_array") or 0), log_file=str(handle.get("log_file") or ""),
            spool=str(handle.get("spool") or ""), cluster=handle.get("cluster") or None,
        )
