"""Streaming readers: a corpus file -> batches of (record id, text), memory bounded by the batch.

Plain text: records are lines, or blocks separated by a line holding exactly ``record_separator_line``
(``%`` for fortune files). Parquet: one record per row of ``text_column``, read row group by row group
with ``pyarrow.parquet.ParquetFile.iter_batches``.

Record ids are the record's ordinal in the file (0-based, counting empty records too), so an output
row points back to its source record. Empty or whitespace-only records (and nulls in parquet) are
skipped and counted, never embedded.

Undecodable text (bytes that are not valid in the text encoding, or invalid UTF-8 in a parquet string
column, which pyarrow does not check on read) follows ``TextFormat.decode_errors``:

- ``strict`` (default): CorpusReadError naming the file, the line (text) or row (parquet), the
  record id, and the first bad byte;
- ``replace``: each run of undecodable bytes becomes one U+FFFD; the record is embedded and counted in
  ``ReadStats.replaced_rows``;
- ``skip``: the record is not embedded (its record id stays unused) and is counted in
  ``ReadStats.skipped_undecodable_rows``.

Both readers decode through one error handler that maps each bad byte ``b`` to the lone surrogate
``U+DC00 + b`` (which no strict decoder of UTF-8/16/32 or a single-byte codec produces from valid
input) and then look for those in each line or value, so the position is exact whatever the codec's
chunking.
"""

from __future__ import annotations

import codecs
import io
import re
from dataclasses import dataclass, field
from typing import Iterator

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

#: ``TextFormat.decode_errors`` values.
DECODE_ERRORS = ("strict", "replace", "skip")
_MARK = "dagster_gpu.mark_undecodable"
_MARKED = re.compile("[\udc00-\udcff]+")


def _mark_undecodable(e: UnicodeError) -> tuple[str, int]:
    if not isinstance(e, UnicodeDecodeError):
        raise e
    return "".join(chr(0xDC00 + b) for b in e.object[e.start : e.end]), e.end


codecs.register_error(_MARK, _mark_undecodable)


class CorpusReadError(ValueError):
    """A corpus file cannot be read as configured; the message names the file."""


@dataclass(frozen=True)
class TextFormat:
    """How to read records.

    Attributes:
        format: ``auto`` (``.parquet`` suffix -> parquet, else text), ``text`` or ``parquet``.
        record_separator_line: text only: a line equal to this string ends a record (``%``); None =
            one record per line.
        encoding: text only (parquet strings are UTF-8); UTF-8 text may start with a byte-order mark,
            which is not part of the first record.
        text_column: parquet only: the column holding the text.
        decode_errors: what an undecodable record does (see the module doc): ``strict`` (CorpusReadError
            naming file, line/row and record id), ``replace`` (U+FFFD, counted in
            ``ReadStats.replaced_rows``) or ``skip`` (counted in ``ReadStats.skipped_undecodable_rows``).

    Raises:
        ValueError: ``decode_errors`` is not one of those three.
    """

    format: str = "auto"
    record_separator_line: str | None = None
    encoding: str = "utf-8"
    text_column: str = "text"
    decode_errors: str = "strict"

    def __post_init__(self) -> None:
        if self.decode_errors not in DECODE_ERRORS:
            raise ValueError(f"TextFormat.decode_errors must be one of {', '.join(DECODE_ERRORS)}, got {self.decode_errors!r}")

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
    """Counts over one file (records, i.e. lines/blocks of text or parquet rows).

    Attributes:
        records: records read, every kind below included.
        skipped_empty: empty, whitespace-only or null records (not embedded).
        replaced_rows: records with undecodable bytes replaced by U+FFFD (``decode_errors: replace``; embedded).
        skipped_undecodable_rows: records with undecodable bytes left out (``decode_errors: skip``).
    """

    records: int = 0
    skipped_empty: int = 0
    replaced_rows: int = 0
    skipped_undecodable_rows: int = 0

    @property
    def kept(self) -> int:
        """Records embedded: ``records - skipped_empty - skipped_undecodable_rows``."""
        return self.records - self.skipped_empty - self.skipped_undecodable_rows


def read_batches(
    uri: str, fmt: TextFormat, batch_rows: int, stats: ReadStats, storage_options: dict | None = None
) -> Iterator[RecordBatch]:
    """Yield RecordBatches of at most ``batch_rows`` kept records; fills ``stats`` as it goes.

    A 0-byte file yields nothing (0 records) whatever its format. Raises CorpusReadError naming
    ``uri`` on an unreadable parquet file, a missing or non-string text column, or (with
    ``decode_errors: strict``) undecodable text: the message names the line (text, 1-based) or row
    (parquet, 0-based), the record id and the first bad byte.
    """
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    kind = fmt.resolved(uri)
    with fsspec.open(uri, "rb", **(storage_options or {})) as f:
        if getattr(f, "size", None) == 0 or _is_empty(f):
            return
        source = _parquet_records(f, uri, fmt, batch_rows) if kind == "parquet" else _text_records(f, uri, fmt)
        batch = RecordBatch()
        for text, bad in source:
            ordinal = stats.records
            stats.records += 1
            if bad is not None:
                where, detail = bad
                if fmt.decode_errors == "strict":
                    enc = "UTF-8" if kind == "parquet" else fmt.encoding
                    raise CorpusReadError(
                        f"{uri}: {where} (record_id {ordinal}) is not valid {enc} text: {detail}; "
                        "TextFormat(decode_errors='replace' or 'skip') embeds or skips such records"
                    )
                if fmt.decode_errors == "skip":
                    stats.skipped_undecodable_rows += 1
                    continue
                stats.replaced_rows += 1
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


#: (where, what): the first undecodable bytes of a record, e.g. ("line 3", "byte 0xff at column 3").
Bad = tuple[str, str]


def _first_bad(text: str, unit: str) -> tuple[str, str]:
    """(text with each run of marked bytes as one U+FFFD, description of the first run)."""
    m = _MARKED.search(text)
    assert m is not None
    raw = bytes(ord(c) - 0xDC00 for c in m.group())
    shown = " ".join(f"0x{b:02x}" for b in raw[:8]) + (" …" if len(raw) > 8 else "")
    what = f"byte{'s' if len(raw) > 1 else ''} {shown} at {unit} {m.start() + 1}"
    return _MARKED.sub("\ufffd", text), what


def _text_records(f, uri: str, fmt: TextFormat) -> Iterator[tuple[str, Bad | None]]:
    try:
        # UTF-8 with a byte-order mark (Windows editors write one) reads as UTF-8: the mark is not text
        encoding = "utf-8-sig" if codecs.lookup(fmt.encoding).name == "utf-8" else fmt.encoding
        reader = io.TextIOWrapper(f, encoding=encoding, errors=_MARK, newline=None)
    except LookupError as e:
        raise CorpusReadError(f"{uri}: unknown text encoding {fmt.encoding!r}") from e
    sep = fmt.record_separator_line
    lines: list[str] = []
    bad: Bad | None = None  # the record's first undecodable line
    lineno = 0
    for line in reader:
        lineno += 1
        line = line.rstrip("\n")
        if _MARKED.search(line):
            line, what = _first_bad(line, "column")
            if bad is None:
                bad = (f"line {lineno}", what)
        if sep is None:
            yield line, bad
            bad = None
        elif line == sep:
            yield "\n".join(lines), bad
            lines, bad = [], None
        else:
            lines.append(line)
    if sep is not None and (lines or bad is not None):
        yield "\n".join(lines), bad


def _decode_utf8_values(col: pa.Array, first_row: int) -> Iterator[tuple[str | None, Bad | None]]:
    """The values of a string column holding invalid UTF-8, one by one from its bytes."""
    raw = col.view(pa.large_binary() if pa.types.is_large_string(col.type) else pa.binary())
    for i, b in enumerate(raw.to_pylist()):
        if b is None:
            yield None, None
            continue
        text = b.decode("utf-8", errors=_MARK)
        if _MARKED.search(text):
            text, what = _first_bad(text, "character")
            yield text, (f"row {first_row + i}", what)
        else:
            yield text, None


def _parquet_records(f, uri: str, fmt: TextFormat, batch_rows: int) -> Iterator[tuple[str | None, Bad | None]]:
    try:
        pf = pq.ParquetFile(f)
    except (pa.ArrowInvalid, OSError) as e:
        raise CorpusReadError(f"{uri}: not a readable parquet file: {e}") from e
    names = pf.schema_arrow.names
    if fmt.text_column not in names:
        raise CorpusReadError(f"{uri}: no column {fmt.text_column!r} (columns: {', '.join(names)})")
    row = 0
    try:
        for rb in pf.iter_batches(batch_size=batch_rows, columns=[fmt.text_column]):
            col = rb.column(0)
            if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
                raise CorpusReadError(f"{uri}: column {fmt.text_column!r} has type {col.type}, expected string")
            try:
                values = col.to_pylist()  # pyarrow does not validate UTF-8 on read; this raises on the first bad value
            except UnicodeDecodeError:
                yield from _decode_utf8_values(col, row)
            else:
                for v in values:
                    yield v, None
            row += len(col)
    except pa.ArrowException as e:
        raise CorpusReadError(f"{uri}: parquet read failed: {e}") from e
