"""Which partitions are stale, and why (pure).

A partition is **stale** when its latest materialization read another version of its file than the corpus
holds now (``source changed: old → new``), or ran under another code version than the asset's current one
(the asset's ``code_version`` is its embedding configuration's fingerprint: ``fingerprint changed (max_seq_length
256 → 128): old → new``, naming the options that changed when both sides recorded them), or was written with
other output columns (id, carried, text: ``columns …``; for a materialization that recorded no columns, the
columns its output file shows). A partition never materialized is **missing** (or **failed**, when its latest
run failed), not stale; one whose file is gone is **gone** (for ``backfill --prune``); one whose materialization
recorded no source version (made before versions were recorded) is stale only for a fingerprint change. A
partition with a run in progress is left out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Collection, Mapping, Sequence

from dagster_gpu.embedding.fingerprint import SCHEMA_COLUMN_FIELDS, changed_options
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
    """The partitions, in the definition's order: ``stale`` (with why), ``missing`` (never materialized, no
    failed run), ``gone`` (registered, no file any more), ``in_progress`` (left out of the others), ``failed``
    (never materialized, latest run failed; ``failed_why``: partition key -> the reason where one is known)."""

    stale: tuple[StalePartition, ...]
    missing: tuple[str, ...]
    gone: tuple[str, ...]
    in_progress: tuple[str, ...]
    failed: tuple[str, ...] = ()
    failed_why: Mapping[str, str] = field(default_factory=dict)

    @property
    def stale_keys(self) -> list[str]:
        return [s.partition_key for s in self.stale]

    def to_json(self) -> dict:
        return {"stale": [s.to_json() for s in self.stale], "missing": list(self.missing),
                "gone": list(self.gone), "in_progress": list(self.in_progress), "failed": list(self.failed),
                "failed_why": dict(self.failed_why)}


def find_stale(
    keys: Sequence[str],
    current_sources: Mapping[str, str],
    recorded: Mapping[str, Recorded],
    code_version: str | None,
    in_progress: Collection[str] = (),
    config: Mapping[str, Any] | None = None,
    file_columns: Mapping[str, Mapping[str, Any]] | None = None,
    failed: Collection[str] = (),
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
        file_columns: partition key -> the columns its output file shows
            (:func:`dagster_gpu.embedding.fingerprint.columns_of_schema`), for the materializations whose
            ``config`` recorded no ``columns`` (absent: unknown, not compared). Such a partition is stale when
            those columns differ from ``config["columns"]``, and is not stale for the columns alone otherwise.
        failed: keys never materialized whose latest run failed (reported apart from ``missing``).
    """
    stale: list[StalePartition] = []
    missing: list[str] = []
    gone: list[str] = []
    running: list[str] = []
    busy, failing, failures = set(in_progress), set(failed), []
    for k in keys:
        if k in busy:
            running.append(k)
            continue
        if k not in current_sources:
            gone.append(k)
            continue
        rec = recorded.get(k)
        if rec is None:
            (failures if k in failing else missing).append(k)
            continue
        reasons: list[str] = []
        src_old = src_new = fp_old = fp_new = None
        now = current_sources[k]
        if rec.source_version is not None and now and rec.source_version != now:
            src_old, src_new = rec.source_version, now
            reasons.append(f"source changed: {src_old} → {src_new}")
        legacy = _legacy_columns_change(rec, config, (file_columns or {}).get(k))
        if code_version is not None and (rec.code_version != code_version or legacy):
            what = changed_options(rec.config, config) if rec.config is not None and config is not None else []
            if legacy is not None:  # no columns recorded: the file's own columns stand for them
                what = [w for w in what if not w.startswith("columns ")] + legacy
            if not what and config is not None:
                what = ["options not recorded by that materialization"] if rec.config is None else []
            if rec.code_version == code_version:  # columns the code version did not hash yet
                reasons.append(f"output columns changed ({'; '.join(what)})")
            elif what or rec.config is None or config is None or legacy is None:
                fp_old, fp_new = rec.code_version, code_version
                reasons.append(f"fingerprint changed{' (' + '; '.join(what) + ')' if what else ''}: "
                               f"{fp_old or 'none recorded'} → {fp_new}")
        if reasons:
            stale.append(StalePartition(k, tuple(reasons), src_old, src_new, fp_old, fp_new))
    return Staleness(tuple(stale), tuple(missing), tuple(gone), tuple(running), tuple(failures))


def _legacy_columns_change(rec: Recorded, config: Mapping[str, Any] | None,
                           shown: Mapping[str, Any] | None) -> list[str] | None:
    """For a materialization that recorded its options but no ``columns`` while the asset's options have them:
    ``["columns <file's> → <asset's>"]`` when the columns its output file ``shows`` differ from the asset's (only
    :data:`SCHEMA_COLUMN_FIELDS`: what a file can show), ``[]`` when they are the same; None when this does not
    apply (columns recorded, none to compare with, or the file's columns not known)."""
    if rec.config is None or "columns" in rec.config or config is None or "columns" not in config or shown is None:
        return None
    want = {f: config["columns"].get(f) for f in SCHEMA_COLUMN_FIELDS}
    have = {f: shown.get(f) for f in SCHEMA_COLUMN_FIELDS}
    return [] if want == have else changed_options({"columns": have}, {"columns": want})
