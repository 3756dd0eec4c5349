"""The output's columns and its atomic parquet writer.

Columns (:func:`output_schema`), one row per embedded chunk (one per record without chunking):

=================  ======================================  =============================================
``doc_id``         string                                  the corpus's id (``TextFormat.id_column``), else
                                                           ``<partition key>/<record_id>``
``record_id``      int64                                   the record's ordinal in its file
``chunk_index``    int32                                   0, 1, … within the record
``char_start``     int64                                   the chunk's start in the record's text (characters)
``char_end``       int64                                   its end, exclusive
``token_count``    int32                                   tokens the model saw (prompt and special tokens in)
``text_sha256``    string                                  hex sha256 of the chunk's text, UTF-8:
                                                           ``text[char_start:char_end]``
``record_sha256``  string                                  hex sha256 of the record's whole text (chunked
                                                           outputs only: the key of chunk reuse)
*carried*          as in the corpus                        ``TextFormat.carry_columns``, unchanged
``text``           string                                  the chunk's text (``include_text=True`` only)
``vector``         fixed_size_list<float32|float16>[dim]   the embedding
=================  ======================================  =============================================

Parquet key-value metadata (:func:`lineage_metadata`, read back with :func:`read_lineage`):
``dagster_gpu.fingerprint``, ``dagster_gpu.model``, ``dagster_gpu.model_revision`` (strings) and
``dagster_gpu.lineage`` (JSON: everything that went into the fingerprint, plus the partition and file).

Atomic write: write to a temporary object beside the target, then rename.

Local files: ``os.replace`` of a sibling temp file (atomic on POSIX). S3 and other object stores:
the temp key is uploaded completely, then ``fs.mv`` copies it to the final key (a server-side copy:
the final key appears only once complete) and deletes the temp key. On any error the temp object is
removed and the previous output, if any, is left untouched.
"""

from __future__ import annotations

import json
import posixpath
import uuid
from typing import Any, Mapping, Sequence

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

DOC_ID_COLUMN = "doc_id"
ID_COLUMN = "record_id"
CHUNK_COLUMN = "chunk_index"
CHAR_START_COLUMN = "char_start"
CHAR_END_COLUMN = "char_end"
TOKENS_COLUMN = "token_count"
HASH_COLUMN = "text_sha256"
#: sha256 of the record's whole text; chunked outputs only (``output_schema(record_hash=True)``): the key that
#: lets a re-embedding reuse an unchanged record's chunks (:mod:`dagster_gpu.embedding.reuse`).
RECORD_HASH_COLUMN = "record_sha256"
TEXT_COLUMN = "text"
VECTOR_COLUMN = "vector"

#: ``output_dtype`` values -> the vector's Arrow value type.
VECTOR_TYPES = {"float32": pa.float32(), "float16": pa.float16()}

#: Parquet key-value metadata keys.
META_FINGERPRINT = "dagster_gpu.fingerprint"
META_MODEL = "dagster_gpu.model"
META_MODEL_REVISION = "dagster_gpu.model_revision"
META_LINEAGE = "dagster_gpu.lineage"

#: fsspec protocols of object stores: keys need no directories, and the first path part is a bucket.
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oss"})


def vector_type(output_dtype: str) -> pa.DataType:
    """The vector's value type for ``output_dtype`` (``float32`` | ``float16``); ValueError otherwise."""
    try:
        return VECTOR_TYPES[output_dtype]
    except KeyError:
        raise ValueError(f"output_dtype {output_dtype!r}: expected one of {sorted(VECTOR_TYPES)}") from None


def output_schema(dim: int, *, carried: Sequence[pa.Field] = (), include_text: bool = False,
                  output_dtype: str = "float32", metadata: Mapping[str, str] | None = None,
                  record_hash: bool = False) -> pa.Schema:
    """The output columns (see the module doc): fixed columns non-nullable, ``carried`` fields (nullable, their
    corpus types) after ``text_sha256``, ``text`` when ``include_text``, ``vector`` of ``output_dtype`` last.
    ``metadata``: the parquet key-value metadata (:func:`lineage_metadata`). ``record_hash``: a non-nullable
    ``record_sha256`` string column (hex sha256 of the record's whole text) right after ``text_sha256``."""
    fields = [
        pa.field(DOC_ID_COLUMN, pa.string(), nullable=False),
        pa.field(ID_COLUMN, pa.int64(), nullable=False),
        pa.field(CHUNK_COLUMN, pa.int32(), nullable=False),
        pa.field(CHAR_START_COLUMN, pa.int64(), nullable=False),
        pa.field(CHAR_END_COLUMN, pa.int64(), nullable=False),
        pa.field(TOKENS_COLUMN, pa.int32(), nullable=False),
        pa.field(HASH_COLUMN, pa.string(), nullable=False),
        *([pa.field(RECORD_HASH_COLUMN, pa.string(), nullable=False)] if record_hash else []),
        *(pa.field(f.name, f.type, nullable=True) for f in carried),
    ]
    if include_text:
        fields.append(pa.field(TEXT_COLUMN, pa.string(), nullable=False))
    fields.append(pa.field(VECTOR_COLUMN, pa.list_(vector_type(output_dtype), dim), nullable=False))
    return pa.schema(fields, metadata=dict(metadata) if metadata else None)


def output_table(schema: pa.Schema, *, doc_ids: Sequence[str], record_ids, chunk_index, char_start, char_end,
                 token_count, hashes: Sequence[str], vectors: np.ndarray, carried: Mapping[str, pa.Array] | None = None,
                 texts: Sequence[str] | None = None, record_hashes: Sequence[str] | None = None) -> pa.Table:
    """One batch of output rows in ``schema``'s column order; ``vectors`` [rows, dim] is cast to its dtype.
    ``record_hashes``: the ``record_sha256`` column's values (required when ``schema`` has it)."""
    vtype = schema.field(VECTOR_COLUMN).type
    dim = vtype.list_size
    np_dtype = np.float16 if vtype.value_type == pa.float16() else np.float32
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np_dtype).reshape(-1), type=vtype.value_type)
    cols: dict[str, pa.Array] = {
        DOC_ID_COLUMN: pa.array(doc_ids, pa.string()),
        ID_COLUMN: pa.array(np.asarray(record_ids, dtype=np.int64)),
        CHUNK_COLUMN: pa.array(np.asarray(chunk_index, dtype=np.int32)),
        CHAR_START_COLUMN: pa.array(np.asarray(char_start, dtype=np.int64)),
        CHAR_END_COLUMN: pa.array(np.asarray(char_end, dtype=np.int64)),
        TOKENS_COLUMN: pa.array(np.asarray(token_count, dtype=np.int32)),
        HASH_COLUMN: pa.array(hashes, pa.string()),
        VECTOR_COLUMN: pa.FixedSizeListArray.from_arrays(flat, dim),
    }
    if record_hashes is not None:
        cols[RECORD_HASH_COLUMN] = pa.array(record_hashes, pa.string())
    if texts is not None:
        cols[TEXT_COLUMN] = pa.array(texts, pa.string())
    for name, arr in (carried or {}).items():
        cols[name] = arr
    return pa.table([cols[f.name] for f in schema], schema=schema)


def lineage_metadata(*, fingerprint: str, model: str, model_revision: str, lineage: Mapping[str, Any]) -> dict[str, str]:
    """The parquet key-value metadata of an output (string keys and values; ``lineage`` as sorted JSON)."""
    return {
        META_FINGERPRINT: fingerprint,
        META_MODEL: model,
        META_MODEL_REVISION: model_revision,
        META_LINEAGE: json.dumps(dict(lineage), sort_keys=True, default=str),
    }


def read_lineage(uri: str, storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An output's lineage: ``{"fingerprint", "model", "model_revision", "lineage": {...}}`` from its parquet
    key-value metadata (reads the footer only); keys absent from the file are absent here."""
    fs, path = fsspec.core.url_to_fs(uri, **dict(storage_options or {}))
    with fs.open(path, "rb") as f:
        kv = pq.ParquetFile(f).schema_arrow.metadata or {}
    return lineage_from_metadata(kv)


def recorded_files(uri: str, storage_options: Mapping[str, Any] | None = None) -> dict[str, str] | None:
    """A file group's output's ``{file key: source version}`` (its lineage's ``files``, written by the unit for each
    bucket), read from the footer only; None when there is no output, it cannot be read or it records no files.
    Never raises."""
    try:
        files = read_lineage(uri, storage_options).get("lineage", {}).get("files")
    except Exception:  # noqa: BLE001 - no previous output (or an unreadable one): nothing known, every file is new
        return None
    return {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else None


def lineage_from_metadata(kv: Mapping[bytes, bytes] | None) -> dict[str, Any]:
    """:func:`read_lineage` of a schema's key-value metadata already read (``pa.Schema.metadata``: bytes keys and
    values; None reads as no metadata)."""
    kv = kv or {}
    out: dict[str, Any] = {}
    for key, name in ((META_FINGERPRINT, "fingerprint"), (META_MODEL, "model"), (META_MODEL_REVISION, "model_revision")):
        if key.encode() in kv:
            out[name] = kv[key.encode()].decode()
    if META_LINEAGE.encode() in kv:
        out["lineage"] = json.loads(kv[META_LINEAGE.encode()])
    return out


class AtomicParquetWriter:
    """Context manager: ``write(table)`` any number of times; the file appears at ``uri`` on a clean exit."""

    def __init__(self, uri: str, schema: pa.Schema, storage_options: Mapping[str, Any] | None = None):
        self.uri = uri
        self.schema = schema
        self.fs, self.path = fsspec.core.url_to_fs(uri, **dict(storage_options or {}))
        head, tail = posixpath.split(self.path)
        self.tmp_path = posixpath.join(head, f".{tail}.tmp-{uuid.uuid4().hex[:12]}")
        self._file = None
        self._writer: pq.ParquetWriter | None = None
        self.rows = 0

    def __enter__(self) -> "AtomicParquetWriter":
        """Opens the temp object. Raises FileNotFoundError when an object store's bucket does not exist:
        a bucket is never created (s3fs's ``makedirs`` would create one from a typo in the URL)."""
        parent = posixpath.dirname(self.path)
        protocols = {self.fs.protocol} if isinstance(self.fs.protocol, str) else set(self.fs.protocol)
        if protocols & OBJECT_STORES:
            bucket = self.path.split("/", 1)[0]
            if not self.fs.exists(bucket):
                raise FileNotFoundError(f"output bucket {bucket!r} does not exist (writing {self.uri}); "
                                        "dagster-gpu never creates buckets: create it, or fix output_url")
        elif parent:
            self.fs.makedirs(parent, exist_ok=True)
        self._file = self.fs.open(self.tmp_path, "wb")
        self._writer = pq.ParquetWriter(self._file, self.schema, compression="zstd")
        return self

    def write(self, table: pa.Table) -> None:
        assert self._writer is not None, "use AtomicParquetWriter as a context manager"
        self._writer.write_table(table)
        self.rows += table.num_rows

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self._writer is not None:
                self._writer.close()
            if self._file is not None:
                self._file.close()
        except BaseException:
            self._discard()
            raise
        if exc_type is not None:
            self._discard()
            return
        try:
            self.fs.mv(self.tmp_path, self.path)
        except BaseException:
            self._discard()
            raise

    def _discard(self) -> None:
        try:
            if self.fs.exists(self.tmp_path):
                self.fs.rm(self.tmp_path)
        except Exception:  # best effort: never mask the original error
            pass
