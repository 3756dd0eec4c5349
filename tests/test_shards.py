"""Shards of one large corpus file (dagster_gpu.corpus.shards): every record in exactly one shard, record ids the
whole file's, read through the real readers (read_batches) and compared with the whole file's read."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_gpu.corpus.readers import CorpusReadError, ReadStats, TextFormat, read_batches
from dagster_gpu.corpus.shards import Shard, could_be_shard_key, plan_byte_shards, plan_row_group_shards, shard_key, shardable


def _read(uri: str, fmt: TextFormat, shard=None):
    stats = ReadStats()
    out = [(i, t) for b in read_batches(uri, fmt, 7, stats, shard=shard) for i, t in zip(b.ids, b.texts)]
    return out, stats


def _plan(path, target, **kw):
    with open(path, "rb") as f:
        return plan_byte_shards(f, path.stat().st_size, target, **kw)


def _check_cover(path, shards, fmt):
    whole, ws = _read(str(path), fmt)
    parts, records = [], 0
    for s in shards:
        got, st = _read(str(path), fmt, s)
        assert st.records == s.records  # the plan's count is the reader's
        assert not got or got[0][0] >= s.first_record
        parts += got
        records += st.records
    assert [s.start for s in shards[1:]] == [s.end for s in shards[:-1]] and shards[-1].end == path.stat().st_size
    assert parts == whole and records == ws.records  # no record split, lost or read twice; ids the file's
    return whole


def test_jsonl_cut_on_line_boundaries_keeps_the_files_ids(tmp_path):
    p = tmp_path / "big.jsonl"
    lines = []
    for i in range(300):
        lines.append(json.dumps({"text": f"record {i} " + "é" * (i % 37)}))
        if i % 17 == 0:
            lines.append("   ")  # a blank line: not a record
    p.write_bytes(("\r\n".join(lines) + "\r\n").encode())
    shards = _plan(p, 1500, kind="jsonl")
    assert len(shards) > 5 and [s.index for s in shards] == list(range(len(shards)))
    whole = _check_cover(p, shards, TextFormat())
    assert [i for i, _ in whole] == list(range(300))
    assert shards[3].first_record == sum(s.records for s in shards[:3])


def test_text_with_separator_lines_cut_only_after_a_separator(tmp_path):
    p = tmp_path / "fortunes"
    blocks = [f"fortune {i}\nsecond line {'x' * (i % 50)}" for i in range(120)]
    p.write_text("\ufeff" + "\n%\n".join(blocks) + "\ntrailing block without separator\n", encoding="utf-8")
    fmt = TextFormat(record_separator_line="%")
    shards = _plan(p, 700, kind="text", separator_line="%")
    assert len(shards) > 5
    data = p.read_bytes()
    assert all(data[: s.start].endswith(b"\n%\n") for s in shards[1:])
    whole = _check_cover(p, shards, fmt)
    # the last block has no separator line after it: the reader and the plan still count it once
    assert len(whole) == 120 and whole[-1][0] == 119 and whole[-1][1].endswith("\ntrailing block without separator")


def test_text_one_record_per_line_counts_empty_lines(tmp_path):
    p = tmp_path / "lines.txt"
    p.write_text("".join(f"line {i}\n" if i % 5 else "\n" for i in range(400)))
    whole = _check_cover(p, _plan(p, 333, kind="text"), TextFormat())
    assert [i for i, _ in whole][:4] == [1, 2, 3, 4] and len(whole) == 320


def test_small_file_bare_cr_and_compressed_files_are_one_shard(tmp_path):
    p = tmp_path / "small.jsonl"
    p.write_text('{"text": "a"}\n{"text": "b"}\n')
    assert _plan(p, 10_000, kind="jsonl") == [Shard(0, 1, "bytes", 0, p.stat().st_size, 0, 2)]
    cr = tmp_path / "cr.txt"
    cr.write_bytes(b"one\rtwo\rthree\n" * 200)
    assert [(s.count, s.records) for s in _plan(cr, 100, kind="text")] == [(1, None)]
    assert not shardable("s3://b/x.jsonl.gz", "jsonl") and not shardable("x.txt", "text", "utf-16")
    assert shardable("x.jsonl", "jsonl") and shardable("x.parquet", "parquet")
    with pytest.raises(ValueError, match="target_bytes"):
        _plan(p, 0, kind="jsonl")


def test_parquet_cut_by_row_group_ranges(tmp_path):
    p = tmp_path / "big.parquet"
    n = 1000
    pq.write_table(pa.table({"text": [f"row {i}" if i % 9 else "" for i in range(n)], "id": [f"d{i}" for i in range(n)]}),
                   p, row_group_size=64)
    md = pq.ParquetFile(p).metadata
    rows = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
    sizes = [md.row_group(i).total_byte_size for i in range(md.num_row_groups)]
    shards = plan_row_group_shards(rows, sizes, sum(sizes) // 4)
    assert 3 <= len(shards) <= 5 and shards[0].start == 0 and shards[-1].end == md.num_row_groups
    assert [s.start for s in shards[1:]] == [s.end for s in shards[:-1]]
    fmt = TextFormat(id_column="id")
    whole, _ = _read(str(p), fmt)
    parts = []
    for s in shards:
        stats = ReadStats()
        for b in read_batches(str(p), fmt, 50, stats, shard=s):
            parts += list(zip(b.ids, b.texts, b.doc_ids))
        assert stats.records == s.records
    assert [(i, t) for i, t, _ in parts] == whole and all(d == f"d{i}" for i, _, d in parts)
    with pytest.raises(CorpusReadError, match="a bytes shard cannot be read from a parquet file"):
        list(read_batches(str(p), fmt, 50, ReadStats(), shard=Shard(0, 1, "bytes", 0, 10, 0, 1)))


def test_shard_keys_follow_the_source_version():
    s = Shard(2, 16, "bytes", 100, 200, 40, 10)
    k1 = shard_key("corpus__part-00017.jsonl", "size=5|mtime=1.0", s)
    assert k1 == shard_key("corpus__part-00017.jsonl", "size=5|mtime=1.0", s)
    assert k1.startswith("corpus__part-00017.jsonl-s0002of0016-") and len(k1) <= 63
    assert shard_key("corpus__part-00017.jsonl", "size=6|mtime=2.0", s) != k1
    assert len(shard_key("x" * 63, "v", s)) <= 63


def test_shard_keys_of_files_sharing_a_long_prefix_and_a_version_differ():
    s = Shard(0, 2, "bytes", 0, 10, 0, 3)
    a, b = "p" * 45 + "a.jsonl", "p" * 45 + "b.jsonl"
    assert shard_key(a, "size:5,mtime:1.0", s) != shard_key(b, "size:5,mtime:1.0", s)
    key = shard_key(a, "size:5,mtime:1.0", s)
    assert could_be_shard_key(key, a, "size:5,mtime:1.0")
    assert not could_be_shard_key(key, b, "size:5,mtime:1.0")  # same head, another file
    assert not could_be_shard_key(key, a, "size:6,mtime:2.0")  # another version
    assert not could_be_shard_key(a, a, "size:5,mtime:1.0")  # the file's own key
