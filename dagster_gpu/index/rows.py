"""The index's rows and filters (pure: pyarrow only, no LanceDB).

An index row is an output row (:mod:`dagster_gpu.embedding.writer`: ``doc_id``, ``record_id``, chunk fields,
``text_sha256``, carried columns, optional ``text``, ``vector``) plus three columns:

===================  =======  ================================================================
``partition_key``    string   the Dagster partition key of the output the row came from
``index_row``        int64    the row's ordinal in that output (0, 1, …): with ``partition_key``
                              the table's unique key (``doc_id`` may repeat: a corpus id column
                              is not checked for uniqueness, and chunks share their record's id)
``fingerprint``      string   the output's embedding fingerprint (``dagster_gpu.fingerprint``
                              of its parquet metadata; ``""`` when the file has none)
===================  =======  ================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa

PARTITION_COLUMN = "partition_key"
ROW_COLUMN = "index_row"
FINGERPRINT_COLUMN = "fingerprint"
#: The table's unique key: the merge of one partition joins on it.
KEY_COLUMNS = (PARTITION_COLUMN, ROW_COLUMN)
INDEX_COLUMNS = frozenset({PARTITION_COLUMN, ROW_COLUMN, FINGERPRINT_COLUMN})


class IndexSchemaError(ValueError):
    """An output cannot go into the index as is (a reserved column name, no vector, a schema unlike the table's)."""


def sql_string(value: str) -> str:
    """``value`` as a SQL string literal (single quotes, a quote doubled): safe for any partition key or
    fingerprint in a LanceDB (DataFusion SQL) filter."""
    return "'" + str(value).replace("'", "''") + "'"


def partition_filter(partition_key: str) -> str:
    """The filter selecting one partition's rows: ``partition_key = '<key>'``."""
    return f"{PARTITION_COLUMN} = {sql_string(partition_key)}"


def index_rows(output: pa.Table, partition_key: str, fingerprint: str, *, source: str = "") -> pa.Table:
    """``output`` (one partition's parquet rows) with ``partition_key``, ``index_row`` and ``fingerprint``
    added first; the schema's key-value metadata is dropped (it belongs to the file, not the rows).

    Raises IndexSchemaError naming ``source`` (the output's URI) when it has no ``vector`` column
    (fixed_size_list) or already has a column named like one of the index's own.
    """
    where = source or f"partition {partition_key!r}"
    if "vector" not in output.column_names or not pa.types.is_fixed_size_list(output.schema.field("vector").type):
        raise IndexSchemaError(f"{where}: no fixed_size_list column 'vector' (columns: {output.column_names})")
    clash = sorted(INDEX_COLUMNS & set(output.column_names))
    if clash:
        raise IndexSchemaError(f"{where}: columns {clash} are the index's own; rename them in the corpus "
                               f"(TextFormat.carry_columns) before indexing")
    n = output.num_rows
    # pa.repeat: one scalar broadcast in Arrow, no Python object per row
    cols = [pa.repeat(pa.scalar(partition_key, pa.string()), n), pa.array(np.arange(n, dtype=np.int64)),
            pa.repeat(pa.scalar(fingerprint, pa.string()), n)]
    fields = [pa.field(PARTITION_COLUMN, pa.string(), nullable=False), pa.field(ROW_COLUMN, pa.int64(), nullable=False),
              pa.field(FINGERPRINT_COLUMN, pa.string(), nullable=False)]
    out = output.replace_schema_metadata(None)
    return pa.table(cols + list(out.columns), schema=pa.schema(fields + list(out.schema)))


def schema_difference(table_schema: pa.Schema, rows_schema: pa.Schema) -> list[str]:
    """What differs between the index table's columns and a partition's rows (names and types; nullability
    ignored), one phrase each; ``[]`` when the rows fit the table."""
    have = {f.name: f.type for f in table_schema}
    new = {f.name: f.type for f in rows_schema}
    out = [f"column {n!r} missing" for n in have if n not in new]
    out += [f"extra column {n!r}" for n in new if n not in have]
    out += [f"column {n!r} is {new[n]}, the table's is {have[n]}" for n in new if n in have and new[n] != have[n]]
    return out


@dataclass(frozen=True)
class ColumnMigration:
    """How an index table follows a partition's rows (:func:`column_migration`): fields to ``add`` to the table
    (null in its other rows), table columns to make nullable (``make_nullable``: the rows lack them, so they are
    null there), and ``conflicts`` (phrases: a column both have with another type, or a key column the rows lack)
    that no migration can bridge."""

    add: tuple[pa.Field, ...]
    make_nullable: tuple[str, ...]
    conflicts: tuple[str, ...]


def column_migration(table_schema: pa.Schema, rows_schema: pa.Schema) -> ColumnMigration:
    """What the table needs to take rows of ``rows_schema`` (pure): every column of either side is kept (a column
    the outputs stopped carrying stays, null in the new rows, until the index is rebuilt); a type change, or rows
    without the index's own columns or ``vector``, is a conflict."""
    have = {f.name: f for f in table_schema}
    new = {f.name: f for f in rows_schema}
    fixed = set(INDEX_COLUMNS) | {"vector"}
    conflicts = [f"column {n!r} missing" for n in have if n not in new and n in fixed]
    conflicts += [f"column {n!r} is {new[n].type}, the table's is {have[n].type}"
                  for n in new if n in have and new[n].type != have[n].type]
    lacking = [n for n in have if n not in new and n not in fixed]
    return ColumnMigration(add=tuple(f for n, f in new.items() if n not in have),
                           make_nullable=tuple(n for n in lacking if not have[n].nullable),
                           conflicts=tuple(conflicts))


#: Rows per IVF list of an ``IVF_HNSW_SQ`` index (each list holds its own HNSW graph) and of an ``IVF_PQ`` one.
ROWS_PER_LIST = {"IVF_HNSW_SQ": 4096, "IVF_PQ": 256}


def ivf_partitions(rows: int, kind: str = "IVF_HNSW_SQ") -> int:
    """IVF lists for ``rows`` vectors: ``rows / ROWS_PER_LIST[kind]`` rounded up, at least 1. An HNSW graph per
    list needs no fine partitioning: on the 15,217 fortunes (``bench/index_bench.py``) 123 lists (``sqrt(rows)``)
    gave recall@10 0.86 at LanceDB's default nprobes (20) where 4 lists give the figure in docs/benchmarks.md;
    IVF_PQ lists are scanned in full, so they are kept small (``sqrt(rows)``-like for 10^4–10^5 rows)."""
    return max(1, math.ceil(max(rows, 0) / ROWS_PER_LIST[kind]))


#: The share of an index's IVF lists a query searches when it names none, and the fewest it searches (LanceDB's own
#: default, 20, whatever the list count). At a million rows (247 lists of :data:`ROWS_PER_LIST` rows) 20 lists gave
#: recall@10 0.873, 40 gave 0.922, 60 gave 0.943-0.946 and 80 gave 0.955 at 15.4 ms p50 on a 2-core host
#: (refine_factor 4, ef 100; a larger ef changed nothing: the misses are in the lists not searched;
#: docs/benchmarks.md, "A million rows"); up to 60 lists (~240,000
#: rows) the floor of 20 applies, as before.
PROBED_SHARE = 1 / 3
MIN_NPROBES = 20


def default_nprobes(indexed_rows: int, kind: str = "IVF_HNSW_SQ") -> int:
    """IVF lists a query searches when it names none: :data:`PROBED_SHARE` of :func:`ivf_partitions` for
    ``indexed_rows`` (the rows the index covers), rounded up, at least :data:`MIN_NPROBES`."""
    return max(MIN_NPROBES, math.ceil(ivf_partitions(indexed_rows, kind) * PROBED_SHARE))


#: Rows the ANN index does not cover (appended or replaced since it was built), as a fraction of the rows it
#: covers, above which :func:`ann_action` rebuilds it; at or below, Lance searches them exactly beside it.
DEFAULT_MAX_UNINDEXED_FRACTION = 0.1


def ann_action(rows: int, min_rows: int, has_index: bool, indexed: int, unindexed: int,
               max_unindexed_fraction: float = DEFAULT_MAX_UNINDEXED_FRACTION,
               max_unindexed_rows: int | None = None) -> str:
    """What the ANN index of a table of ``rows`` rows needs (pure; ``indexed``/``unindexed``: Lance's index
    statistics, rows covered by the index and not):

    * ``"flat"`` below ``min_rows`` rows (nothing built or changed; without an index queries scan exactly);
    * ``"create"`` with no index; ``"current"`` when every row is indexed;
    * ``"defer"`` while ``unindexed <= max_unindexed_fraction * indexed`` and, when given,
      ``unindexed <= max_unindexed_rows``: the rows stay out of the index and are searched exactly (Lance's flat
      search of unindexed fragments beside the index: every query pays for scanning them, by their number, so a
      cap in rows bounds that cost);
    * ``"rebuild"`` above: train the index again on every row.

    Never an incremental merge: LanceDB 0.40.0's ``optimize`` folds an ``IVF_HNSW_SQ`` index's IVF lists of
    :data:`ROWS_PER_LIST` rows into one list and one HNSW graph (docs/benchmarks.md, "Recall after
    updates"). Raises ValueError for a negative ``max_unindexed_fraction`` or ``max_unindexed_rows``."""
    if max_unindexed_fraction < 0:
        raise ValueError(f"max_unindexed_fraction must be >= 0, got {max_unindexed_fraction}")
    if max_unindexed_rows is not None and max_unindexed_rows < 0:
        raise ValueError(f"max_unindexed_rows must be >= 0 or None, got {max_unindexed_rows}")
    if rows < min_rows:
        return "flat"
    if not has_index:
        return "create"
    if unindexed <= 0:
        return "current"
    if max_unindexed_rows is not None and unindexed > max_unindexed_rows:
        return "rebuild"
    return "defer" if unindexed <= max_unindexed_fraction * indexed else "rebuild"


def recall_at_k(exact: Sequence[Sequence], approx: Sequence[Sequence], k: int) -> float:
    """Mean over queries of |approx[:k] ∩ exact[:k]| / |exact[:k]| (1.0 for no queries); the ids are any
    hashable values (e.g. ``(partition_key, index_row)``)."""
    if not exact:
        return 1.0
    total = 0.0
    for e, a in zip(exact, approx):
        want = set(list(e)[:k])
        total += (len(want & set(list(a)[:k])) / len(want)) if want else 1.0
    return total / len(exact)
