"""What the scheduler billed a partition: its share of its work unit's bill, read back from the instance.

I/O adapter over the event log. A unit's bill (sacct, the pod's running interval, the local worker's process
interval) lands after the unit ends as one runless ``AssetObservation`` per partition the unit covered
(:func:`dagster_gpu.executor.bill_writer.write_unit_bill`), materialized or not. Each observation carries
the key that names its unit, as do the unit's materializations and its launch event (``STEP_WORKER_STARTING``
metadata): ``slurm/job_id`` (the array task), ``k8s/pod`` or ``local/unit``. A partition's billed share is
the newest observation of that partition whose unit key matches the unit that last ran it; None while the
bill has not landed (or the backend billed nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import dagster as dg

from dagster_gpu.billing.keys import COST_USD, GPU_SECONDS, SOURCE, bill_value
from dagster_gpu.instance.events import metadata_values

#: The metadata keys naming a work unit, one per backend (``UnitBill.match`` of the Slurm, Kubernetes and
#: local backends).
UNIT_KEYS = ("slurm/job_id", "k8s/pod", "local/unit")

#: Observations read per partition to find its unit's (a partition re-run many times has one per unit).
OBSERVATIONS_PER_PARTITION = 20


@dataclass(frozen=True)
class BilledShare:
    """A partition's share of its unit's scheduler bill.

    Attributes:
        cost_usd: USD. gpu_seconds: GPU-seconds (CPU-seconds for a CPU step). source: ``bill/source`` (``sacct``, ``pod-interval``,
        ``process``).
    """

    cost_usd: float
    gpu_seconds: float
    source: str


class PendingBill:
    """Mixin of a partition's row that has ``unit`` (the work unit that ran it, or None) and ``bill`` (its
    :class:`BilledShare`, None until it lands); the bill's figures are read through it."""

    unit: tuple[str, str] | None
    bill: BilledShare | None

    @property
    def billed_cost_usd(self) -> float | None:
        """USD; None until the bill lands."""
        return self.bill.cost_usd if self.bill is not None else None

    @property
    def bill_source(self) -> str | None:
        return self.bill.source if self.bill is not None else None

    @property
    def bill_pending(self) -> bool:
        """A work unit ran this partition and its scheduler bill has not landed yet."""
        return self.unit is not None and self.bill is None


#: What :func:`billed_total` adds up, in the words the HTML report and the CLI summary both print beside it.
SCHEDULERS_BILL = ("the scheduler's bill (every partition's share of the bill of the work unit that ran it, "
                   "the failed partitions' included)")


def billed_total(rows: Iterable[PendingBill]) -> str:
    """The rows' billed USD added up (6 decimals), and ``" (N pending)"`` when N rows' bills have not landed."""
    rows = list(rows)
    pending = sum(1 for r in rows if r.bill_pending)
    return f"{sum(r.billed_cost_usd or 0.0 for r in rows):.6f}" + (f" ({pending} pending)" if pending else "")


def unit_of(md: Mapping[str, Any]) -> tuple[str, str] | None:
    """The (key, value) naming the unit in materialization, launch or observation metadata; None without one."""
    v = metadata_values(md)
    for key in UNIT_KEYS:
        if v.get(key) not in (None, ""):
            return key, str(v[key])
    return None


def billed_share(instance: dg.DagsterInstance, asset_key: dg.AssetKey, partition_key: str,
                 unit: tuple[str, str] | None) -> BilledShare | None:
    """The bill observation of ``partition_key`` written for ``unit`` (see the module doc), or None."""
    if unit is None:
        return None
    recs = instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[partition_key]), limit=OBSERVATIONS_PER_PARTITION).records
    for rec in recs:  # newest first
        obs = rec.asset_observation
        md = metadata_values(obs.metadata) if obs is not None else {}
        source, cost = bill_value(md, SOURCE), bill_value(md, COST_USD)
        if source and cost is not None and unit_of(md) == unit:
            return BilledShare(float(cost), float(bill_value(md, GPU_SECONDS) or 0.0), str(source))
    return None
