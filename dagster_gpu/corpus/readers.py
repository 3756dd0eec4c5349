"""Streaming readers: a corpus file -> batches of (record id, text), memory bounded by the batch.

Plain text: records are lines, or blocks separated by a line holding exactly ``record_separator_line``
(``%`` for fortune files). Parquet: one record per row of ``text_column``, read row group by row group
with ``pyarrow.parquet.ParquetFile.iter_batches``.

Record ids are the record's ordinal in the file (0-based, counting empty records too), so an output
row points back to its source record. Empty or whitespace-only records (and nulls in parquet) are
skipped and counted, never embedded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq


class CorpusReadError(ValueError):
    """A corpus file cannot be read as configured; the message names the file."""


@dataclass(frozen=True)
class TextFormat:
    """How to read records.

    Attributes:
        format: ``auto`` (``.parquet`` suffix -> parquet, else text), ``text`` or ``parquet``.
        record_separator_line: text only: a line equal to this string ends a record (``%``); None =
            one record per line.
        encoding: text only; undecodable bytes raise CorpusReadError naming the file.
        text_column: parquet only: the column holding the text.
    """

    format: str = "auto"
    record_separator_line: str | None = None
    encoding: str = "utf-8"
    text_column: str = "text"

    def resolved(self, uri: str) -> str:
        if self.format not in ("auto", "text", "parquet"):
            raise CorpusReadError(f"{uri}: unknown corpus format {self.format!r} (auto, text, parquet)")
        if self.format != "auto":
            return self.format
        return "parquet" if uri.lower().endswith(".parquet") else "text"


@dataclass
class RecordBatch:
    """Up to ``batch_rows`` kept records: ``ids[i]`` is the ordinal of ``texts[i]`` in the file."""

    ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.texts)


@dataclass
class ReadStats:
    """Counts over one file: ``records`` read (including empty ones) and ``skipped_empty``."""

    records: int = 0
    skipped_empty: int = 0

    @property
    def kept(self) -> int:
        return self.records - self.skipped_empty


def read_batches(
    uri: str, fmt: TextFormat, batch_rows: int, stats: ReadStats, storage_options: dict | None = None
) -> Iterator[RecordBatch]:
    """Yield RecordBatches of at most ``batch_rows`` kept records; fills ``stats`` as it goes.

    A 0-byte file yields nothing (0 records) whatever its format. Raises CorpusReadError naming
    ``uri`` on undecodable text, an unreadable parquet file or a missing text column.
    """
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    kind = fmt.resolved(uri)
    with fsspec.open(uri, "rb", **(storage_options or {})) as f:
        if getattr(f, "size", None) == 0 or _is_empty(f):
            return
        source = _parquet_records(f, uri, fmt, batch_rows) if kind == "parquet" else _text_records(f, uri, fmt)
        batch = RecordBatch()
        for text in source:
            ordinal = stats.records
            stats.records += 1
            if text is None or not text.strip():
                stats.skipped_empty += 1
                continue
            batch.ids.append(ordinal)
            batch.texts.append(text)
            if len(batch) >= batch_rows:
                yield batch
                batch = RecordBatch()
        if len(batch):
            yield batch


def _is_empty(f) -> bool:
    pos = f.tell()
    empty = f.read(1) == b""
    f.seek(pos)
    return empty


def _text_records(f, uri: str, fmt: TextFormat) -> Iterator[str]:
    import io

    reader = io.TextIOWrapper(f, encoding=fmt.encoding, errors="strict", newline=None)
    sep = fmt.record_separator_line
    lines: list[str] = []
    lineno = 0
    try:
        for line in reader:
            lineno += 1
            line = line.rstrip("\n")
            if sep is None:
                yield line
            elif line == sep:
                yield "\n".join(lines)
                lines = []
            else:
                lines.append(line)
    except UnicodeDecodeError as e:
        raise CorpusReadError(f"{uri}: not valid {fmt.encoding} text near line {lineno + 1}: {e.reason}") from e
    if sep is not None and lines:
        yield "\n".join(lines)


def _parquet_records(f, uri: str, fmt: TextFormat, batch_rows: int) -> Iterator[str | None]:
    try:
        pf = pq.ParquetFile(f)
    except (pa.ArrowInvalid, OSError) as e:
        raise CorpusReadError(f"{uri}: not a readable parquet file: {e}") from e
    names = pf.schema_arrow.names
    if fmt.text_column not in names:
        raise CorpusReadError(f"{uri}: no column {fmt.text_column!r} (columns: {', '.join(names)})")
    try:
        for rb in pf.iter_batches(batch_size=batch_rows, columns=[fmt.text_column]):
            col = rb.column(0)
            if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
                raise CorpusReadError(f"{uri}: column {fmt.text_column!r} has type {col.type}, expected string")
            yield from col.to_pylist()
    except pa.ArrowException as e:
        raise CorpusReadError(f"{uri}: parquet read failed: {e}") from e
