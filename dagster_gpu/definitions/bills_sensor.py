"""A sensor that bills the work units no run worker billed.

A run worker settles the units it launched (:mod:`dagster_gpu.executor.settle`) and, at exit, waits at most
each backend's ``settle_wait_s`` for their bills. A unit whose bill is not in by then — slurmdbd down for
minutes while the run ends, so ``sacct`` fails; a run worker killed first — was left to "the next
process's sweep", which never comes when no other run uses the same spool or namespace (measured:
``bench/faults.py`` with slurmdbd down across the end of a 40-partition backfill left 4 Slurm units unbilled).
This sensor is that next process: each tick it sweeps every remote backend of the executor config
(``Backend.unsettled()`` -> accounting -> elect_bill_writer -> one observation per partition), so a bill lands once
the scheduler has it, whether or not another run ever comes. Exactly one bill per unit: ``elect_bill_writer`` decides.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import dagster as dg

from dagster_gpu.contracts import Backend
from dagster_gpu.executor.registry import build_backend, configured_backends
from dagster_gpu.executor.settle import Settler


def remote_backends(executor_config: Mapping[str, Any], log_dir: Path) -> list[Backend]:
    """The Slurm and Kubernetes backends ``executor_config`` configures (``local`` bills nothing)."""
    return [build_backend(n, executor_config, log_dir) for n in configured_backends(executor_config) if n != "local"]


def sweep_unit_bills(backends: Iterable[Backend], settler: Settler | None = None) -> dict[str, int]:
    """Settle every ended, unbilled unit of ``backends``; returns units settled per backend name."""
    settler = settler or Settler()
    return {b.name: settler.sweep(b) for b in backends}


def unit_bills_sensor(
    executor_config: Mapping[str, Any],
    *,
    name: str = "dagster_gpu_unit_bills",
    minimum_interval_seconds: int = 60,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.RUNNING,
    backends: Callable[[dg.SensorEvaluationContext], Iterable[Backend]] | None = None,
    settler: Callable[[], Settler] = Settler,
) -> dg.SensorDefinition:
    """A sensor sweeping the unbilled units of ``executor_config``'s backends every
    ``minimum_interval_seconds`` seconds (the same dict given to ``gpu_executor.configured``).

    Running by default: it only reads the schedulers and writes billing observations. ``backends`` and
    ``settler`` replace how the backends and the settler are made (tests). Never requests a run; the skip
    reason says how many units it billed per backend.
    """

    def _backends(context: dg.SensorEvaluationContext) -> Iterable[Backend]:
        root = context.instance.root_directory if context.instance.is_persistent else "."
        return remote_backends(executor_config, Path(root) / "dagster_gpu" / "local-workers")

    # One settler for the code server's life: it keeps the bills whose write failed, for the next tick.
    the_settler = functools.cache(settler)

    @dg.sensor(name=name, minimum_interval_seconds=minimum_interval_seconds, default_status=default_status)
    def _sensor(context: dg.SensorEvaluationContext):
        the_settler().pass_once()  # bills released on an earlier tick whose write failed
        done = sweep_unit_bills((backends or _backends)(context), the_settler())
        billed = ", ".join(f"{n}: {k}" for n, k in done.items()) or "no remote backend configured"
        return dg.SkipReason(f"units billed this tick: {billed}")

    return _sensor
