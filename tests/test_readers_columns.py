"""Corpus readers: doc ids from the corpus's id column, carried columns, JSON Lines (plain and gzip)."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_gpu.corpus.readers import CorpusReadError, ReadStats, TextFormat, read_batches


def read_all(path, fmt, batch_rows=1000):
    stats = ReadStats()
    batches = list(read_batches(str(path), fmt, batch_rows, stats))
    return batches, stats


def write_jsonl(path, rows, compress=False):
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


DOCS = [
    {"id": "gpl-3", "title": "GNU GPL v3", "year": 2007, "text": "Everyone is permitted to copy."},
    {"id": "empty", "title": "nothing", "year": 1, "text": "   "},
    {"id": "mit", "title": "MIT", "year": None, "text": "Permission is hereby granted."},
    {"id": 42, "title": "numbered", "year": 1999, "text": "An integer id."},
]


@pytest.mark.parametrize("name,compress", [("docs.jsonl", False), ("docs.jsonl.gz", True), ("docs.json.gz", True),
                                           ("docs.ndjson", False)])
def test_jsonl_ids_and_carried_columns(tmp_path, name, compress):
    p = write_jsonl(tmp_path / name, DOCS, compress)
    fmt = TextFormat(id_column="id", carry_columns=["title", "year"])
    assert fmt.resolved(str(p)) == "jsonl"
    batches, stats = read_all(p, fmt, batch_rows=2)
    assert [b.ids for b in batches] == [[0, 2], [3]]
    assert [t for b in batches for t in b.texts] == [DOCS[0]["text"], DOCS[2]["text"], DOCS[3]["text"]]
    assert [d for b in batches for d in b.doc_ids] == ["gpl-3", "mit", "42"]
    assert batches[0].columns["title"].to_pylist() == ["GNU GPL v3", "MIT"]
    assert batches[0].columns["year"].to_pylist() == [2007, None]
    assert batches[1].columns["year"].type == pa.int64()  # the type of the first batch, kept
    assert (stats.records, stats.skipped_empty, stats.kept) == (4, 1, 3)
    assert stats.carried_types == {"title": pa.string(), "year": pa.int64()}


def test_jsonl_blank_lines_are_not_records_and_missing_text_is_empty(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "a"}\n\n{"other": 1}\n{"text": null}\n{"text": "b"}\n')
    batches, stats = read_all(p, TextFormat())
    assert batches[0].ids == [0, 3] and batches[0].texts == ["a", "b"] and batches[0].doc_ids is None
    assert (stats.records, stats.skipped_empty) == (4, 2)


def test_gzip_text_corpus(tmp_path):
    p = tmp_path / "fortunes.txt.gz"
    p.write_bytes(gzip.compress(b"one\n%\ntwo\n%\n"))
    fmt = TextFormat(record_separator_line="%")
    assert fmt.resolved(str(p)) == "text"
    batches, _ = read_all(p, fmt)
    assert batches[0].texts == ["one", "two"]


@pytest.mark.parametrize("line,match", [
    ('{"id": "a", "text": 5}', r"d.jsonl: line 2: field 'text' is a int, expected a string"),
    ('{"id": "a", "text": "x"', r"d.jsonl: line 2 is not valid JSON"),
    ('["a", "b"]', r"d.jsonl: line 2 is a JSON list, expected an object"),
    ('{"text": "x", "title": "t"}', r"d.jsonl: line 2 \(record_id 1\) has no id: column 'id' is missing"),
    ('{"id": null, "text": "x", "title": "t"}', r"d.jsonl: line 2 \(record_id 1\) has no id: column 'id' is null"),
    ('{"id": "a", "text": "x"}', r"d.jsonl: line 2 has no field 'title' \(carry_columns"),
    ('{"id": "a", "text": "again", "title": "t"}',
     r"d.jsonl: line 2 \(record_id 1\): id 'a' in column 'id' is duplicated \(first at record_id 0\)"),
    ('{"id": [1], "text": "x", "title": "t"}', r"d.jsonl: line 2 \(record_id 1\): id column 'id' holds list"),
])
def test_jsonl_bad_input_names_file_and_line(tmp_path, line, match):
    p = tmp_path / "d.jsonl"
    p.write_text('{"id": "a", "text": "first", "title": "t"}\n' + line + "\n")
    with pytest.raises(CorpusReadError, match=match):
        read_all(p, TextFormat(id_column="id", carry_columns=["title"]))


def test_jsonl_carried_value_of_another_type_names_the_column(tmp_path):
    p = write_jsonl(tmp_path / "d.jsonl", [{"text": "a", "n": 1}, {"text": "b", "n": "two"}])
    with pytest.raises(CorpusReadError, match=r"d.jsonl: carried column 'n': values do not convert to int64"):
        read_all(p, TextFormat(carry_columns=["n"]), batch_rows=1)


def test_jsonl_undecodable_bytes_follow_decode_errors(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(CorpusReadError, match=r"d.jsonl: line 2 \(record_id 1\) is not valid UTF-8 text: byte 0xe9"):
        read_all(p, TextFormat())
    batches, stats = read_all(p, TextFormat(decode_errors="replace"))
    assert batches[0].texts == ["ok", "caf\ufffd"] and stats.replaced_rows == 1


def test_parquet_ids_and_carried_columns_keep_their_arrow_types(tmp_path):
    p = tmp_path / "docs.parquet"
    ts = pa.array([0, 1_000_000, 2_000_000], pa.timestamp("us", tz="UTC"))
    table = pa.table({
        "url": ["u0", "u1", "u2"], "body": ["zero", None, "two"], "published": ts,
        "tags": pa.array([["a"], [], ["b", "c"]], pa.list_(pa.string())),
        "score": pa.array([1.5, 2.5, 3.5], pa.float32()),
    })
    pq.write_table(table, p, row_group_size=2)
    fmt = TextFormat(text_column="body", id_column="url", carry_columns=("published", "tags", "score"))
    batches, stats = read_all(p, fmt)
    (b,) = batches
    assert b.ids == [0, 2] and b.doc_ids == ["u0", "u2"] and b.texts == ["zero", "two"]
    assert b.columns["published"].type == pa.timestamp("us", tz="UTC")
    assert b.columns["published"].to_pylist() == ts.take([0, 2]).to_pylist()
    assert b.columns["tags"].type == pa.list_(pa.string()) and b.columns["tags"].to_pylist() == [["a"], ["b", "c"]]
    assert b.columns["score"].type == pa.float32()
    assert stats.carried_types["score"] == pa.float32()


def test_parquet_integer_ids_become_strings(tmp_path):
    p = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"id": pa.array([7, 9], pa.int32()), "text": ["a", "b"]}), p)
    (b,), _ = read_all(p, TextFormat(id_column="id"))
    assert b.doc_ids == ["7", "9"]


@pytest.mark.parametrize("fmt,match", [
    (TextFormat(id_column="uid"), r"docs.parquet: no column 'uid' \(id_column; columns: id, text, title\)"),
    (TextFormat(carry_columns=["url"]), r"docs.parquet: no column 'url' \(carry_columns; columns: id, text, title\)"),
    (TextFormat(id_column="title"), r"docs.parquet: row 2 \(record_id 2\): id 'same' in column 'title' is duplicated \(first at record_id 1\)"),
])
def test_parquet_bad_columns_name_the_file(tmp_path, fmt, match):
    p = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["a", "b", "c"], "title": ["x", "same", "same"]}), p)
    with pytest.raises(CorpusReadError, match=match):
        read_all(p, fmt)


def test_parquet_float_id_column_is_refused(tmp_path):
    p = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"id": [1.0], "text": ["a"]}), p)
    with pytest.raises(CorpusReadError, match=r"docs.parquet: id column 'id' has type double, expected string or integer"):
        read_all(p, TextFormat(id_column="id"))


def test_duplicate_id_of_an_empty_record_is_not_an_error(tmp_path):
    """Empty records are not embedded: their ids are never output, so they cannot collide."""
    p = write_jsonl(tmp_path / "d.jsonl", [{"id": "a", "text": ""}, {"id": "a", "text": "x"}])
    (b,), _ = read_all(p, TextFormat(id_column="id"))
    assert b.doc_ids == ["a"]


def test_text_files_have_no_columns(tmp_path):
    p = tmp_path / "lines.txt"
    p.write_text("a\n")
    with pytest.raises(CorpusReadError, match=r"lines.txt: id_column / carry_columns need a parquet or JSON Lines corpus"):
        read_all(p, TextFormat(id_column="id"))


def test_columns_on_text_files_are_refused_at_definition_time():
    """What can be known before any file is read: a format or a pattern that reads text, with columns asked for."""
    from dagster_gpu import CorpusSource

    with pytest.raises(ValueError, match=r"TextFormat: id_column / carry_columns need a parquet or JSON Lines corpus, "
                                         r"and format 'text' has no columns"):
        TextFormat(format="text", carry_columns=["package"])
    cols = TextFormat(id_column="id", carry_columns=["package"])
    with pytest.raises(ValueError, match=r"CorpusSource\('/c'\): pattern '\*.txt' matches text files .* need parquet or JSON Lines"):
        CorpusSource(url="/c", pattern="*.txt", text_format=cols)
    with pytest.raises(ValueError, match=r"pattern 'docs/\*changelog.gz' matches text files"):
        CorpusSource(url="/c", pattern="docs/*changelog.gz", text_format=cols)  # compression suffix, then text
    for ok in ("*", "*.jsonl", "*.json*", "*.parquet", "*.jsonl.gz"):  # JSON Lines, parquet, or not known before listing
        CorpusSource(url="/c", pattern=ok, text_format=cols)
    CorpusSource(url="/c", pattern="*.txt", text_format=TextFormat())  # no columns: text is fine
    # a listing: the files that would be read as text, for the backfill to refuse before any unit starts
    assert cols.columnless(["/c/a.jsonl", "/c/copyright", "/c/b.txt.gz", "/c/d.parquet"]) == ["/c/copyright", "/c/b.txt.gz"]
    assert TextFormat().columnless(["/c/copyright"]) == []


@pytest.mark.parametrize("kw,match", [
    ({"carry_columns": "title"}, "must be a list of column names"),
    ({"carry_columns": ["vector"]}, r"collide with output columns"),
    ({"carry_columns": ["text"]}, r"'text' is the text column"),
    ({"carry_columns": ["a", "a"]}, "duplicates"),
])
def test_carry_columns_are_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        TextFormat(**kw)


def test_empty_jsonl_file_carried_types_default_to_string(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text("\n\n")
    stats = ReadStats()
    assert list(read_batches(str(p), TextFormat(carry_columns=["title"]), 10, stats)) == []
    assert stats.carried_types == {"title": pa.string()} and stats.records == 0
