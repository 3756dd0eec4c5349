"""Asset checks on an embedding partition's parquet output, evaluated with each materialization.

Five checks, all ``blocking`` at ERROR severity (a downstream asset must not read a partition that
fails any of them):

================================  ==================================================================
``output_readable``               the output file exists and its parquet footer and schema read
``rows_match_records``            records with at least one row (chunk) = records read − records skipped
``vector_dim``                    the ``vector`` column's fixed size = the output dimension (truncate_dim if set)
``vectors_finite``                no NaN or ±inf component in any vector
``hash_per_record_id``            each (``doc_id``, ``chunk_index``) appears once, with a 64-hex-digit
                                  ``text_sha256`` (= sha256 of the row's ``text`` when the file keeps it)
================================  ==================================================================

Dagster 1.13.27 facts this module relies on (read in ``dagster/_core``, checked with a real instance):

- ``AssetCheckResult`` has **no** ``partition`` argument. In a step with one partition key the
  evaluation's partition is that key, but only when the ``AssetCheckSpec`` has ``partitions_def``
  (``AssetCheckResult.to_asset_check_evaluation``); without it the evaluation is unpartitioned.
  ``AssetCheckSpec(partitions_def=...)`` is a *preview* feature (it warns; silenced here).
- In a ranged run (no single partition key) an ``AssetCheckResult`` is stored with partition None, so
  per-partition results must be ``AssetCheckEvaluation(partition=k, ...)`` yielded by the body; the
  planned rows (one per partition of the run) are then updated per partition. Each check of an
  ``@asset`` is also a *required* op output, so a ranged body yields one ``Output(None)`` per check
  once (:func:`check_outputs`).
- A failed blocking ERROR evaluation fails the step (``DagsterAssetCheckFailedError``) after the body
  ends; the materialization is already recorded by then.
- The UI's per-partition check status (``event_log_storage.get_asset_check_state``) counts an evaluation
  only when it targets the partition's latest materialization (``AssetCheckPartitionInfo.is_current``):
  an ``AssetCheckEvaluation`` without ``target_materialization_data`` on a materialized partition is
  dropped from every status. ``AssetCheckResult`` fills it from the instance; a body that yields
  evaluations must do the same (:func:`materialization_target`).
- A partition that fails keeps its ``PLANNED`` rows (one per check, written when the run starts): the UI
  resolves them to "in progress" until the run ends, then "execution failed" (run FAILURE) or "skipped",
  without the reason. The work unit therefore records a failed evaluation of each check for a failed
  partition (:func:`partition_failed_evaluations`), carrying the partition's failure reason, as soon as it fails.

:func:`verify_output` does the reading (pyarrow over fsspec, one record batch at a time); the rest is pure.
"""

from __future__ import annotations

import hashlib
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import dagster as dg
import numpy as np
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluationTargetMaterializationData

from dagster_gpu.embedding.writer import CHUNK_COLUMN, DOC_ID_COLUMN, HASH_COLUMN, ID_COLUMN, TEXT_COLUMN, VECTOR_COLUMN
from dagster_gpu.instance.events import metadata_value

OUTPUT_READABLE = "output_readable"
ROWS_MATCH_RECORDS = "rows_match_records"
VECTOR_DIM = "vector_dim"
VECTORS_FINITE = "vectors_finite"
HASH_PER_RECORD_ID = "hash_per_record_id"

#: Check name -> description shown in the UI's Checks tab.
CHECKS: dict[str, str] = {
    OUTPUT_READABLE: "The partition's parquet output exists and its footer and schema read.",
    ROWS_MATCH_RECORDS: "Records with at least one row (chunk) in the output = records read − records skipped.",
    VECTOR_DIM: "The vector column's dimension equals the output dimension (the model's, or truncate_dim).",
    VECTORS_FINITE: "No vector has a NaN or infinite component.",
    HASH_PER_RECORD_ID: "Each (doc_id, chunk_index) appears once, with a 64-hex-digit text_sha256 (of the row's text when kept).",
}

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class CheckOutcome:
    """One check's verdict on one partition: ``name`` (a key of :data:`CHECKS`), ``passed``, a sentence, figures."""

    name: str
    passed: bool
    description: str
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OutputFacts:
    """What reading the output found (None = could not be read; ``error`` says why).

    Attributes:
        rows: rows in the file (chunks). records: distinct (doc_id, record_id) pairs, i.e. records (a file group's
            files each number their records from 0; None = as many as rows).
        dim: the vector column's fixed size (None if not a fixed-size list).
        nonfinite_vectors: vectors with at least one NaN/inf component.
        duplicate_ids: rows whose (doc_id, chunk_index) an earlier row has (``record_id`` and chunk 0 in a file
            without those columns). bad_hashes: hashes not 64 hex digits, or not the sha256 of the row's text.
        first_duplicate_id: an example duplicated doc id; first_nonfinite_id: an example record id; None if none.
    """

    rows: int | None = None
    records: int | None = None
    dim: int | None = None
    nonfinite_vectors: int = 0
    first_nonfinite_id: int | None = None
    duplicate_ids: int = 0
    first_duplicate_id: int | str | None = None
    bad_hashes: int = 0
    error: str | None = None


def check_specs(asset_key: dg.AssetKey, partitions_def: dg.PartitionsDefinition | None) -> list[dg.AssetCheckSpec]:
    """The five blocking ``AssetCheckSpec`` of ``asset_key`` (for ``@asset(check_specs=...)``), partitioned like it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)  # partitions_def on AssetCheckSpec is preview in 1.13
        return [
            dg.AssetCheckSpec(name, asset=asset_key, description=desc, blocking=True, partitions_def=partitions_def)
            for name, desc in CHECKS.items()
        ]


def read_facts(output_uri: str, storage_options: Mapping[str, Any] | None = None, batch_rows: int = 65536) -> OutputFacts:
    """Read ``output_uri`` (local path or fsspec URL) batch by batch; never raises for a bad file.

    Memory: one record batch of ``batch_rows`` rows plus each row's (doc_id, chunk_index) and record id.
    """
    import fsspec
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        fs, path = fsspec.core.url_to_fs(output_uri, **dict(storage_options or {}))
        with fs.open(path, "rb") as f:
            pf = pq.ParquetFile(f)
            schema = pf.schema_arrow
            missing = [c for c in (ID_COLUMN, HASH_COLUMN, VECTOR_COLUMN) if c not in schema.names]
            if missing:
                return OutputFacts(rows=pf.metadata.num_rows, error=f"{output_uri}: columns {missing} missing")
            vtype = schema.field(VECTOR_COLUMN).type
            dim = vtype.list_size if isinstance(vtype, pa.FixedSizeListType) else None
            has_doc, has_chunk, has_text = (c in schema.names for c in (DOC_ID_COLUMN, CHUNK_COLUMN, TEXT_COLUMN))
            cols = [ID_COLUMN, HASH_COLUMN, VECTOR_COLUMN] + [c for c, has in (
                (DOC_ID_COLUMN, has_doc), (CHUNK_COLUMN, has_chunk), (TEXT_COLUMN, has_text)) if has]
            keys: list[pa.Table] = []
            nonfinite = bad_hashes = 0
            first_nonfinite = None
            for batch in pf.iter_batches(batch_size=batch_rows, columns=cols):
                bid = batch.column(ID_COLUMN).to_numpy(zero_copy_only=False)
                doc = batch.column(DOC_ID_COLUMN) if has_doc else batch.column(ID_COLUMN)
                chunk = batch.column(CHUNK_COLUMN) if has_chunk else pa.array(np.zeros(len(bid), np.int32))
                keys.append(pa.table({"d": doc, "c": chunk, "r": pa.array(bid)}))
                hashes = batch.column(HASH_COLUMN)
                ok = pc.match_substring_regex(hashes, _HEX64.pattern)
                bad_hashes += len(hashes) - pc.sum(pc.fill_null(ok, False)).as_py() if len(hashes) else 0
                if has_text:
                    bad_hashes += sum(
                        1 for t, h in zip(batch.column(TEXT_COLUMN).to_pylist(), hashes.to_pylist())
                        if t is not None and h is not None and _HEX64.match(h)
                        and hashlib.sha256(t.encode("utf-8")).hexdigest() != h)
                vec = batch.column(VECTOR_COLUMN)
                if dim and len(vec):
                    flat = vec.flatten().to_numpy(zero_copy_only=False).reshape(len(vec), dim)
                    bad = ~np.isfinite(flat).all(axis=1)
                    n = int(bad.sum())
                    if n and first_nonfinite is None:
                        first_nonfinite = int(bid[np.argmax(bad)])
                    nonfinite += n
            rows = pf.metadata.num_rows
            duplicates, first_dup, records = 0, None, 0
            if keys:
                kt = pa.concat_tables(keys)
                # a record is a (doc_id, record_id): a file group's files each number their records from 0
                records = kt.group_by(["d", "r"]).aggregate([]).num_rows
                counts = kt.group_by(["d", "c"]).aggregate([([], "count_all")])
                dup = counts.filter(pc.greater(counts.column("count_all"), 1))
                duplicates = int(pc.sum(dup.column("count_all")).as_py() or 0) - dup.num_rows
                if dup.num_rows:
                    first_dup = dup.column("d")[0].as_py()
            return OutputFacts(
                rows=rows,
                records=int(records),
                dim=dim,
                nonfinite_vectors=nonfinite,
                first_nonfinite_id=first_nonfinite,
                duplicate_ids=duplicates,
                first_duplicate_id=first_dup,
                bad_hashes=int(bad_hashes),
            )
    except FileNotFoundError as e:
        return OutputFacts(error=f"{output_uri}: not found ({e})")
    except (OSError, ValueError, pa.ArrowException) as e:
        return OutputFacts(error=f"{output_uri}: unreadable ({type(e).__name__}: {e})")


def evaluate(facts: OutputFacts, *, expected_dim: int, records_read: int, skipped_empty_rows: int) -> list[CheckOutcome]:
    """The five outcomes, in :data:`CHECKS` order, from what was read and the step's own figures. Pure.

    When the file could not be read every other check fails too, saying so.
    """
    if facts.error is not None:
        unread = f"not checked: the output could not be read ({facts.error})"
        return [CheckOutcome(OUTPUT_READABLE, False, facts.error)] + [
            CheckOutcome(n, False, unread) for n in CHECKS if n != OUTPUT_READABLE
        ]
    expected_rows = records_read - skipped_empty_rows
    rows = int(facts.rows or 0)
    records = rows if facts.records is None else int(facts.records)
    chunks = f"{records} records in {rows} rows" if records != rows else f"{rows} rows"
    return [
        CheckOutcome(OUTPUT_READABLE, True, f"{rows} rows readable", {"rows": rows}),
        CheckOutcome(
            ROWS_MATCH_RECORDS, records == expected_rows,
            f"{chunks}; {records_read} records read − {skipped_empty_rows} skipped = {expected_rows}",
            {"rows": rows, "records": records, "records_read": records_read, "skipped_empty_rows": skipped_empty_rows,
             "expected_rows": expected_rows},
        ),
        CheckOutcome(
            VECTOR_DIM, facts.dim == expected_dim,
            f"vector dimension {facts.dim if facts.dim is not None else 'not a fixed-size list'}; expected {expected_dim}",
            {"expected_dim": expected_dim, **({"dim": facts.dim} if facts.dim is not None else {})},
        ),
        CheckOutcome(
            VECTORS_FINITE, facts.nonfinite_vectors == 0,
            "every vector is finite" if facts.nonfinite_vectors == 0 else
            f"{facts.nonfinite_vectors} vector(s) with NaN/inf, first at record_id {facts.first_nonfinite_id}",
            {"nonfinite_vectors": facts.nonfinite_vectors},
        ),
        CheckOutcome(
            HASH_PER_RECORD_ID, facts.duplicate_ids == 0 and facts.bad_hashes == 0,
            "one hash per (doc_id, chunk_index)" if facts.duplicate_ids == 0 and facts.bad_hashes == 0 else
            f"{facts.duplicate_ids} duplicate (doc_id, chunk_index) row(s)"
            + (f" (first: {facts.first_duplicate_id})" if facts.first_duplicate_id is not None else "")
            + f", {facts.bad_hashes} malformed text_sha256",
            {"duplicate_ids": facts.duplicate_ids, "bad_hashes": facts.bad_hashes},
        ),
    ]


def verify_output(
    output_uri: str,
    *,
    expected_dim: int,
    records_read: int,
    skipped_empty_rows: int,
    storage_options: Mapping[str, Any] | None = None,
) -> list[CheckOutcome]:
    """Read ``output_uri`` and evaluate the five checks (see :func:`evaluate`)."""
    return evaluate(
        read_facts(output_uri, storage_options),
        expected_dim=expected_dim, records_read=records_read, skipped_empty_rows=skipped_empty_rows,
    )


def check_evaluations(
    asset_key: dg.AssetKey,
    partition_key: str,
    outcomes: Sequence[CheckOutcome],
    target: AssetCheckEvaluationTargetMaterializationData | None = None,
) -> list[dg.AssetCheckEvaluation]:
    """Per-partition evaluations for a ranged step (one body, many partition keys): yield them after the
    partition's ``AssetMaterialization``, and :func:`check_outputs` once at the end of the body.

    ``target``: the materialization checked (:func:`materialization_target`, read after the materialization
    was yielded); without it the UI's per-partition check status leaves the partition out."""
    return [
        dg.AssetCheckEvaluation(
            asset_key=asset_key, check_name=o.name, passed=o.passed, description=o.description,
            metadata=dict(o.metadata), partition=partition_key, blocking=True,
            severity=dg.AssetCheckSeverity.ERROR, target_materialization_data=target,
        )
        for o in outcomes
    ]


#: Metadata key of a failed partition's evaluations: why the partition failed (text).
PARTITION_FAILURE = "dagster_gpu/partition_failure"


#: Metadata key of a failed partition's evaluations: the source version of the file the failed attempt read
#: (text; absent when the attempt failed before reading it). The corpus sensor requests a failed partition again
#: only when its file's version differs from this one.
FAILED_SOURCE_VERSION = "corpus/source_version"


def failed_partition_outcomes(reason: str, source_version: str | None = None) -> list[CheckOutcome]:
    """The five checks failed, unevaluated, for a partition that failed before its output could be checked
    (``reason``: the partition's failure, as the step's ``dagster.Failure`` lists it; ``source_version``: the
    version of the file the attempt read, None when it read none). Pure."""
    md: dict[str, Any] = {PARTITION_FAILURE: reason}
    if source_version:
        md[FAILED_SOURCE_VERSION] = source_version
    return [CheckOutcome(name, False, f"not evaluated: the partition failed ({reason})", dict(md)) for name in CHECKS]


def partition_failed_evaluations(
    asset_key: dg.AssetKey,
    partition_key: str,
    reason: str,
    target: AssetCheckEvaluationTargetMaterializationData | None = None,
    source_version: str | None = None,
) -> list[dg.AssetCheckEvaluation]:
    """A failed evaluation of each check of a partition that failed, so the Checks tab shows the checks failed,
    with ``reason``, instead of "in progress" until the run ends. ``target``: the partition's latest
    materialization, if it has one from an earlier run (:func:`materialization_target`); ``source_version``:
    the version of the file the attempt read (:data:`FAILED_SOURCE_VERSION`), None when it read none."""
    return check_evaluations(asset_key, partition_key, failed_partition_outcomes(reason, source_version), target)


def partition_failure_observation(asset_key: dg.AssetKey, partition_key: str, reason: str,
                                  source_version: str | None = None) -> dg.AssetObservation:
    """An observation of a partition that failed, with ``reason`` under :data:`PARTITION_FAILURE` (and the
    file's version the attempt read under :data:`FAILED_SOURCE_VERSION`, when it read one): the partition's
    page in the Dagster UI lists the latest observation's metadata, and open-source event-log storage cannot
    store an asset-failure event (``ASSET_FAILED_TO_MATERIALIZE`` needs ``can_store_asset_failure_events``)."""
    md: dict[str, Any] = {PARTITION_FAILURE: reason}
    if source_version:
        md[FAILED_SOURCE_VERSION] = source_version
    return dg.AssetObservation(asset_key=asset_key, partition=partition_key, metadata=md)


def materialization_target(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey, partition_key: str
) -> AssetCheckEvaluationTargetMaterializationData | None:
    """The partition's latest materialization as an evaluation's target (what ``AssetCheckResult`` records for
    a partitioned step), or None when the partition was never materialized. One event-log query."""
    recs = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[partition_key]), limit=1
    ).records
    if not recs:
        return None
    rec = recs[0]
    return AssetCheckEvaluationTargetMaterializationData(
        storage_id=rec.storage_id, run_id=rec.event_log_entry.run_id, timestamp=rec.timestamp
    )


def check_outputs(asset_key: dg.AssetKey) -> list[dg.Output]:
    """One ``Output(None)`` per check: an ``@asset``'s checks are required op outputs (named by
    ``AssetCheckSpec.get_python_identifier``); a ranged body that yields evaluations must yield these once."""
    return [dg.Output(None, output_name=s.get_python_identifier()) for s in check_specs(asset_key, None)]


RECHECK = "output_recheck"


def recheck_outcomes(md: Mapping[str, Any], storage_options: Mapping[str, Any] | None = None) -> list[CheckOutcome]:
    """Verify again the output a materialization's metadata names (``embedding/output_uri``), against its
    own ``embedding/dim`` (the output dimension), ``embedding/records_read`` and ``embedding/skipped_empty_rows``.

    Raises KeyError naming the missing key when the metadata is not an embedding materialization's.
    """
    def val(key: str) -> Any:
        if key not in md:
            raise KeyError(f"materialization metadata has no {key!r}")
        return metadata_value(md[key])

    return verify_output(
        str(val("embedding/output_uri")), expected_dim=int(val("embedding/dim")),
        records_read=int(val("embedding/records_read")), skipped_empty_rows=int(val("embedding/skipped_empty_rows")),
        storage_options=storage_options,
    )


def recheck_asset_check(
    asset: dg.AssetsDefinition, storage_options: Mapping[str, Any] | None = None
) -> dg.AssetChecksDefinition:
    """An on-demand check ``output_recheck`` of ``asset`` (non-blocking, partitioned like it): verifies the
    latest materialization's output file of the partition again, without embedding anything — for
    outputs changed or damaged after they were written; its result names every check that failed.
    ``storage_options``: fsspec options of the *output* store (the asset's ``output_storage_options``,
    not its corpus's).

    Register it on purpose, apart from the embedding job: a job selecting the asset (``asset_job``,
    ``define_asset_job(selection=[asset])``) also selects every check of the asset, so the recheck would
    run as a second step (a second worker) after each partition."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)

        @dg.asset_check(
            asset=asset, name=RECHECK, partitions_def=asset.partitions_def, blocking=False,
            description="Verify the latest output file of the partition again: " + " ".join(CHECKS.values()),
        )
        def _recheck(context) -> dg.AssetCheckResult:
            pk = context.partition_key
            recs = context.instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=asset.key, asset_partitions=[pk]), limit=1
            ).records
            if not recs:
                return dg.AssetCheckResult(passed=False, description=f"partition {pk!r} has no materialization to check")
            try:
                outcomes = recheck_outcomes(recs[0].asset_materialization.metadata, storage_options)
            except KeyError as e:
                return dg.AssetCheckResult(passed=False, description=f"partition {pk!r}: {e.args[0]}")
            failed = [o for o in outcomes if not o.passed]
            return dg.AssetCheckResult(
                passed=not failed,
                description="; ".join(f"{o.name}: {o.description}" for o in failed) or "all five checks pass",
                metadata={o.name: ("pass" if o.passed else "FAIL: ") + ("" if o.passed else o.description) for o in outcomes},
            )

    return _recheck
