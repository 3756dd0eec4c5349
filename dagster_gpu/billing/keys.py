"""The metadata keys of dagster-gpu's bills, written once (pure).

Every bill in Dagster is metadata under these keys: the worker's measured bill on each partition's
AssetMaterialization (``dagster_gpu.worker.metadata``) under ``billing/*``, and the scheduler's bill on each
partition's AssetObservation (``dagster_gpu.executor.bill_writer``) under the same names with the prefix
``bill/`` (:func:`billed`), so that on the partition's page (where Dagster shows each key's latest value
across materializations and observations) the scheduler's figures stand beside the measured ones instead
of replacing them. The report, the backfill summary and the bills read back (``dagster_gpu.instance.bills``)
read the observations through :func:`bill_value`, which also reads those written under ``billing/*``. Units are
in the names: seconds, GPU-seconds (whole-GPU equivalents × seconds), CPU-seconds (a step that asked for no
GPU, such as the vector index: its process's wall seconds), USD, USD per GPU-hour (per CPU-hour for a CPU step).
"""

from __future__ import annotations

from typing import Any, Mapping

#: Every billing key starts with this.
PREFIX = "billing/"

#: GPU-seconds billed: whole-GPU equivalents (count, or a MIG/shared slice's fraction) × seconds.
GPU_SECONDS = "billing/gpu_seconds"
#: Wall seconds billed (the worker's measured bill: process start to the end of the asset body).
WALL_SECONDS = "billing/wall_seconds"
#: Whole-GPU equivalents the wall seconds were billed on.
DEVICES = "billing/devices"
#: The rate card's device type the bill was priced as (``cpu`` for a CPU-only step).
DEVICE_TYPE = "billing/device_type"
#: USD per GPU-hour the bill was priced at.
RATE_USD_PER_GPU_HOUR = "billing/rate_usd_per_gpu_hour"
#: USD: GPU-seconds × rate ÷ 3600.
COST_USD = "billing/cost_usd"
#: Who measured it: ``measured`` (the worker), ``sacct``, ``sacct-requested``, ``pod-interval``, ``process``.
SOURCE = "billing/source"
#: Why a figure is what it is (a partition the unit did not materialize, sacct without gres/gpu).
NOTE = "billing/note"
#: The scheduler's GPU-seconds for the whole unit, on each partition's share.
UNIT_GPU_SECONDS = "billing/unit_gpu_seconds"
#: How many partitions the unit's bill was split over.
UNIT_PARTITIONS = "billing/unit_partitions"
#: The partition's measured GPU-seconds (its materialization's ``GPU_SECONDS``), beside the scheduler's share.
MEASURED_GPU_SECONDS = "billing/measured_gpu_seconds"
#: The scheduler's share minus the measured GPU-seconds.
DIFFERENCE_GPU_SECONDS = "billing/difference_gpu_seconds"
#: Text saying whose figures a bill's ``billing/*`` keys hold, on the same page as them: the step worker's own
#: measurement (materialization) or the scheduler's bill (observation), so two GPU-seconds side by side are
#: told apart.
WHAT = "billing/what"


def what_measured() -> str:
    """:data:`WHAT` on the materialization (``billing/source: measured``)."""
    return ("measured by the step worker (its own clock: this partition's interval plus its share of the "
            "unit's start-up); not the scheduler's bill, which arrives later as this partition's "
            "observation (bill/* keys; bill/source sacct, pod-interval or process)")


def what_billed(source: str) -> str:
    """``bill/what`` on a scheduler-bill observation whose ``bill/source`` is ``source``."""
    return (f"the scheduler's bill ({source}): this partition's share of its work unit's billed time (bill/unit_* "
            f"are the whole unit's); the materialization's billing/* figures are the step worker's own measurement")


#: Every key of the scheduler's bill on an observation starts with this (see the module doc).
BILL_PREFIX = "bill/"


def billed(key: str, cpu: bool = False) -> str:
    """The observation key of ``key`` (a ``billing/*`` key, e.g. :data:`GPU_SECONDS`): ``bill/gpu_seconds``;
    with ``cpu`` (a step that asked for no GPU) ``gpu`` in the name reads ``cpu`` (``bill/cpu_seconds``,
    ``bill/unit_cpu_seconds``, ``bill/rate_usd_per_cpu_hour``). Raises ValueError for a key without
    :data:`PREFIX`."""
    if not key.startswith(PREFIX):
        raise ValueError(f"not a billing key: {key!r}")
    name = key[len(PREFIX):]
    return BILL_PREFIX + (name.replace("gpu", "cpu") if cpu else name)


def bill_value(md: Mapping[str, Any], key: str) -> Any:
    """The value of ``key`` (a ``billing/*`` key) on a scheduler-bill observation's metadata ``md``:
    ``bill/<name>``, else its CPU name (``bill/cpu_seconds``), else ``key`` itself (an observation written
    before the bill had its own prefix); None when none is present. The value is as stored (a Dagster
    ``MetadataValue`` or a plain value)."""
    for k in (billed(key), billed(key, cpu=True), key):
        if md.get(k) is not None:
            return md[k]
    return None
