"""Shards: one large corpus file cut into ranges that can be read (and embedded) apart.

A shard is a range of whole records of one file: a range of row groups of a parquet file, or a byte range of
an uncompressed JSON Lines or text file cut just after a record boundary, so that every record lies in
exactly one shard (never split, never read twice). ``first_record`` is the record id (the ordinal in the whole
file, as :mod:`dagster_gpu.corpus.readers` numbers records) of the shard's first record: a shard read with
:func:`dagster_gpu.corpus.readers.read_batches` (``shard=``) yields the same record ids as the whole file's
read does for those records.

Record boundaries, as the readers define records:

- JSON Lines: after any ``\\n``; records are the non-blank lines;
- text, one record per line: after any ``\\n``; every line is a record;
- text with ``record_separator_line``: just after a line equal to the separator (a ``%`` line); records are
  the blocks the separator lines end.

Planning reads the file once, line by line in binary (C speed, no decoding): byte offsets and record counts are
exact. A file is planned as one shard (no cut) when it cannot be cut safely: compressed (``.gz``…: no random
access), an encoding whose newline is not the byte ``\\n`` (UTF-16/32), or a line ending in a bare ``\\r``
(the readers' universal newlines would count lines this byte scan does not see).
"""

from __future__ import annotations

import codecs
import hashlib
from dataclasses import dataclass
from typing import BinaryIO, Sequence

from dagster_gpu.core.partition_keys import validate_partition_key

#: Encodings whose ``\n`` and separator bytes are their ASCII bytes (a byte scan finds every line).
_ASCII_COMPATIBLE = {"utf-8", "ascii", "latin-1", "iso8859-1", "cp1252", "iso8859-15"}
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zstd", ".lz4", ".snappy")


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` of one file.

    ``unit``: ``"bytes"`` (``[start, end)`` byte offsets) or ``"row_groups"`` (``[start, end)`` row-group
    indices). ``first_record``: the record id of the shard's first record in the whole file. ``records``: how
    many records the shard holds (empty and undecodable ones included, as the readers count them), None for a
    file planned as one shard without counting.
    """

    index: int
    count: int
    unit: str
    start: int
    end: int
    first_record: int
    records: int | None


def shardable(uri: str, kind: str, encoding: str = "utf-8") -> bool:
    """Whether a file of reader ``kind`` (``text``, ``jsonl``, ``parquet``) at ``uri`` can be cut at all."""
    if kind == "parquet":
        return True
    if uri.lower().endswith(_COMPRESSED):
        return False
    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        return False
    return kind == "jsonl" or name in _ASCII_COMPATIBLE


def plan_byte_shards(f: BinaryIO, size: int, target_bytes: int, *, kind: str,
                     separator_line: str | None = None, encoding: str = "utf-8") -> list[Shard]:
    """Cut the file ``f`` (binary, at offset 0, ``size`` bytes) into shards of about ``target_bytes`` each: a
    cut is made at the first record boundary at or after each multiple of ``target_bytes``. ``kind``: ``jsonl``
    or ``text`` (``separator_line`` as ``TextFormat.record_separator_line``). One shard when the file is not
    larger than ``target_bytes``, or holds a bare ``\\r`` line ending. Raises ValueError for ``target_bytes`` < 1
    or an unknown ``kind``."""
    if target_bytes < 1:
        raise ValueError(f"target_bytes must be >= 1, got {target_bytes}")
    if kind not in ("jsonl", "text"):
        raise ValueError(f"byte shards are for jsonl or text files, not {kind!r}")
    sep = separator_line.encode(encoding) if (kind == "text" and separator_line is not None) else None
    cuts: list[tuple[int, int]] = []  # (byte offset, records before it)
    pos = records = 0
    next_cut = target_bytes
    first = True
    for line in f:
        body = line[:-1] if line.endswith(b"\n") else line
        if body.endswith(b"\r"):
            body = body[:-1]
        if b"\r" in body:  # a bare CR: a line break for the readers, not for this scan
            return [Shard(0, 1, "bytes", 0, size, 0, None)]
        if first and body.startswith(codecs.BOM_UTF8):
            body = body[len(codecs.BOM_UTF8):]
        first = False
        pos += len(line)
        if kind == "jsonl":
            records += 1 if body.strip() else 0
            boundary = True
        elif sep is None:
            records += 1
            boundary = True
        else:
            boundary = body == sep
            records += 1 if boundary else 0
        if boundary and pos >= next_cut and pos < size:
            cuts.append((pos, records))
            next_cut = (pos // target_bytes + 1) * target_bytes
    if sep is not None and pos and not boundary:
        records += 1  # the last block, not ended by a separator line (the reader yields it too)
    bounds = [(0, 0), *cuts, (size, records)]
    n = len(bounds) - 1
    return [Shard(i, n, "bytes", bounds[i][0], bounds[i + 1][0], bounds[i][1], bounds[i + 1][1] - bounds[i][1])
            for i in range(n)]


def plan_row_group_shards(row_group_rows: Sequence[int], row_group_bytes: Sequence[int], target_bytes: int) -> list[Shard]:
    """Cut a parquet file's row groups (their row counts and sizes in bytes, as ``pq.ParquetFile(f).metadata``
    gives: ``row_group(i).num_rows``, ``row_group(i).total_byte_size``) into shards of about ``target_bytes``:
    whole row groups, in order, a shard closed once it holds ``target_bytes`` or more. Raises ValueError for
    ``target_bytes`` < 1 or lists of different lengths."""
    if target_bytes < 1:
        raise ValueError(f"target_bytes must be >= 1, got {target_bytes}")
    if len(row_group_rows) != len(row_group_bytes):
        raise ValueError("row_group_rows and row_group_bytes differ in length")
    groups: list[tuple[int, int, int, int]] = []  # start, end, first_record, records
    start = first = acc = rows = 0
    for i, (n, b) in enumerate(zip(row_group_rows, row_group_bytes)):
        acc += b
        rows += n
        if acc >= target_bytes and i + 1 < len(row_group_rows):
            groups.append((start, i + 1, first, rows))
            start, first, acc, rows = i + 1, first + rows, 0, 0
    groups.append((start, len(row_group_rows), first, rows))
    return [Shard(i, len(groups), "row_groups", s, e, fr, r) for i, (s, e, fr, r) in enumerate(groups)]


def shard_key(file_key: str, source_version: str, shard: Shard) -> str:
    """The partition key of ``shard`` of the file whose partition key is ``file_key``: ``<file key, cut to 40>
    -s<index>of<count>-<6 hex of the SHA-256 of the file key and the source version>`` (at most 63 characters, the
    characters of :mod:`dagster_gpu.core.partition_keys`). A changed file (new source version) gets new keys, so its
    old shards' keys (and their outputs and index rows) can be pruned by key; the whole file key is hashed too, so two
    files whose keys share their first 40 characters and whose versions are equal (same size and mtime) differ."""

    head = file_key[:40].rstrip("._-") or "file"
    return validate_partition_key(f"{head}-s{shard.index:04d}of{shard.count:04d}-{_digest(file_key, source_version)}")


def could_be_shard_key(key: str, file_key: str, source_version: str) -> bool:
    """Whether ``key`` has the form of a :func:`shard_key` of this file at this source version (any index and
    count): lets a worker plan only the files its partition keys can belong to."""
    head = file_key[:40].rstrip("._-") or "file"
    rest = key[len(head):] if key.startswith(head) else ""
    return (len(rest) == 19 and rest[:2] == "-s" and rest[2:6].isdigit() and rest[6:8] == "of"
            and rest[8:12].isdigit() and rest[12:] == "-" + _digest(file_key, source_version))


def _digest(file_key: str, source_version: str) -> str:
    return hashlib.sha256(f"{file_key}\0{source_version}".encode()).hexdigest()[:6]


__all__ = ["Shard", "could_be_shard_key", "plan_byte_shards", "plan_row_group_shards", "shard_key", "shardable"]
