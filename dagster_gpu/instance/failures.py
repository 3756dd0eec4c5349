"""What a person needs to follow up a failed partition: its run, the first line of the error, where the full log is.

I/O adapter over the instance's event log (``STEP_FAILURE`` and ``STEP_WORKER_STARTING`` records); the
formatting is pure (:func:`first_line`, :func:`log_location`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import dagster as dg

from dagster_gpu.instance.events import latest_launch_metadata, metadata_values


@dataclass(frozen=True)
class FailureDetail:
    """One failed partition.

    Attributes:
        partition_key: the Dagster partition key. run_id: its latest run (None: never run).
        error: the first line of the step's error (or the run's status when no step failed).
        log: where the full log is: the worker's log file (local backend, Slurm array task), the pod's
            ``kubectl logs`` command (an ended pod is deleted unless ``delete_finished_pods: false``; its
            termination message, the log's last lines, is in the step failure), or the run's page in the
            Dagster UI.
    """

    partition_key: str
    run_id: str | None
    error: str
    log: str


def first_line(text: str | None, limit: int = 160) -> str:
    """The first non-blank line of ``text`` (at most ``limit`` characters, ``…`` when cut); '' for None."""
    for line in (text or "").splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def log_location(launch_md: Mapping[str, Any], run_id: str | None) -> str:
    """Where the full log of a step is, from its launch event's metadata (values or MetadataValues)."""
    v = metadata_values(launch_md)
    if v.get("local/log_file"):
        return str(v["local/log_file"])
    if v.get("slurm/log_file"):
        return str(v["slurm/log_file"])
    if v.get("k8s/pod"):  # the settler deletes an ended pod (delete_finished_pods), its log with it
        return (f"kubectl logs -n {v.get('k8s/namespace', 'default')} {v['k8s/pod']} while the pod exists; "
                f"its last lines are in run {run_id}'s step failure")
    return f"run {run_id} in the Dagster UI (Runs → {run_id})" if run_id else "no run recorded"


def launch_metadata(instance: dg.DagsterInstance, run_id: str) -> Mapping[str, Any]:
    """The metadata of the run's latest step launch (``STEP_WORKER_STARTING``: the backend's handle, e.g.
    ``slurm/job_id``, ``k8s/pod``, ``local/unit``, the log file); {} when the run launched no worker."""
    return latest_launch_metadata(instance, run_id)


def failure_detail(instance: dg.DagsterInstance, partition_key: str, run_id: str | None, error: str | None) -> FailureDetail:
    """The detail of one failed partition; ``error`` is the message already known (its first line is kept)."""
    log = log_location(launch_metadata(instance, run_id) if run_id else {}, run_id)
    return FailureDetail(partition_key, run_id, first_line(error) or "failed", log)


def partition_line(message: str, key: str) -> str:
    """The line of a unit's failure message about partition ``key`` (``key: why``), else its first line."""
    for line in message.splitlines():
        if line.startswith(f"{key}: "):
            return line[len(key) + 2 :]
    return message.strip().splitlines()[0] if message.strip() else message


def step_failure_message(instance: dg.DagsterInstance, run_id: str) -> str | None:
    """The run's step failure: the user failure's description (a unit's names each failed partition, one
    ``key: why`` line each), else the error's first line; None when no step failed."""
    recs = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_FAILURE).records
    for r in recs:
        ev = r.event_log_entry.dagster_event
        data = ev.step_failure_data if ev else None
        if data is None:
            continue
        if data.user_failure_data and data.user_failure_data.description:
            return data.user_failure_data.description
        if data.error and data.error.message:
            return data.error.message.strip().splitlines()[0]
    return None
