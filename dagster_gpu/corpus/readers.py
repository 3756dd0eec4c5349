"""Streaming readers: a corpus file -> batches of (record id, text[, doc id, carried columns]), memory
bounded by the batch.

Plain text: records are lines, or blocks separated by a line holding exactly ``record_separator_line``
(``%`` for fortune files). Parquet: one record per row of ``text_column``, read row group by row group
with ``pyarrow.parquet.ParquetFile.iter_batches``. JSON Lines (``.jsonl``, ``.ndjson``, ``.json``): one
JSON object per non-blank line, its ``text_column`` field the text, read line by line. Text and JSON Lines
files may be compressed (``.gz``, ``.bz2``, ``.xz``, ``.zst``: fsspec's ``compression="infer"``,
decompressed as they stream).

Record ids are the record's ordinal in the file (0-based, counting empty records too; blank JSON Lines
lines are not records), so an output row points back to its source record. Empty or whitespace-only
records (and nulls or a missing text field in parquet / JSON Lines) are skipped and counted, never embedded.

Columns (parquet and JSON Lines): ``TextFormat.id_column`` names the corpus's own id (string or integer
values, given as strings in ``RecordBatch.doc_ids``); a kept record whose id is null or missing, or whose
id repeats an earlier kept record's in the same file, is a CorpusReadError naming the file, the row/line
and the id. ``TextFormat.carry_columns`` are copied into ``RecordBatch.columns`` as Arrow arrays: a
parquet column keeps its Arrow type; a JSON Lines field takes the type pyarrow infers from the file's
first batch (``string`` when that batch has only nulls), and a later value that does not convert to it
is a CorpusReadError naming the line. A column the file lacks (a parquet column, or a JSON Lines
record without the field) is a CorpusReadError naming the file.

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
import json
import re
from dataclasses import dataclass, field
from typing import Iterator, Sequence

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
        format: ``auto`` (by suffix, after a compression suffix: ``.parquet`` -> parquet, ``.jsonl``,
            ``.ndjson``, ``.json`` -> jsonl, else text), ``text``, ``parquet`` or ``jsonl``.
        record_separator_line: text only: a line equal to this string ends a record (``%``); None =
            one record per line.
        encoding: text only (parquet strings are UTF-8); UTF-8 text may start with a byte-order mark,
            which is not part of the first record.
        text_column: parquet / JSON Lines: the column (field) holding the text.
        id_column: parquet / JSON Lines: the column holding each record's own id (``RecordBatch.doc_ids``);
            None = none (the output's ``doc_id`` is then ``<partition key>/<record_id>``).
        carry_columns: parquet / JSON Lines: columns copied through unchanged (``RecordBatch.columns``).
        decode_errors: what an undecodable record does (see the module doc): ``strict`` (CorpusReadError
            naming file, line/row and record id), ``replace`` (U+FFFD, counted in
            ``ReadStats.replaced_rows``) or ``skip`` (counted in ``ReadStats.skipped_undecodable_rows``).

    Raises:
        ValueError: ``decode_errors`` is not one of those three; ``id_column`` / ``carry_columns`` with format
            ``text``.
    """

    format: str = "auto"
    record_separator_line: str | None = None
    encoding: str = "utf-8"
    text_column: str = "text"
    decode_errors: str = "strict"
    id_column: str | None = None
    carry_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.decode_errors not in DECODE_ERRORS:
            raise ValueError(f"TextFormat.decode_errors must be one of {', '.join(DECODE_ERRORS)}, got {self.decode_errors!r}")
        if isinstance(self.carry_columns, str):
            raise ValueError(f"TextFormat.carry_columns must be a list of column names, got the string {self.carry_columns!r}")
        object.__setattr__(self, "carry_columns", tuple(self.carry_columns))
        if self.text_column in self.carry_columns:
            raise ValueError(f"TextFormat.carry_columns: {self.text_column!r} is the text column (use include_text=True to keep the text)")
        reserved = set(RESERVED_COLUMNS) & set(self.carry_columns)
        if reserved:
            raise ValueError(f"TextFormat.carry_columns {sorted(reserved)} collide with output columns {RESERVED_COLUMNS}")
        if len(set(self.carry_columns)) != len(self.carry_columns):
            raise ValueError(f"TextFormat.carry_columns has duplicates: {list(self.carry_columns)}")
        if self.format == "text" and self.has_columns:
            raise ValueError(f"TextFormat: id_column / carry_columns need a parquet or JSON Lines corpus, and format "
                             f"'text' has no columns (format='jsonl' or 'parquet', or 'auto' to go by each file's suffix)")

    @property
    def has_columns(self) -> bool:
        """Whether ``id_column`` or ``carry_columns`` is set (only parquet and JSON Lines files have columns)."""
        return bool(self.id_column or self.carry_columns)

    def columnless(self, uris: Sequence[str]) -> list[str]:
        """Those of ``uris`` read as text (:meth:`resolved`) although :attr:`has_columns`: each would fail its
        partition (a text file has no columns); [] without columns. Pure; raises CorpusReadError for an unknown
        format."""
        if not self.has_columns:
            return []
        return [u for u in uris if self.resolved(u) == "text"]

    def resolved(self, uri: str) -> str:
        """``text``, ``parquet`` or ``jsonl`` for ``uri``. Raises CorpusReadError for an unknown format."""
        if self.format not in FORMATS:
            raise CorpusReadError(f"{uri}: unknown corpus format {self.format!r} ({', '.join(FORMATS)})")
        if self.format != "auto":
            return self.format
        name = _strip_compression(uri.lower())
        if name.endswith(".parquet"):
            return "parquet"
        if name.endswith((".jsonl", ".ndjson", ".json")):
            return "jsonl"
        return "text"


#: ``TextFormat.format`` values.
FORMATS = ("auto", "text", "parquet", "jsonl")
#: Output columns no carried column may be called (see dagster_gpu.embedding.writer).
RESERVED_COLUMNS = ("doc_id", "record_id", "chunk_index", "char_start", "char_end", "token_count", "text_sha256",
                    "record_sha256", "text", "vector")


def _strip_compression(name: str) -> str:
    from fsspec.utils import infer_compression

    if infer_compression(name) is not None:
        return name.rsplit(".", 1)[0]
    return name


@dataclass
class RecordBatch:
    """Up to ``batch_rows`` kept records: ``ids[i]`` is the ordinal of ``texts[i]`` in the file.

    ``doc_ids[i]``: its ``id_column`` value as a string (None without ``id_column``); ``columns``: each carried
    column's values of the kept records, in order (Arrow arrays of the same length as ``texts``).
    """

    ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    doc_ids: list[str] | None = None
    columns: dict[str, pa.Array] = field(default_factory=dict)

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
        carried_types: see below.
    """

    records: int = 0
    skipped_empty: int = 0
    replaced_rows: int = 0
    skipped_undecodable_rows: int = 0
    #: each carried column's Arrow type, once known (parquet: at open; JSON Lines: at the first batch).
    carried_types: dict[str, pa.DataType] = field(default_factory=dict)

    @property
    def kept(self) -> int:
        """Records embedded: ``records - skipped_empty - skipped_undecodable_rows``."""
        return self.records - self.skipped_empty - self.skipped_undecodable_rows


class _ByteRange(io.RawIOBase):
    """Bytes ``[start, end)`` of the binary file ``f`` as a file of their own."""

    def __init__(self, f, start: int, end: int):
        f.seek(start)
        self._f, self._left = f, max(0, end - start)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self._left <= 0:
            return 0
        data = self._f.read(min(len(b), self._left))
        b[: len(data)] = data
        self._left -= len(data)
        return len(data)


def read_batches(
    uri: str, fmt: TextFormat, batch_rows: int, stats: ReadStats, storage_options: dict | None = None,
    shard=None,
) -> Iterator[RecordBatch]:
    """Yield RecordBatches of at most ``batch_rows`` kept records; fills ``stats`` as it goes.

    A 0-byte file yields nothing (0 records) whatever its format. Raises CorpusReadError naming
    ``uri`` on an unreadable parquet file, a missing or non-string text column, an invalid JSON Lines line,
    ``id_column`` / ``carry_columns`` on a plain text file or missing from the file, a missing or duplicated
    id, or (with ``decode_errors: strict``) undecodable text: the message names the line (text and JSON
    Lines, 1-based) or row (parquet, 0-based), the record id and the first bad byte.

    Memory: one batch, plus one set entry per kept record's id when ``id_column`` is set (duplicates are
    found within the whole file).

    ``shard`` (a :class:`dagster_gpu.corpus.shards.Shard`): read only its records (its row groups, or its byte
    range of an uncompressed file); record ids stay the whole file's (``shard.first_record`` onwards), ``stats``
    counts the shard's records, duplicate ids are found within the shard, and line numbers in messages are the
    shard's own (the message names the shard's range).
    """
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    kind = fmt.resolved(uri)
    if kind == "text" and (fmt.id_column or fmt.carry_columns):
        raise CorpusReadError(
            f"{uri}: id_column / carry_columns need a parquet or JSON Lines corpus (a text file has no columns; "
            "TextFormat(format=...) or the file's suffix says which)")
    compression = None if (kind == "parquet" or shard is not None) else "infer"
    seen: dict[str, int] = {}
    carry = fmt.carry_columns
    base = 0
    if shard is not None:
        if (shard.unit == "row_groups") != (kind == "parquet"):
            raise CorpusReadError(f"{uri}: a {shard.unit} shard cannot be read from a {kind} file")
        uri_label, base = f"{uri} [shard {shard.index + 1}/{shard.count}: {shard.unit} {shard.start}-{shard.end}]", shard.first_record
    with fsspec.open(uri, "rb", compression=compression, **(storage_options or {})) as f:
        if getattr(f, "size", None) == 0 or _is_empty(f):
            return
        if shard is not None and kind != "parquet":
            f = io.BufferedReader(_ByteRange(f, shard.start, shard.end), 1 << 20)
            uri = uri_label
        elif shard is not None:
            uri = uri_label
        if kind == "parquet":
            groups = range(shard.start, shard.end) if shard is not None else None
            source = _parquet_records(f, uri, fmt, batch_rows, stats, groups, base)
        elif kind == "jsonl":
            source = _jsonl_records(f, uri, fmt)
        else:
            source = _text_records(f, uri, fmt)
        batch = _new_batch(fmt)
        values: dict[str, list] = {c: [] for c in carry}

        def emit() -> RecordBatch:
            for c in carry:
                batch.columns[c] = _carried_array(uri, c, values[c], stats, kind)
                values[c].clear()
            return batch

        for text, bad, where, doc_id, carried in source:
            ordinal = base + stats.records
            stats.records += 1
            if bad is not None:
                where_bad, detail = bad
                if fmt.decode_errors == "strict":
                    enc = fmt.encoding if kind == "text" else "UTF-8"
                    raise CorpusReadError(
                        f"{uri}: {where_bad} (record_id {ordinal}) is not valid {enc} text: {detail}; "
                        "TextFormat(decode_errors='replace' or 'skip') embeds or skips such records"
                    )
                if fmt.decode_errors == "skip":
                    stats.skipped_undecodable_rows += 1
                    continue
                stats.replaced_rows += 1
            if text is None or not text.strip():
                stats.skipped_empty += 1
                continue
            if fmt.id_column is not None:
                key = _doc_id(uri, fmt.id_column, doc_id, where, ordinal)
                first = seen.setdefault(key, ordinal)
                if first != ordinal:
                    raise CorpusReadError(
                        f"{uri}: {where} (record_id {ordinal}): id {key!r} in column {fmt.id_column!r} is duplicated "
                        f"(first at record_id {first}); ids must be unique within a file")
                batch.doc_ids.append(key)
            batch.ids.append(ordinal)
            batch.texts.append(text)
            for c, v in zip(carry, carried):
                values[c].append(v)
            if len(batch) >= batch_rows:
                yield emit()
                batch = _new_batch(fmt)
        if len(batch):
            yield emit()
        for c in carry:  # a file with no kept record: JSON Lines types default to string
            stats.carried_types.setdefault(c, pa.string())


def _new_batch(fmt: TextFormat) -> RecordBatch:
    return RecordBatch(doc_ids=[] if fmt.id_column is not None else None)


def _doc_id(uri: str, column: str, value, where: str, ordinal: int) -> str:
    if value is None or value is _MISSING:
        raise CorpusReadError(f"{uri}: {where} (record_id {ordinal}) has no id: column {column!r} is "
                              f"{'missing' if value is _MISSING else 'null'}")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise CorpusReadError(f"{uri}: {where} (record_id {ordinal}): id column {column!r} holds "
                              f"{type(value).__name__} {value!r}; ids are strings or integers")
    key = str(value)
    if not key.strip():
        raise CorpusReadError(f"{uri}: {where} (record_id {ordinal}) has an empty id in column {column!r}")
    return key


def _carried_array(uri: str, column: str, values: list, stats: ReadStats, kind: str) -> pa.Array:
    """Values of one carried column as an Arrow array of the column's type (fixed by the first batch)."""
    known = stats.carried_types.get(column)
    try:
        arr = pa.array(values, type=known) if known is not None else pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        raise CorpusReadError(f"{uri}: carried column {column!r}: values do not convert to {known} "
                              f"(the type its first batch of records had): {e}") from e
    if known is None:
        if pa.types.is_null(arr.type):
            arr = arr.cast(pa.string())
        stats.carried_types[column] = arr.type
    return arr


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


#: What a record source yields: (text, undecodable, where, id value, carried values).
Record = tuple[object, "Bad | None", str, object, tuple]
#: An absent JSON Lines field (told apart from an explicit null).
_MISSING = object()


def _text_records(f, uri: str, fmt: TextFormat) -> Iterator[Record]:
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
            yield line, bad, f"line {lineno}", None, ()
            bad = None
        elif line == sep:
            yield "\n".join(lines), bad, f"line {lineno}", None, ()
            lines, bad = [], None
        else:
            lines.append(line)
    if sep is not None and (lines or bad is not None):
        yield "\n".join(lines), bad, f"line {lineno}", None, ()


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


def _parquet_records(f, uri: str, fmt: TextFormat, batch_rows: int, stats: ReadStats, row_groups: range | None = None,
                     first_row: int = 0) -> Iterator[Record]:
    try:
        pf = pq.ParquetFile(f)
    except (pa.ArrowInvalid, OSError) as e:
        raise CorpusReadError(f"{uri}: not a readable parquet file: {e}") from e
    schema = pf.schema_arrow
    names = schema.names
    if fmt.text_column not in names:
        raise CorpusReadError(f"{uri}: no column {fmt.text_column!r} (columns: {', '.join(names)})")
    wanted = [c for c in (fmt.id_column, *fmt.carry_columns) if c is not None]
    lacking = [c for c in wanted if c not in names]
    if lacking:
        what = "id_column" if lacking[0] == fmt.id_column else "carry_columns"
        raise CorpusReadError(f"{uri}: no column {lacking[0]!r} ({what}; columns: {', '.join(names)})")
    if fmt.id_column is not None:
        t = schema.field(fmt.id_column).type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)):
            raise CorpusReadError(f"{uri}: id column {fmt.id_column!r} has type {t}, expected string or integer")
    for c in fmt.carry_columns:
        stats.carried_types[c] = schema.field(c).type
    columns = [fmt.text_column, *dict.fromkeys(wanted)]
    row = first_row
    try:
        for rb in pf.iter_batches(batch_size=batch_rows, columns=columns,
                                  row_groups=list(row_groups) if row_groups is not None else None):
            col = rb.column(fmt.text_column)
            if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
                raise CorpusReadError(f"{uri}: column {fmt.text_column!r} has type {col.type}, expected string")
            try:
                values = col.to_pylist()  # pyarrow does not validate UTF-8 on read; this raises on the first bad value
            except UnicodeDecodeError:
                texts = list(_decode_utf8_values(col, row))
            else:
                texts = [(v, None) for v in values]
            try:
                ids = rb.column(fmt.id_column).to_pylist() if fmt.id_column is not None else None
                carried = [rb.column(c).to_pylist() for c in fmt.carry_columns]
            except UnicodeDecodeError as e:
                raise CorpusReadError(f"{uri}: rows {row}-{row + len(col) - 1}: an id or carried column holds "
                                      f"invalid UTF-8: {e}") from e
            for i, (text, bad) in enumerate(texts):
                yield text, bad, f"row {row + i}", ids[i] if ids is not None else None, tuple(v[i] for v in carried)
            row += len(col)
    except pa.ArrowException as e:
        raise CorpusReadError(f"{uri}: parquet read failed: {e}") from e


def _jsonl_records(f, uri: str, fmt: TextFormat) -> Iterator[Record]:
    """One record per non-blank line (a JSON object), UTF-8 (a byte-order mark at the start is skipped)."""
    reader = io.TextIOWrapper(f, encoding="utf-8-sig", errors=_MARK, newline=None)
    lineno = 0
    for line in reader:
        lineno += 1
        if not line.strip():
            continue
        bad: Bad | None = None
        if _MARKED.search(line):
            line, what = _first_bad(line, "column")
            bad = (f"line {lineno}", what)
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise CorpusReadError(f"{uri}: line {lineno} is not valid JSON: {e}") from e
        if not isinstance(obj, dict):
            raise CorpusReadError(f"{uri}: line {lineno} is a JSON {type(obj).__name__}, expected an object")
        text = obj.get(fmt.text_column)
        if text is not None and not isinstance(text, str):
            raise CorpusReadError(f"{uri}: line {lineno}: field {fmt.text_column!r} is a {type(text).__name__}, "
                                  "expected a string")
        for c in fmt.carry_columns:
            if c not in obj:
                raise CorpusReadError(f"{uri}: line {lineno} has no field {c!r} (carry_columns; fields: "
                                      f"{', '.join(obj)})")
        doc_id = obj.get(fmt.id_column, _MISSING) if fmt.id_column is not None else None
        yield text, bad, f"line {lineno}", doc_id, tuple(obj[c] for c in fmt.carry_columns)
