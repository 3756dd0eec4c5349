"""Backend-specific materialization metadata, read from the environment the scheduler gives the worker."""

from __future__ import annotations

import os
from typing import Any, Mapping

from dagster_gpu.contracts import LOCAL_UNIT_ENV


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v not in (None, "") else None
    except ValueError:
        return None


def backend_metadata(backend: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``slurm/*`` from SLURM_* variables, ``k8s/*`` from the pod's downward-API variables, ``local/unit``
    from the local backend's :data:`dagster_gpu.contracts.LOCAL_UNIT_ENV`.

    Slurm sets SLURM_JOB_ID (this task's own job id), SLURM_ARRAY_JOB_ID and SLURM_ARRAY_TASK_ID for an
    array task. The Kubernetes backend sets DAGSTER_GPU_K8S_NAMESPACE / DAGSTER_GPU_K8S_POD via the
    downward API (``metadata.namespace`` / ``metadata.name``).
    """
    e = env if env is not None else os.environ
    md: dict[str, Any] = {}
    if backend == "slurm" and e.get("SLURM_JOB_ID"):
        md["slurm/job_id"] = e["SLURM_JOB_ID"]
        if (aj := _int(e.get("SLURM_ARRAY_JOB_ID"))) is not None:
            md["slurm/array_job_id"] = aj
        if (at := _int(e.get("SLURM_ARRAY_TASK_ID"))) is not None:
            md["slurm/array_task_id"] = at
        if e.get("SLURM_JOB_PARTITION"):
            md["slurm/slurm_partition"] = e["SLURM_JOB_PARTITION"]
    if backend == "local" and e.get(LOCAL_UNIT_ENV):
        md["local/unit"] = e[LOCAL_UNIT_ENV]
    if backend == "kubernetes":
        for key, var in (("k8s/namespace", "DAGSTER_GPU_K8S_NAMESPACE"), ("k8s/pod", "DAGSTER_GPU_K8S_POD")):
            if e.get(var):
                md[key] = e[var]
    return md
