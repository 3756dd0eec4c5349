"""The fleet in gpu_executor's config: ``clusters:``, a mapping of named clusters (pure: plain mappings in).

Each entry holds exactly one backend section, ``slurm:`` (:class:`~dagster_gpu.slurm.settings.SlurmSettings`,
its own transport, spool, GPU types, ``throttle``) or ``kubernetes:``
(:class:`~dagster_gpu.k8s.settings.KubernetesSettings`, its own kubeconfig context, namespace, queue), and
optionally its own prices and waiting budget::

    clusters:
      campus:
        slurm: {partition: gpu, ssh: {host: login.campus.example}}
        rates: {NVIDIA A100: 0.9, default: 0.9}
        waiting_budget_seconds: 600
      cloud:
        kubernetes: {context: gke-gpu, namespace: embed}

Today's single ``slurm:`` and ``kubernetes:`` sections stay as they are: each is a cluster named after its
backend (``slurm``, ``kubernetes``), priced from the rate card's table of that name. ``local`` is not a cluster
entry (its own section as today). Errors (:class:`FleetConfigError`) name the cluster and the key.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from dagster_gpu.billing.ratecard import RateCard, RateCardError

#: A cluster's name: it goes into metadata values, run tags and Slurm job names, so lowercase letters, digits
#: and inner dashes, at most 40 characters (a DNS label's alphabet).
NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$")
REMOTE = ("slurm", "kubernetes")
RESERVED = ("local",)


class FleetConfigError(ValueError):
    """A ``clusters:`` entry is malformed; the message names the cluster and the key."""


@dataclass(frozen=True)
class ClusterConfig:
    """One named cluster of gpu_executor's config.

    Attributes:
        name: its key under ``clusters:`` (``slurm``/``kubernetes`` for today's single sections).
        kind: ``slurm`` or ``kubernetes``: the backend section it holds.
        section: that section, as given (built by the backend's ``build_backend``).
        rates: its own USD per GPU-hour by device type, the whole table (``default`` prices any device it does
            not name); None: its ``rate_card``, else the executor's rate card's table of its kind.
        rate_card: a rate card file whose table of ``kind`` (or named ``name``) prices it (None: as ``rates``).
        waiting_budget_s: seconds a unit may wait in its queue before spilling over (None: no budget).
    """

    name: str
    kind: str
    section: Mapping[str, Any]
    rates: Mapping[str, float] | None = None
    rate_card: str | None = None
    waiting_budget_s: float | None = None


def _entry(name: Any, entry: Any) -> ClusterConfig:
    where = f"gpu_executor config clusters.{name}"
    if not isinstance(name, str) or not NAME.match(name):
        raise FleetConfigError(f"{where}: a cluster's name must be lowercase letters, digits and inner dashes "
                               f"(at most 40 characters), got {name!r}")
    if name in RESERVED:
        raise FleetConfigError(f"{where}: {name!r} is the run worker's host (its own `local:` section), not a cluster")
    if not isinstance(entry, Mapping):
        raise FleetConfigError(f"{where}: expected a mapping with a `slurm:` or `kubernetes:` section, got {entry!r}")
    kinds = [k for k in REMOTE if entry.get(k) is not None]
    if len(kinds) != 1:
        got = "both" if kinds else "neither"
        raise FleetConfigError(f"{where}: give exactly one of `slurm:` or `kubernetes:` (got {got})")
    rates = entry.get("rates")
    if rates is not None:
        try:
            rates = RateCard.from_dict({"backends": {name: dict(rates)}}, source=f"{where}.rates").table(name)
        except (RateCardError, TypeError, ValueError) as e:
            raise FleetConfigError(f"{where}.rates: {e}") from e
    budget = entry.get("waiting_budget_seconds")
    if budget is not None and not (isinstance(budget, (int, float)) and math.isfinite(budget) and budget >= 0):
        raise FleetConfigError(f"{where}.waiting_budget_seconds: expected seconds >= 0, got {budget!r}")
    return ClusterConfig(name=name, kind=kinds[0], section=dict(entry[kinds[0]]), rates=rates,
                         rate_card=entry.get("rate_card"), waiting_budget_s=None if budget is None else float(budget))


def fleet_from_config(config: Mapping[str, Any]) -> tuple[ClusterConfig, ...]:
    """The remote clusters of gpu_executor's ``config``: today's ``slurm``/``kubernetes`` sections first (named
    after their backend), then each ``clusters:`` entry in the order given. Raises FleetConfigError naming the
    cluster and key (bad name, neither or both sections, bad rates or budget, a name used twice)."""
    out = [ClusterConfig(name=k, kind=k, section=dict(config[k])) for k in REMOTE if config.get(k) is not None]
    for name, entry in (config.get("clusters") or {}).items():
        c = _entry(name, entry)
        if any(o.name == c.name for o in out):
            raise FleetConfigError(f"gpu_executor config clusters.{name}: the name is taken by the `{name}:` section; "
                                   "rename the cluster or move that section under clusters:")
        out.append(c)
    return tuple(out)


def fleet_rate_card(base: RateCard, clusters: tuple[ClusterConfig, ...]) -> RateCard:
    """The fleet's rate card: ``base``'s tables, plus one per cluster name: its ``rates`` (the whole table), else
    its ``rate_card`` file's table named after the cluster or else its kind's, else ``base``'s table of its kind.
    Raises RateCardError naming the file or the cluster."""
    tables = {k: dict(v) for k, v in base.rates.items()}
    for c in clusters:
        if c.rates is not None:
            tables[c.name] = dict(c.rates)
            continue
        card = RateCard.load(c.rate_card) if c.rate_card else base
        tables[c.name] = dict(card.rates.get(c.name) or card.table(c.kind))
    return RateCard(tables, source=base.source)
