"""Atomic parquet output: write to a temporary object beside the target, then rename.

Local files: ``os.replace`` of a sibling temp file (atomic on POSIX). S3 and other object stores:
the temp key is uploaded completely, then ``fs.mv`` copies it to the final key (a server-side copy:
the final key appears only once complete) and deletes the temp key. On any error the temp object is
removed and the previous output, if any, is left untouched.
"""

from __future__ import annotations

import posixpath
import uuid
from typing import Any, Mapping

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

ID_COLUMN = "record_id"
HASH_COLUMN = "text_sha256"
VECTOR_COLUMN = "vector"

#: fsspec protocols of object stores: keys need no directories, and the first path part is a bucket.
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oss"})


def output_schema(dim: int) -> pa.Schema:
    """``record_id: int64``, ``text_sha256: string`` (hex), ``vector: fixed_size_list<float32>[dim]``."""
    return pa.schema(
        [
            pa.field(ID_COLUMN, pa.int64(), nullable=False),
            pa.field(HASH_COLUMN, pa.string(), nullable=False),
            pa.field(VECTOR_COLUMN, pa.list_(pa.float32(), dim), nullable=False),
        ]
    )


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
