"""The LanceDB adapter (I/O): one table per index, each partition's rows replaced in one Lance commit.

Commit semantics relied on (lancedb 0.40.0 over Lance; ``lancedb/merge.py``, ``lancedb/table.py``
``merge_insert``; lance-format/lance PR #3614 "retry merge_insert when possible"):

* :meth:`VectorIndex.replace_partition` is one ``merge_insert`` on ``(partition_key, index_row)`` with
  ``when_matched_update_all`` + ``when_not_matched_insert_all`` + ``when_not_matched_by_source_delete``
  filtered to the partition: the partition's old rows that the new output does not have are deleted, the
  rest replaced, new ones inserted, **in one transaction** (one new table version; ``merge_insert``'s
  doc: "add rows, update rows, and remove rows all in a single transaction"). A reader sees the old rows
  or the new ones; a writer killed before its manifest is committed leaves only unreferenced data files.
* Concurrent writers: Lance commits optimistically; a ``merge_insert`` that loses the race is rebased and
  retried by Lance itself up to 10 times when the conflict is retryable (after that: a "Too much write
  contention" / commit-conflict error), within a 30 s timeout after the first attempt. Two partitions'
  merges write disjoint new fragments and delete from disjoint rows, so they normally commit side by side;
  a compaction or index build running beside them can still make Lance give up, and then the whole
  merge is retried here (tenacity, randomised exponential wait) — it is idempotent for its partition.
* Each writer of one *same* partition at the same time is not serialised (lance-format/lance#4585: two
  concurrent merges inserting the same new keys may both commit): Dagster runs one materialization of a
  partition at a time, and :meth:`replace_partition` is the only writer here.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Mapping, Sequence

import pyarrow as pa
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from dagster_gpu.index.rows import (
    DEFAULT_MAX_UNINDEXED_FRACTION,
    FINGERPRINT_COLUMN,
    KEY_COLUMNS,
    PARTITION_COLUMN,
    IndexSchemaError,
    ann_action,
    column_migration,
    default_nprobes,
    ivf_partitions,
    partition_filter,
    sql_string,
)

log = logging.getLogger(__name__)

VECTOR_COLUMN = "vector"
#: Substrings of the errors Lance raises when a commit lost to a concurrent one (Rust ``Error::CommitConflict``,
#: ``RetryableCommitConflict``, ``TooMuchWriteContention``; lance ``rust/lance-core/src/error.rs``).
CONFLICT_MARKERS = ("commit conflict", "retryable commit conflict", "too much write contention",
                    "too many concurrent writers", "toomuchwritecontention", "conflicting transaction",
                    "was concurrently")
#: Below this many rows the table is searched exactly (flat); at or above it an ANN index is built.
DEFAULT_ANN_MIN_ROWS = 10_000
#: HNSW candidate list at query time: recall@10 0.989 against exact search on the fortunes (bench/index_bench.py).
DEFAULT_EF = 100
#: ANN candidates re-ranked with the stored vectors, as a multiple of k: recall@10 0.964 -> 0.990 at 100,000 rows
#: (nprobes 20 of 25 lists, +0.4 ms p50) and 0.913 -> 0.947 at 300,000 (nprobes 40 of 74) against refine 1
#: (docs/benchmarks.md, "Recall after updates").
DEFAULT_REFINE_FACTOR = 4
ANN_KINDS = ("IVF_HNSW_SQ", "IVF_PQ")
#: :meth:`VectorIndex.maintain`'s defaults: compact a table without an ANN index once it has this many fragments
#: (a load's commit adds at least one), deleting the versions older than :data:`DEFAULT_CLEANUP_OLDER_THAN` (a
#: search or load still reading such a version fails, so it is kept well above one's duration).
DEFAULT_COMPACT_MIN_FRAGMENTS = 32
DEFAULT_CLEANUP_OLDER_THAN = timedelta(minutes=10)
#: An indexed table with this many versions on storage is rebuilt at the end of a run (its compaction deletes them).
DEFAULT_REBUILD_AFTER_VERSIONS = 200


def is_commit_conflict(exc: BaseException) -> bool:
    """True for Lance's lost-commit errors (retry the operation), False for anything else."""
    text = f"{type(exc).__name__}: {exc}".lower()
    return any(m in text for m in CONFLICT_MARKERS)


@dataclass(frozen=True)
class ReplaceResult:
    """What one partition's replacement did: the table ``version`` it committed, rows ``inserted``,
    ``updated`` and ``deleted`` (Lance's own counts), ``attempts`` (Lance's inner attempts of the last try)
    and ``retries`` (whole merges repeated here after a lost commit)."""

    version: int
    inserted: int
    updated: int
    deleted: int
    attempts: int
    retries: int
    #: ``"append"`` (the table held no row of the partition: one Append commit, no merge) or ``"replace"``
    #: (one ``merge_insert`` commit)
    mode: str = "replace"
    #: an append's: the version in which the partition was found to have no row (the commit is ``version``)
    checked_version: int | None = None

    @property
    def rows(self) -> int:
        return self.inserted + self.updated


class VectorIndex:
    """A LanceDB table at ``uri`` (local directory or ``s3://bucket/prefix``) named ``table``.

    ``storage_options``: LanceDB's object-store options (``aws_endpoint``, ``aws_access_key_id``,
    ``aws_secret_access_key``, ``region``, ``allow_http``…), not fsspec's. ``retry_attempts``: whole-merge
    tries after a lost commit (each already retried by Lance). A sidecar table ``<table>__fingerprints``
    keeps each fingerprint's lineage (model, revision, prompt, options) for the query side.
    """

    def __init__(self, uri: str, table: str = "embeddings", storage_options: Mapping[str, str] | None = None,
                 *, retry_attempts: int = 8, retry_max_wait_s: float = 5.0):
        self.uri = str(uri)
        self.table_name = table
        self.storage_options = dict(storage_options or {})
        self.retry_attempts = retry_attempts
        self.retry_max_wait_s = retry_max_wait_s
        self._db = None
        self._lineage_known: set[str] = set()  # fingerprints this object saw in the sidecar (never deleted there)
        self._nprobes: tuple[int, int | None] | None = None  # (table version, its default_nprobes) last looked up

    def __repr__(self) -> str:
        return f"VectorIndex({self.uri!r}, table={self.table_name!r})"

    # -- plumbing -------------------------------------------------------------------------------------------
    def db(self):
        if self._db is None:
            import lancedb

            self._db = lancedb.connect(self.uri, storage_options=self.storage_options or None)
        return self._db

    def _retrying(self) -> Retrying:
        return Retrying(retry=retry_if_exception(is_commit_conflict), stop=stop_after_attempt(self.retry_attempts),
                        wait=wait_random_exponential(multiplier=0.05, max=self.retry_max_wait_s), reraise=True)

    def open(self, name: str | None = None):
        """The table (latest version), or None when it does not exist yet."""
        name = name or self.table_name
        try:
            return self.db().open_table(name)
        except (FileNotFoundError, ValueError) as e:  # lancedb: ValueError "Table 'x' was not found"
            if "not found" in str(e).lower() or isinstance(e, FileNotFoundError):
                return None
            raise

    def _open_or_create(self, name: str, schema: pa.Schema):
        tbl = self.open(name)
        if tbl is not None:
            return tbl
        for attempt in self._retrying():
            with attempt:
                try:
                    return self.db().create_table(name, schema=schema, exist_ok=True)
                except Exception:
                    tbl = self.open(name)  # another writer created it first
                    if tbl is None:
                        raise
                    return tbl
        raise AssertionError("unreachable")

    # -- writes ---------------------------------------------------------------------------------------------
    def record_lineage(self, fingerprint: str, lineage: Mapping[str, Any]) -> None:
        """Keep ``fingerprint``'s lineage (JSON) in the sidecar table, once per fingerprint."""
        if fingerprint in self._lineage_known:
            return
        rows = pa.table({FINGERPRINT_COLUMN: [fingerprint], "lineage": [json.dumps(dict(lineage), sort_keys=True, default=str)]})
        tbl = self._open_or_create(f"{self.table_name}__fingerprints", rows.schema)
        # a read of the small sidecar first: a fingerprint already there costs no commit (one per partition otherwise)
        if not tbl.count_rows(f"{FINGERPRINT_COLUMN} = {sql_string(fingerprint)}"):
            for attempt in self._retrying():
                with attempt:
                    tbl.merge_insert(FINGERPRINT_COLUMN).when_not_matched_insert_all().execute(rows)
        self._lineage_known.add(fingerprint)

    def replace_partition(self, partition_key: str, rows: pa.Table) -> ReplaceResult:
        """Replace every row of ``partition_key`` by ``rows`` (:func:`dagster_gpu.index.rows.index_rows`) in
        one commit; an empty ``rows`` deletes the partition's rows. Creates the table from ``rows``' schema
        when absent.

        Raises IndexSchemaError naming the partition when ``rows`` do not fit the table's columns, and the
        last error when a lost commit was retried ``retry_attempts`` times.
        """
        tbl = self._open_or_create(self.table_name, rows.schema)
        rows = self._fit(tbl, partition_key, rows)
        retries = -1
        for attempt in self._retrying():
            with attempt:
                retries += 1
                tbl.checkout_latest()
                r = (tbl.merge_insert(list(KEY_COLUMNS)).when_matched_update_all().when_not_matched_insert_all()
                     .when_not_matched_by_source_delete(partition_filter(partition_key)).execute(rows))
        if retries:
            log.info("index %s: partition %r committed after %d lost commit(s)", self.table_name, partition_key, retries)
        return ReplaceResult(version=int(r.version), inserted=int(r.num_inserted_rows), updated=int(r.num_updated_rows),
                             deleted=int(r.num_deleted_rows), attempts=int(getattr(r, "num_attempts", 1) or 1), retries=retries)

    def write_partition(self, partition_key: str, rows: pa.Table) -> ReplaceResult:
        """Load ``partition_key``'s ``rows`` in one commit, choosing the cheaper write that gives the same table:
        when the latest version holds no row of the partition (a new partition: one filtered count, served by the
        ``partition_key`` BTREE index once :meth:`ensure_ann_index` built it), ``rows`` are appended (one Append
        commit, no join); otherwise, or when ``rows`` is empty, :meth:`replace_partition`'s one ``merge_insert``.
        The check is made again on every retry after a lost commit, so a retried append never doubles rows.

        Same writer rule as :meth:`replace_partition`: one writer of a given partition at a time (Dagster runs one
        materialization of a partition at a time); two writers of one new partition at once could both append.
        Raises IndexSchemaError naming the partition when ``rows`` do not fit the table, and the last error when
        a lost commit was retried ``retry_attempts`` times.
        """
        tbl = self._open_or_create(self.table_name, rows.schema)
        rows = self._fit(tbl, partition_key, rows)
        if not rows.num_rows:
            return self.replace_partition(partition_key, rows)
        retries, res = -1, None
        for attempt in self._retrying():
            with attempt:
                retries += 1
                tbl.checkout_latest()
                checked = int(tbl.version)
                if tbl.count_rows(partition_filter(partition_key)):
                    res = None
                else:
                    res = tbl.add(rows)
        if res is None:  # the partition has rows: replace them
            r = self.replace_partition(partition_key, rows)
            return ReplaceResult(r.version, r.inserted, r.updated, r.deleted, r.attempts, r.retries + retries, "replace")
        if retries:
            log.info("index %s: partition %r appended after %d lost commit(s)", self.table_name, partition_key, retries)
        return ReplaceResult(version=int(res.version), inserted=rows.num_rows, updated=0, deleted=0, attempts=1,
                             retries=retries, mode="append", checked_version=checked)

    def _fit(self, tbl, partition_key: str, rows: pa.Table) -> pa.Table:
        """``rows`` in the table's columns, the table following a change of the outputs' columns first
        (:func:`dagster_gpu.index.rows.column_migration`): a column the rows bring and the table lacks is added to
        the table (null in its other rows; one commit), a table column the rows lack is null in them (made
        nullable first when it was not; one commit). A column whose type changed (e.g. another vector
        dimension) cannot follow: IndexSchemaError naming the partition and how to rebuild."""
        for attempt in range(3):  # another writer may migrate the same columns at once: look again
            tbl.checkout_latest()
            plan = column_migration(tbl.schema, rows.schema)
            if plan.conflicts:
                raise IndexSchemaError(
                    f"partition {partition_key!r} does not fit index table {self.table_name!r} at {self.uri}: "
                    f"{'; '.join(plan.conflicts)}; rebuild the index from the current outputs: "
                    f"dagster-gpu index -m MODULE -a INDEX_ASSET --rebuild")
            try:
                if plan.add:
                    tbl.add_columns([pa.field(f.name, f.type, nullable=True) for f in plan.add])
                    log.info("index %s: columns %s added for partition %r", self.table_name,
                             [f.name for f in plan.add], partition_key)
                if plan.make_nullable:
                    tbl.alter_columns(*({"path": n, "nullable": True} for n in plan.make_nullable))
                break
            except Exception:  # noqa: BLE001 - a concurrent migration won: the next look sees its columns
                if attempt == 2:
                    raise
        tbl.checkout_latest()
        schema = tbl.schema
        missing = [f for f in schema if f.name not in rows.column_names]
        for f in missing:
            rows = rows.append_column(f, pa.nulls(rows.num_rows, f.type))
        rows = rows.select(schema.names)
        return rows.cast(schema) if rows.schema != schema else rows

    def delete_partition(self, partition_key: str) -> int:
        """Delete the partition's rows (one commit); returns how many there were (0 when no table)."""
        tbl = self.open()
        if tbl is None:
            return 0
        before = 0
        for attempt in self._retrying():
            with attempt:
                tbl.checkout_latest()
                before = tbl.count_rows(partition_filter(partition_key))
                if before:
                    tbl.delete(partition_filter(partition_key))
        return before

    # -- reads ----------------------------------------------------------------------------------------------
    def partition_rows(self, partition_key: str) -> int:
        """Rows of ``partition_key`` in the latest version (0 when the table does not exist)."""
        tbl = self.open()
        return 0 if tbl is None else int(tbl.count_rows(partition_filter(partition_key)))

    def partition_rows_at(self, partition_key: str, r: ReplaceResult) -> int:
        """Rows of ``partition_key`` in the version ``r`` (a :meth:`write_partition` result) committed. An append
        committed right after the version in which the partition had no row (``r.version == r.checked_version + 1``:
        no commit in between; Lance numbers every commit's version one above the version it was made on) holds
        exactly the rows that commit added: the table's row count at ``r.version`` less that at the version before,
        both from the versions' manifests (fragment row counts and deletion files), no scan. Otherwise (a replace,
        or an append after another writer's commit, which might have added rows of the same partition) the rows
        matching the partition at ``r.version`` (a scan of ``partition_key``, served by its BTREE index where one
        covers the rows)."""
        tbl = self.open()
        tbl.checkout(r.version)
        if r.mode == "append" and r.checked_version is not None and r.version == r.checked_version + 1:
            after = int(tbl.count_rows())
            tbl.checkout(r.checked_version)
            return after - int(tbl.count_rows())
        return int(tbl.count_rows(partition_filter(partition_key)))

    def partition_keys(self) -> set[str]:
        """The partition keys the latest version holds rows of (a scan of the ``partition_key`` column; empty
        without a table)."""
        tbl = self.open()
        if tbl is None:
            return set()
        import pyarrow.compute as pc

        col = tbl.search().select([PARTITION_COLUMN]).limit(None).to_arrow().column(PARTITION_COLUMN)
        return set(pc.unique(col).to_pylist())

    def count_rows(self) -> int:
        tbl = self.open()
        return 0 if tbl is None else int(tbl.count_rows())

    def fingerprints(self) -> dict[str, dict]:
        """Each fingerprint the table holds rows of -> ``{"rows": n, "lineage": {...}}`` (lineage from the
        sidecar; ``{}`` when none was recorded)."""
        tbl = self.open()
        if tbl is None:
            return {}
        side = self.open(f"{self.table_name}__fingerprints")
        known: dict[str, dict] = {}
        if side is not None:
            for row in side.to_arrow().to_pylist():
                known[row[FINGERPRINT_COLUMN]] = json.loads(row["lineage"] or "{}")
        out = {}
        for fp, lineage in known.items():
            n = int(tbl.count_rows(f"{FINGERPRINT_COLUMN} = {sql_string(fp)}"))
            if n:
                out[fp] = {"rows": n, "lineage": lineage}
        accounted = sum(v["rows"] for v in out.values())
        if accounted < tbl.count_rows():  # rows whose fingerprint the sidecar lacks: list them by a scan
            col = tbl.search().select([FINGERPRINT_COLUMN]).limit(None).to_arrow().column(FINGERPRINT_COLUMN)
            import pyarrow.compute as pc

            for item in pc.value_counts(col).to_pylist():
                out.setdefault(item["values"], {"rows": int(item["counts"]), "lineage": {}})
        return out

    def search(self, vector: Sequence[float], k: int = 10, *, fingerprint: str | None = None, exact: bool = False,
               columns: Sequence[str] | None = None, nprobes: int | None = None, ef: int | None = DEFAULT_EF,
               refine_factor: int | None = DEFAULT_REFINE_FACTOR) -> pa.Table:
        """The ``k`` rows nearest ``vector`` (cosine distance, column ``_distance``), restricted to one
        ``fingerprint`` when given (prefiltered). ``exact``: flat search, the ANN index bypassed. Raises
        LookupError naming the table when it does not exist. ``nprobes``: the ANN query's IVF lists searched (None:
        :func:`dagster_gpu.index.rows.default_nprobes` of the rows the index covers, a third of its lists and at
        least 20, looked up once per table version); ``ef``: its HNSW candidates (LanceDB's default when None);
        ``refine_factor``: the ANN candidates
        re-ranked with the stored vectors, ``refine_factor`` × ``k`` of them (at least 1 × ``k``; default
        :data:`DEFAULT_REFINE_FACTOR`; ``ef`` is raised to ``k`` × ``refine_factor`` when below it, since Lance
        refuses fewer HNSW candidates than the rows it is asked for).

        ``_distance`` is always the exact cosine distance, with or without the index: the ANN candidates are
        always re-ranked, because LanceDB's indexes return their own approximations otherwise (measured on
        lancedb 0.40.0, unit vectors: IVF_HNSW_SQ's is the squared L2 distance of the quantized vectors, about
        twice the cosine distance; IVF_PQ's the PQ-coded distance), so the same row showed 0.92 through the
        index and 0.46 with ``exact``."""
        tbl = self.open()
        if tbl is None:
            raise LookupError(f"index table {self.table_name!r} does not exist at {self.uri}: materialize the index asset first")
        q = tbl.search(list(map(float, vector)), vector_column_name=VECTOR_COLUMN).distance_type("cosine").limit(int(k))
        if fingerprint is not None:
            q = q.where(f"{FINGERPRINT_COLUMN} = {sql_string(fingerprint)}", prefilter=True)
        if columns:  # with _distance: Lance warns about (and will change) a vector search's projection without it
            q = q.select(list(dict.fromkeys([*columns, "_distance"])))
        if exact:
            q = q.bypass_vector_index()
        else:
            nprobes = nprobes or self._default_nprobes(tbl)
            if nprobes:
                q = q.nprobes(int(nprobes))
            refine = max(1, int(refine_factor or 1))
            if ef:  # Lance 13.0.0 raises "ef must be greater than or equal to k" for fewer than k x refine candidates
                q = q.ef(max(int(ef), int(k) * refine))
            q = q.refine_factor(refine)
        return q.to_arrow()

    def _default_nprobes(self, tbl) -> int | None:
        """:func:`default_nprobes` for ``tbl``'s vector index (None without one: LanceDB's default applies), from its
        statistics, looked up again only when the table's version changed."""
        version = int(tbl.version)
        if self._nprobes is None or self._nprobes[0] != version:
            ix = next((i for i in tbl.list_indices() if VECTOR_COLUMN in list(i.columns)), None)
            kind = "IVF_PQ" if ix is not None and "PQ" in str(ix.index_type).upper() else "IVF_HNSW_SQ"
            n = default_nprobes(int(tbl.index_stats(ix.name).num_indexed_rows), kind) if ix is not None else None
            self._nprobes = (version, n)
        return self._nprobes[1]

    # -- ANN index ------------------------------------------------------------------------------------------
    def ann_index(self):
        """The vector column's index config, or None."""
        tbl = self.open()
        if tbl is None:
            return None
        for ix in tbl.list_indices():
            if VECTOR_COLUMN in list(ix.columns):
                return ix
        return None

    def key_index(self):
        """The ``partition_key`` scalar index's config, or None."""
        tbl = self.open()
        if tbl is None:
            return None
        return next((ix for ix in tbl.list_indices() if list(ix.columns) == [PARTITION_COLUMN]), None)

    def ensure_ann_index(self, min_rows: int = DEFAULT_ANN_MIN_ROWS, kind: str = "IVF_HNSW_SQ",
                         num_partitions: int | None = None, ef_construction: int = 300,
                         max_unindexed_fraction: float = DEFAULT_MAX_UNINDEXED_FRACTION,
                         max_unindexed_rows: int | None = None, cleanup_older_than: timedelta | None = None,
                         max_versions: int | None = None) -> str:
        """Build the table's indices when they are missing or stale: the ANN index on ``vector`` (cosine) and a
        BTREE on ``partition_key`` (so that a partition's rows are found without a scan: :meth:`write_partition`'s
        "is it new" count, the merge's filtered delete, the check's count back). The decision is
        :func:`dagster_gpu.index.rows.ann_action`'s. Returns:

        * ``"flat"`` below ``min_rows`` rows (nothing built; without an index queries scan exactly);
        * ``"created"``: no ANN index yet: the table is compacted (LanceDB's ``optimize``: fragments the loads
          appended merged, versions older than 7 days pruned), then both indices are built;
        * ``"current"``: every row is in the index;
        * ``"deferred"``: rows appended or replaced since the build (Lance's ``num_unindexed_rows``) are at most
          ``max_unindexed_fraction`` of the indexed ones: they stay out of the index and every query scans them
          exactly beside it (Lance searches a table's unindexed fragments flat and merges both results; LanceDB's
          ``OptimizeAction::Index`` doc: "the search function will scan both the indexed data and the unindexed
          data in parallel"), so they are found and recall does not fall; nothing is written;
        * ``"rebuilt"``: more rows than that are out of the index: the ANN index is dropped (so the compaction
          remaps no vector index), the table compacted, both indices built again on every row (queries running
          meanwhile scan exactly: slower, still right).

        The index is never updated in place: LanceDB 0.40.0's ``optimize`` (compaction, pruning, then Lance's
        ``optimize_indices``) merges the new rows into an ``IVF_HNSW_SQ`` index by rebuilding it, and on
        lancedb 0.40.0 (Lance 13.0.0) it folded every IVF list of :data:`ROWS_PER_LIST` rows into *one* list and
        one HNSW graph (the index file after it: one HNSW graph of 50,500 rows where the build had 13; recall@10
        0.964 -> 0.837 at 50,000 rows, the same at 1 or 13 probes; 0.742 -> 0.367 at a million rows; the update
        cost 1.2-2.8x a full build at 50,000-100,000 rows; ``tests/test_index_update.py``, docs/benchmarks.md). Lance
        sizes an ``IVF_HNSW_*`` list at 1,048,576 rows (``IndexType::target_partition_size``) and joins lists
        under 25 % of that (``MIN_PARTITION_SIZE_PERCENT``; lance ``rust/lance-index/src/lib.rs``,
        ``rust/lance/src/index/vector/builder.rs`` ``should_join``, read at v11.0.0-beta.19).

        ``num_partitions``: IVF lists (default :func:`ivf_partitions`). ``ef_construction``: the HNSW graphs'
        candidate list while building (LanceDB's default 300; 100 builds ~2.5x faster on 100,000 rows for
        recall@10 0.95, docs/benchmarks.md). ``max_unindexed_fraction``: see ``"deferred"``; 0 rebuilds after any
        change. ``max_versions``: an indexed table with at least this many versions on storage is rebuilt as well
        (None: never), since only that compaction deletes its old versions (:meth:`maintain`).
        ``cleanup_older_than``: the compaction before a build also deletes the versions older than this (and
        the data and index files only they use; None: LanceDB's default, 7 days). ``max_unindexed_rows``: a cap in
        rows as well (None: none): each query scans the rows out of the
        index, so their number sets what that costs (1,000 of them added ~1 ms of p50 at 100,000 rows, 10,000 added
        3.5-8 ms at a million). Measured at a million rows (docs/benchmarks.md): 1 % new rows -> ``"deferred"`` in
        under 0.005 s (0.0 of the 152 s build) with recall@10 0.822 -> 0.823; the rebuild 0.56 of a build.
        Retries lost commits. Raises ValueError for an unknown ``kind`` or a negative
        ``max_unindexed_fraction`` or ``max_unindexed_rows``."""
        if kind not in ANN_KINDS:
            raise ValueError(f"ANN index kind {kind!r}: expected one of {ANN_KINDS}")
        tbl = self.open()
        if tbl is None:
            return "flat"
        from lancedb.index import BTree, HnswSq, IvfPq

        had_index = self.ann_index() is not None
        for attempt in self._retrying():
            with attempt:
                tbl.checkout_latest()
                rows = int(tbl.count_rows())
                ix = self.ann_index()
                stats = tbl.index_stats(ix.name) if ix is not None else None
                action = ann_action(rows, min_rows, ix is not None, int(stats.num_indexed_rows) if stats else 0,
                                    int(stats.num_unindexed_rows) if stats else 0, max_unindexed_fraction,
                                    max_unindexed_rows)
                if action == "flat":
                    return "flat"
                if action in ("current", "defer") and max_versions is not None and self.versions() >= max_versions:
                    action = "rebuild"  # the rebuild's compaction is what deletes the old versions of an indexed table
                if action in ("create", "rebuild"):
                    if ix is not None:  # compaction would otherwise remap (and may fold) the old index's lists
                        tbl.drop_index(ix.name)
                    # compaction first: the index then covers few large fragments; versions older than
                    # cleanup_older_than (None: LanceDB's 7 days) pruned, with the files only they used
                    tbl.optimize(cleanup_older_than=cleanup_older_than)
                    lists = num_partitions or ivf_partitions(rows, kind)
                    cfg = (HnswSq(distance_type="cosine", num_partitions=lists, ef_construction=ef_construction)
                           if kind == "IVF_HNSW_SQ" else IvfPq(distance_type="cosine", num_partitions=lists))
                    tbl.create_index(VECTOR_COLUMN, config=cfg, replace=True, wait_timeout=timedelta(minutes=30))
                    tbl.create_index(PARTITION_COLUMN, config=BTree(), replace=True)
                    return "rebuilt" if had_index else "created"
                if self.key_index() is None:  # a table indexed before the key index existed
                    tbl.create_index(PARTITION_COLUMN, config=BTree(), replace=True)
                return "current" if action == "current" else "deferred"
        raise AssertionError("unreachable")

    # -- upkeep ---------------------------------------------------------------------------------------------
    def maintain(self, compact_min_fragments: int | None = DEFAULT_COMPACT_MIN_FRAGMENTS,
                 cleanup_older_than: timedelta = DEFAULT_CLEANUP_OLDER_THAN) -> str:
        """Compact the table and delete its old versions when it has no ANN index and at least
        ``compact_min_fragments`` fragments (each load's commit adds one or more; None: never): LanceDB's
        ``optimize(cleanup_older_than=…)`` (one compaction commit; the versions older than ``cleanup_older_than``
        removed with the data files only they referenced; the latest version is never removed). A table with an
        ANN index is left alone: its ``optimize`` would also merge the rows loaded since the build into the index,
        which folds an ``IVF_HNSW_SQ`` index's lists (:meth:`ensure_ann_index`), and its rebuild compacts and
        cleans up instead. Returns ``"flat"`` (no table), ``"indexed"``, ``"below"`` (fewer fragments) or
        ``"compacted"``. Retries lost commits; a reader of a version older than ``cleanup_older_than`` fails."""
        tbl = self.open()
        if tbl is None:
            return "flat"
        if self.ann_index() is not None:
            return "indexed"
        if compact_min_fragments is None or self.fragments() < int(compact_min_fragments):
            return "below"
        for attempt in self._retrying():
            with attempt:
                tbl.checkout_latest()
                tbl.optimize(cleanup_older_than=cleanup_older_than)
        return "compacted"

    def fragments(self) -> int:
        """The latest version's fragments (0 without a table)."""
        tbl = self.open()
        return 0 if tbl is None else int(_stats(tbl)["fragment_stats"]["num_fragments"])

    def versions(self) -> int:
        """Versions of the table on storage (0 without a table)."""
        tbl = self.open()
        return 0 if tbl is None else len(tbl.list_versions())

    def disk_bytes(self) -> int | None:
        """Bytes under the table's folder and its lineage sidecar's (every version's data, index, deletion and
        manifest files), by a listing of the store; None where it cannot be listed (an object store whose options
        fsspec cannot take from LanceDB's)."""
        import fsspec

        try:
            fs, root = fsspec.core.url_to_fs(self.uri, **_fsspec_options(self.storage_options))
            total = 0
            for name in (self.table_name, f"{self.table_name}__fingerprints"):
                path = f"{root.rstrip('/')}/{name}.lance"
                if fs.exists(path):
                    total += int(fs.du(path, total=True))
            return total
        except Exception as e:  # noqa: BLE001 - a figure for the metadata only
            log.info("index %s: disk size not read (%s: %s)", self.table_name, type(e).__name__, e)
            return None


def _stats(tbl) -> dict:
    """``tbl.stats()`` as a dict (lancedb 0.40.0 gives a TypedDict; other versions an object)."""
    st = tbl.stats()
    if isinstance(st, dict):
        return st
    frag = st.fragment_stats
    return {"total_bytes": st.total_bytes, "num_rows": st.num_rows,
            "fragment_stats": {"num_fragments": frag.num_fragments, "num_small_fragments": frag.num_small_fragments}}


def _fsspec_options(lance: Mapping[str, str]) -> dict[str, Any]:
    """fsspec (s3fs) options from LanceDB's object-store options: keys, secret, endpoint, region."""
    out: dict[str, Any] = {}
    if "aws_access_key_id" in lance:
        out["key"] = lance["aws_access_key_id"]
    if "aws_secret_access_key" in lance:
        out["secret"] = lance["aws_secret_access_key"]
    client = {k: v for k, v in (("endpoint_url", lance.get("aws_endpoint")),
                                 ("region_name", lance.get("region") or lance.get("aws_region"))) if v}
    if client:
        out["client_kwargs"] = client
    return out


__all__ = ["VectorIndex", "ReplaceResult", "IndexSchemaError", "is_commit_conflict", "DEFAULT_ANN_MIN_ROWS",
           "DEFAULT_MAX_UNINDEXED_FRACTION", "PARTITION_COLUMN"]
