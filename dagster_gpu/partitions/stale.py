"""Which partitions are stale, and why (pure).

A partition is **stale** when its latest materialization read another version of its file than the corpus
holds now (``source changed: old → new``), or ran under another code version than the asset's current one
(the asset's ``code_version`` is its embedding configuration's fingerprint: ``fingerprint changed (max_seq_length
256 → 128): old → new``, naming the options that changed when both sides recorded them). A partition never materialized is **missing**, not stale; one whose file is gone is **gone** (for
``backfill --prune``); one whose materialization recorded no source version (made before versions were
recorded) is stale only for a fingerprint change. A partition with a run in progress is left out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Collection, Mapping, Sequence

from dagster_gpu.embedding.fingerprint import changed_options
from dagster_gpu.partitions.source_versions import Recorded


@dataclass(frozen=True)
class StalePartition:
    """One stale partition: ``reasons`` in words; the old and new values (None where unchanged)."""

    partition_key: str
    reasons: tuple[str, ...]
    source_old: str | None = None
    source_new: str | None = None
    fingerprint_old: str | None = None
    fingerprint_new: str | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        d["reasons"] = list(self.reasons)
        return d


@dataclass(frozen=True)
class Staleness:
    """The partitions, in the definition's order: ``stale`` (with why), ``missing`` (never materialized),
    ``gone`` (registered, no file any more), ``in_progress`` (left out of the others)."""

    stale: tuple[StalePartition, ...]
    missing: tuple[str, ...]
    gone: tuple[str, ...]
    in_progress: tuple[str, ...]

    @property
    def stale_keys(self) -> list[str]:
        return [s.partition_key for s in self.stale]

    def to_json(self) -> dict:
        return {"stale": [s.to_json() for s in self.stale], "missing": list(self.missing),
                "gone": list(self.gone), "in_progress": list(self.in_progress)}


def find_stale(
    keys: Sequence[str],
    current_sources: Mapping[str, str],
    recorded: Mapping[str, Recorded],
    code_version: str | None,
    in_progress: Collection[str] = (),
    config: Mapping[str, Any] | None = None,
) -> Staleness:
    """Classify registered partition ``keys`` (the definition's order).

    Args:
        current_sources: partition key -> the source version of its file now (the corpus listing); a key
            absent here has no file.
        recorded: partition key -> what its latest materialization recorded (absent: never materialized).
        code_version: the asset's current code version (None: the asset has none, no fingerprint staleness).
        in_progress: keys with a run in progress.
        config: the asset's current embedding options (``config_fields``): a fingerprint change then names
            the options that changed, from what the materialization recorded (``Recorded.config``).
    """
    stale: list[StalePartition] = []
    missing: list[str] = []
    gone: list[str] = []
    running: list[str] = []
    busy = set(in_progress)
    for k in keys:
        if k in busy:
            running.append(k)
            continue
        if k not in current_sources:
            gone.append(k)
            continue
        rec = recorded.get(k)
        if rec is None:
            missing.append(k)
            continue
        reasons: list[str] = []
        src_old = src_new = fp_old = fp_new = None
        now = current_sources[k]
        if rec.source_version is not None and now and rec.source_version != now:
            src_old, src_new = rec.source_version, now
            reasons.append(f"source changed: {src_old} → {src_new}")
        if code_version is not None and rec.code_version != code_version:
            fp_old, fp_new = rec.code_version, code_version
            what = changed_options(rec.config, config) if rec.config is not None and config is not None else []
            if not what and config is not None:
                what = ["options not recorded by that materialization"] if rec.config is None else []
            reasons.append(f"fingerprint changed{' (' + '; '.join(what) + ')' if what else ''}: "
                           f"{fp_old or 'none recorded'} → {fp_new}")
        if reasons:
            stale.append(StalePartition(k, tuple(reasons), src_old, src_new, fp_old, fp_new))
    return Staleness(tuple(stale), tuple(missing), tuple(gone), tuple(running))
