"""Run tags that let the Runs page show where each partition ran and what it cost, without opening it.

- ``dagster_gpu/ran_on`` (e.g. ``slurm``, ``kubernetes on NVIDIA A100-SXM4-80GB``), added by the
  executor when it launches the step (:func:`tag_launch`);
- ``dagster_gpu/cost_usd`` (6 decimals), added by the step worker after it measured the bill
  (:func:`add_cost`); a run whose step embeds several partitions adds each partition's cost.

The keys use ``dagster_gpu/`` (underscore), not ``dagster-gpu/``: run tags under ``dagster-gpu/`` are
GPU *request* overrides (``dagster-gpu/backend`` forces a backend), and a re-executed run inherits
its parent's tags. Tagging never fails a launch or a step: errors are logged and ignored.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

RAN_ON_TAG = "dagster_gpu/ran_on"
COST_TAG = "dagster_gpu/cost_usd"


def ran_on(backend: str, device: str | None) -> str:
    """``backend`` or ``backend on device`` (the tag's value)."""
    return f"{backend} on {device}" if device else backend


def tag_launch(instance, run_id: str, backend: str, device: str | None = None) -> None:
    """Tag the run with the backend (and device) its step was launched on."""
    try:
        instance.add_run_tags(run_id, {RAN_ON_TAG: ran_on(backend, device)})
    except Exception:  # noqa: BLE001 - a label only
        log.warning("could not tag run %s with its backend", run_id, exc_info=True)


def add_cost(instance, run_id: str, cost_usd: float) -> None:
    """Add ``cost_usd`` to the run's ``dagster_gpu/cost_usd`` tag (created at 0)."""
    try:
        run = instance.get_run_by_id(run_id)
        if run is None:
            return
        before = float(run.tags.get(COST_TAG, "0") or 0)
        instance.add_run_tags(run_id, {COST_TAG: f"{before + float(cost_usd):.6f}"})
    except Exception:  # noqa: BLE001 - a label only
        log.warning("could not tag run %s with its cost", run_id, exc_info=True)
