"""The run queue limit of the instance a ``dagster-daemon`` serves: how many runs it starts at once.

Dagster's QueuedRunCoordinator holds submitted runs in a queue and its daemon starts at most
``max_concurrent_runs`` of them (``run_coordinator: config: max_concurrent_runs`` in ``dagster.yaml``;
``concurrency: runs: max_concurrent_runs`` takes precedence over it when both are set:
``dagster/_core/instance/config.py`` ``ConcurrencyConfig.from_concurrency_settings``, dagster 1.13).
A daemon started with ``--instance-ref`` (``dagster/_daemon/cli/__init__.py``, hidden option) builds its
instance from that ref rather than from ``$DAGSTER_HOME/dagster.yaml``, so a limit can be given to one daemon
process without rewriting the user's file: :func:`daemon_instance_ref`.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

#: The instance's run coordinator module and class (Dagster's own).
RUN_COORDINATOR = "dagster._core.run_coordinator"
QUEUED_RUN_COORDINATOR = "QueuedRunCoordinator"


def host_run_limit(cpu_count: int | None = None) -> int:
    """Runs at once that fit this host: its CPU count (``os.cpu_count()`` when ``cpu_count`` is None), at least 1."""
    n = os.cpu_count() if cpu_count is None else cpu_count
    return max(1, n or 1)


def configured_run_limit(config: Mapping[str, Any]) -> int | None:
    """The run queue limit a ``dagster.yaml`` mapping ``config`` sets: ``concurrency.runs.max_concurrent_runs``,
    else a QueuedRunCoordinator's ``run_coordinator.config.max_concurrent_runs``; None when it sets neither."""
    runs = ((config.get("concurrency") or {}).get("runs") or {})
    if "max_concurrent_runs" in runs:
        return runs["max_concurrent_runs"]
    rc = config.get("run_coordinator") or {}
    if rc.get("class") == QUEUED_RUN_COORDINATOR:
        return (rc.get("config") or {}).get("max_concurrent_runs")
    return None


def run_queue_overrides(config: Mapping[str, Any], limit: int) -> dict[str, Any]:
    """The top-level ``dagster.yaml`` sections that, replacing those of ``config``, give the instance a
    QueuedRunCoordinator starting at most ``limit`` (>= 1) runs at once; the rest of a QueuedRunCoordinator's
    config (tag limits, dequeue interval) and of the ``concurrency`` section is kept. Raises ValueError for
    ``limit`` < 1 (Dagster reads 0 as "start none", negative as "no limit")."""
    if limit < 1:
        raise ValueError(f"max_concurrent_runs must be at least 1, got {limit}")
    rc = config.get("run_coordinator") or {}
    kept = dict(rc.get("config") or {}) if rc.get("class") == QUEUED_RUN_COORDINATOR else {}
    out: dict[str, Any] = {"run_coordinator": {"module": RUN_COORDINATOR, "class": QUEUED_RUN_COORDINATOR,
                                               "config": {**kept, "max_concurrent_runs": limit}}}
    concurrency = config.get("concurrency") or {}
    if "max_concurrent_runs" in (concurrency.get("runs") or {}):
        out["concurrency"] = {**concurrency, "runs": {**concurrency["runs"], "max_concurrent_runs": limit}}
    return out


def read_instance_config(home: str) -> dict[str, Any]:
    """``home``'s ``dagster.yaml`` as Dagster reads it (``{}`` when there is none); env references unresolved."""
    from dagster._core.instance.config import dagster_instance_config

    return dict(dagster_instance_config(home)[0])


def daemon_instance_ref(home: str, limit: int | None):
    """An ``InstanceRef`` of the instance at ``home`` (its ``dagster.yaml``, left as it is) whose run queue
    starts at most ``limit`` runs at once; ``limit`` None: the limit ``dagster.yaml`` sets, or
    :func:`host_run_limit` when it sets none. Returns (ref, the limit applied, where it comes from: in words).

    The ref carries the instance's config as ``dagster.yaml`` writes it (env references unresolved); Dagster's
    own run launcher passes the same ref on its run workers' command lines (``DefaultRunLauncher``)."""
    from dagster._core.instance.ref import InstanceRef

    config = read_instance_config(home)
    why = "--max-concurrent-runs"
    if limit is None:
        if (configured := configured_run_limit(config)) is not None:
            return InstanceRef.from_dir(home), configured, f"max_concurrent_runs in {home}/dagster.yaml"
        limit, why = host_run_limit(), "the host's CPU count; --max-concurrent-runs N to change"
    return InstanceRef.from_dir(home, overrides=run_queue_overrides(config, limit)), limit, why
