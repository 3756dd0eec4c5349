"""Corpus readers (text and parquet) and corpus listing."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_gpu.corpus.listing import CorpusNotFound, CorpusSource
from dagster_gpu.corpus.readers import CorpusReadError, ReadStats, TextFormat, read_batches
from dagster_gpu.core.partition_keys import partition_key_for

FORTUNE = TextFormat(format="text", record_separator_line="%")
LINES = TextFormat(format="text", record_separator_line=None)


def read_all(path, fmt, batch_rows=1000):
    stats = ReadStats()
    batches = list(read_batches(str(path), fmt, batch_rows, stats))
    ids = [i for b in batches for i in b.ids]
    texts = [t for b in batches for t in b.texts]
    return batches, ids, texts, stats


# -- plain text -----------------------------------------------------------------------------------
def test_fortune_records_with_trailing_separator(tmp_path):
    p = tmp_path / "fortunes"
    p.write_text("A penny saved.\n%\nTwo lines\n  of wisdom\n%\nLast one.\n%\n")
    _, ids, texts, stats = read_all(p, FORTUNE)
    assert texts == ["A penny saved.", "Two lines\n  of wisdom", "Last one."]
    assert ids == [0, 1, 2]
    assert (stats.records, stats.skipped_empty, stats.kept) == (3, 0, 3)


def test_fortune_records_without_trailing_separator(tmp_path):
    p = tmp_path / "fortunes"
    p.write_text("first\n%\nsecond\nstill second")  # no final newline either
    _, ids, texts, stats = read_all(p, FORTUNE)
    assert texts == ["first", "second\nstill second"]
    assert ids == [0, 1]
    assert stats.records == 2


def test_separator_must_be_the_whole_line(tmp_path):
    p = tmp_path / "fortunes"
    p.write_text("100% sure\n %\n%%\n%\nnext\n")
    _, _, texts, _ = read_all(p, FORTUNE)
    assert texts == ["100% sure\n %\n%%", "next"]


def test_crlf_lines_are_normalized(tmp_path):
    p = tmp_path / "dos"
    p.write_bytes(b"one\r\ntwo\r\n%\r\nthree\r\n%\r\n")
    _, _, texts, _ = read_all(p, FORTUNE)
    assert texts == ["one\ntwo", "three"]


def test_line_mode(tmp_path):
    p = tmp_path / "lines.txt"
    p.write_text("alpha\nbeta\n\ngamma\n")
    _, ids, texts, stats = read_all(p, LINES)
    assert texts == ["alpha", "beta", "gamma"]
    assert ids == [0, 1, 3]  # ordinal 2 is the empty line
    assert (stats.records, stats.skipped_empty) == (4, 1)


@pytest.mark.parametrize("fmt", [FORTUNE, LINES, TextFormat(), TextFormat(format="parquet")])
def test_zero_byte_file_has_no_records(tmp_path, fmt):
    p = tmp_path / "empty"
    p.write_bytes(b"")
    batches, ids, texts, stats = read_all(p, fmt)
    assert batches == [] and ids == [] and texts == []
    assert (stats.records, stats.skipped_empty) == (0, 0)


def test_whitespace_only_records_are_skipped(tmp_path):
    p = tmp_path / "blank"
    p.write_text("   \n%\n\t\n\n%\n\n%\n")
    batches, ids, texts, stats = read_all(p, FORTUNE)
    assert batches == []
    assert (stats.records, stats.skipped_empty, stats.kept) == (3, 3, 0)


def test_mixed_empty_and_normal_records(tmp_path):
    # ordinals:  0 "a"   1 ""   2 "  "   3 "b\nc"   4 ""   5 "d"
    p = tmp_path / "mixed"
    p.write_text("a\n%\n%\n  \n%\nb\nc\n%\n%\nd\n%\n")
    _, ids, texts, stats = read_all(p, FORTUNE)
    assert ids == [0, 3, 5]
    assert texts == ["a", "b\nc", "d"]
    assert (stats.records, stats.skipped_empty, stats.kept) == (6, 3, 3)


def test_batches_respect_batch_rows(tmp_path):
    p = tmp_path / "many"
    # 23 records, every 5th (ordinal 0, 5, 10, 15, 20) blank: 18 kept
    p.write_text("".join(("\n" if i % 5 == 0 else f"rec {i}\n") for i in range(23)))
    batches, ids, texts, stats = read_all(p, LINES, batch_rows=4)
    assert [len(b) for b in batches] == [4, 4, 4, 4, 2]
    assert all(len(b.ids) == len(b.texts) for b in batches)
    assert ids == [i for i in range(23) if i % 5]
    assert texts == [f"rec {i}" for i in range(23) if i % 5]
    assert (stats.records, stats.skipped_empty) == (23, 5)


def test_batch_rows_must_be_positive(tmp_path):
    p = tmp_path / "x"
    p.write_text("x\n")
    with pytest.raises(ValueError, match="batch_rows"):
        list(read_batches(str(p), LINES, 0, ReadStats()))


def test_a_utf8_byte_order_mark_is_not_part_of_the_first_record(tmp_path):
    """Found by a new-user run: the first record kept U+FEFF, so its text_sha256 differed from the same text
    saved without the mark."""
    p = tmp_path / "bom.txt"
    p.write_bytes(b"\xef\xbb\xbfbom line\nsecond\n")
    assert read_all(p, LINES)[2] == ["bom line", "second"]
    q = tmp_path / "mid.txt"  # only a leading mark is dropped: U+FEFF inside the text stays
    q.write_bytes(b"a\xef\xbb\xbfb\n")
    assert read_all(q, LINES)[2] == ["a\ufeffb"]


def test_bad_utf8_names_the_file(tmp_path):
    p = tmp_path / "latin1 file"
    p.write_bytes("caf\u00e9\n%\n".encode("latin-1"))
    with pytest.raises(CorpusReadError) as e:
        read_all(p, FORTUNE)
    assert str(e.value).startswith(f"{p}: line 1 (record_id 0) is not valid utf-8 text: byte 0xe9 at column 4;")


def test_bad_utf8_names_the_line_and_record_far_into_the_file(tmp_path):
    # the decoder reads 8 KiB chunks: the error must still name the record's own line, not "near line 1"
    p = tmp_path / "big.txt"
    body = "".join(f"fortune number {i}\n%\n" for i in range(2000))  # 4000 lines, ~48 KB
    p.write_bytes(body.encode() + "caf\u00e9 cr\u00e8me\n%\nlast\n".encode("latin-1"))
    with pytest.raises(CorpusReadError) as e:
        read_all(p, FORTUNE)
    assert str(e.value).startswith(f"{p}: line 4001 (record_id 2000) is not valid utf-8 text: byte 0xe9 at column 4;")


@pytest.mark.parametrize(
    "policy, texts, ids, replaced, skipped",
    [
        ("replace", ["first", "caf\ufffd\nand cr\ufffdme", "last"], [0, 1, 2], 1, 0),
        ("skip", ["first", "last"], [0, 2], 0, 1),
    ],
)
def test_text_decode_errors_policy(tmp_path, policy, texts, ids, replaced, skipped):
    p = tmp_path / "fortunes"
    p.write_bytes(b"first\n%\ncaf\xe9\nand cr\xe8me\n%\nlast\n%\n")
    fmt = TextFormat(format="text", record_separator_line="%", decode_errors=policy)
    _, got_ids, got_texts, stats = read_all(p, fmt)
    assert (got_texts, got_ids) == (texts, ids)
    assert (stats.records, stats.replaced_rows, stats.skipped_undecodable_rows, stats.kept) == (3, replaced, skipped, 3 - skipped)


def test_text_strict_names_the_first_bad_line_of_a_multi_line_record(tmp_path):
    p = tmp_path / "fortunes"
    p.write_bytes(b"ok\n%\nfine line\nbad \xff\xfe\nworse \xc3\n%\n")
    with pytest.raises(CorpusReadError, match=r": line 4 \(record_id 1\) is not valid utf-8 text: bytes 0xff 0xfe at column 5;"):
        read_all(p, FORTUNE)


def test_undecodable_bytes_in_another_encoding(tmp_path):
    # UTF-16-LE with a lone high surrogate on line 2: the same handler finds it, whatever the codec
    p = tmp_path / "u16.txt"
    p.write_bytes("one\n".encode("utf-16-le") + b"t\x00\x00\xd8o\x00\n\x00")
    fmt = TextFormat(format="text", encoding="utf-16-le")
    with pytest.raises(CorpusReadError, match=r": line 2 \(record_id 1\) is not valid utf-16-le text: bytes 0x00 0xd8 at column 2;"):
        read_all(p, fmt)
    _, _, texts, stats = read_all(p, TextFormat(format="text", encoding="utf-16-le", decode_errors="replace"))
    assert texts == ["one", "t\ufffdo"] and stats.replaced_rows == 1


def test_unknown_encoding_names_the_file(tmp_path):
    p = tmp_path / "x.txt"
    p.write_text("x\n")
    with pytest.raises(CorpusReadError, match=r"x.txt: unknown text encoding 'klingon'"):
        read_all(p, TextFormat(format="text", encoding="klingon"))


def test_decode_errors_must_be_known():
    with pytest.raises(ValueError, match=r"decode_errors must be one of strict, replace, skip, got 'ignore'"):
        TextFormat(decode_errors="ignore")


def test_unknown_format_names_the_file(tmp_path):
    p = tmp_path / "x"
    p.write_text("x\n")
    with pytest.raises(CorpusReadError, match=r"x: unknown corpus format 'csv'"):
        read_all(p, TextFormat(format="csv"))


# -- parquet --------------------------------------------------------------------------------------
def test_parquet_text_column_with_nulls_and_empties(tmp_path):
    p = tmp_path / "docs.parquet"
    table = pa.table({"id": list(range(6)), "body": ["one", None, "", "two", "   ", "three"]})
    pq.write_table(table, p, row_group_size=2)
    batches, ids, texts, stats = read_all(p, TextFormat(text_column="body"), batch_rows=2)
    assert texts == ["one", "two", "three"]
    assert ids == [0, 3, 5]
    assert [len(b) for b in batches] == [2, 1]
    assert (stats.records, stats.skipped_empty) == (6, 3)


def test_parquet_large_string_column(tmp_path):
    p = tmp_path / "large.parquet"
    pq.write_table(pa.table({"text": pa.array(["x", "y"], pa.large_string())}), p)
    _, ids, texts, _ = read_all(p, TextFormat())
    assert (ids, texts) == ([0, 1], ["x", "y"])


def test_parquet_missing_column_names_file_and_column(tmp_path):
    p = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"body": ["a"]}), p)
    with pytest.raises(CorpusReadError) as e:
        read_all(p, TextFormat(text_column="text"))
    msg = str(e.value)
    assert str(p) in msg and "'text'" in msg and "body" in msg


def test_parquet_non_string_column(tmp_path):
    p = tmp_path / "nums.parquet"
    pq.write_table(pa.table({"text": [1, 2, 3]}), p)
    with pytest.raises(CorpusReadError) as e:
        read_all(p, TextFormat())
    assert str(p) in str(e.value) and "int64" in str(e.value) and "expected string" in str(e.value)


def test_invalid_parquet_file(tmp_path):
    p = tmp_path / "broken.parquet"
    p.write_bytes(b"this is not parquet at all, just text\n")
    with pytest.raises(CorpusReadError) as e:
        read_all(p, TextFormat())
    assert str(p) in str(e.value) and "parquet" in str(e.value)


def test_zero_byte_parquet_has_no_rows(tmp_path):
    p = tmp_path / "empty.parquet"
    p.write_bytes(b"")
    batches, _, _, stats = read_all(p, TextFormat())
    assert batches == [] and stats.records == 0


def test_parquet_with_zero_rows(tmp_path):
    p = tmp_path / "norows.parquet"
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), p)
    batches, _, _, stats = read_all(p, TextFormat())
    assert batches == [] and stats.records == 0


# -- listing --------------------------------------------------------------------------------------
WEIRD_NAMES = [
    "plain",
    "with space.txt",
    "quote's \"both\".txt",
    "$(rm -rf ~).txt",
    "日本語.txt",
    "new\nline.txt",
]


@pytest.fixture
def corpus_dir(tmp_path) -> Path:
    d = tmp_path / "corpus dir"
    d.mkdir()
    for i, name in enumerate(WEIRD_NAMES):
        (d / name).write_text("x" * (i + 1))
    (d / ".hidden").write_text("h")
    (d / "_tmp-output").write_text("t")
    (d / "sub").mkdir()
    (d / "sub" / "nested.txt").write_text("n")
    return d


def test_list_files_with_unsafe_names(corpus_dir):
    files = CorpusSource(str(corpus_dir)).list_files()
    by_rel = {f.relative_name: f for f in files}
    assert set(by_rel) == set(WEIRD_NAMES)  # no hidden, no _tmp, not recursive
    assert [f.key for f in files] == sorted(f.key for f in files)
    for i, name in enumerate(WEIRD_NAMES):
        f = by_rel[name]
        assert f.key == partition_key_for(name)
        assert f.uri == str(corpus_dir / name)
        assert Path(f.uri).read_text() == "x" * (i + 1)
        assert f.size_bytes == i + 1
        assert f.mtime > 0
    assert by_rel["plain"].key == "plain"
    assert by_rel["new\nline.txt"].key.startswith("new_line.txt-")
    assert len({f.key for f in files}) == len(WEIRD_NAMES)


def test_list_files_follows_symbolic_links_to_files(tmp_path):
    """Found by a new-user run: links were left out of the listing (fsspec reports them as ``other``) while
    a key lookup resolved them, so the sensor never added them and --prune would have removed them."""
    (tmp_path / "target.txt").write_text("one\ntwo\n")
    (tmp_path / "elsewhere").mkdir()
    c = tmp_path / "c"
    c.mkdir()
    (c / "plain.txt").write_text("x\n")
    (c / "link.txt").symlink_to(tmp_path / "target.txt")
    (c / "dirlink").symlink_to(tmp_path / "elsewhere")
    (c / "broken.txt").symlink_to(tmp_path / "nonexistent")
    files = CorpusSource(str(c)).list_files()
    assert [(f.key, f.size_bytes) for f in files] == [("link.txt", 8), ("plain.txt", 2)]
    assert CorpusSource(str(c)).file_for_key("link.txt") == files[0]


def test_list_files_recursive(corpus_dir):
    files = CorpusSource(str(corpus_dir), recursive=True).list_files()
    rels = {f.relative_name for f in files}
    assert rels == set(WEIRD_NAMES) | {"sub/nested.txt"}
    nested = next(f for f in files if f.relative_name == "sub/nested.txt")
    assert nested.key == "sub__nested.txt"


def test_list_files_pattern(corpus_dir):
    files = CorpusSource(str(corpus_dir), pattern="*.txt").list_files()
    assert {f.relative_name for f in files} == set(WEIRD_NAMES) - {"plain"}
    assert CorpusSource(str(corpus_dir), pattern="*.parquet").list_files() == []


def test_file_for_key(corpus_dir):
    src = CorpusSource(str(corpus_dir))
    key = partition_key_for("$(rm -rf ~).txt")
    assert src.file_for_key(key).relative_name == "$(rm -rf ~).txt"
    with pytest.raises(CorpusNotFound) as e:
        src.file_for_key("gone")
    assert "'gone'" in str(e.value) and str(corpus_dir) in str(e.value)


def test_missing_corpus(tmp_path):
    with pytest.raises(CorpusNotFound, match="does-not-exist"):
        CorpusSource(str(tmp_path / "does-not-exist")).list_files()


def test_recursive_listing_keeps_nested_and_flat_lookalikes(tmp_path):
    # sub/x and a flat file named sub__x would both be "sub__x" if the join were not made unambiguous
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x").write_text("nested")
    (tmp_path / "sub__x").write_text("flat")
    files = CorpusSource(str(tmp_path), recursive=True).list_files()
    assert sorted(f.relative_name for f in files) == ["sub/x", "sub__x"]
    by_rel = {f.relative_name: f.key for f in files}
    assert by_rel["sub/x"] == "sub__x"
    assert by_rel["sub__x"].startswith("sub__x-") and len(by_rel["sub__x"]) == len("sub__x-") + 8


# -- parquet with invalid UTF-8 (pyarrow does not validate strings on read) ---------------------------
def bad_utf8_parquet(path, values, large=False, row_group_size=None):
    """A parquet file whose string column ``text`` holds ``values`` (bytes) as they are, valid UTF-8 or not."""
    arr = pa.array(values, type=pa.large_binary() if large else pa.binary())
    arr = arr.view(pa.large_string() if large else pa.string())
    pq.write_table(pa.table({"text": arr}), path, row_group_size=row_group_size)
    return path


PARQUET = TextFormat(format="parquet")


@pytest.mark.parametrize("large", [False, True])
def test_parquet_invalid_utf8_names_file_and_row(tmp_path, large):
    p = bad_utf8_parquet(tmp_path / "docs.parquet", [b"hello", b"he\xffllo world", b"bye"], large=large)
    with pytest.raises(CorpusReadError) as e:
        read_all(p, PARQUET)
    assert str(e.value).startswith(f"{p}: row 1 (record_id 1) is not valid UTF-8 text: byte 0xff at character 3;")


@pytest.mark.parametrize(
    "policy, texts, ids, replaced, skipped",
    [("replace", ["hello", "he\ufffdllo world", "bye"], [0, 1, 2], 1, 0), ("skip", ["hello", "bye"], [0, 2], 0, 1)],
)
def test_parquet_decode_errors_policy(tmp_path, policy, texts, ids, replaced, skipped):
    p = bad_utf8_parquet(tmp_path / "docs.parquet", [b"hello", b"he\xffllo world", b"bye"])
    _, got_ids, got_texts, stats = read_all(p, TextFormat(format="parquet", decode_errors=policy))
    assert (got_texts, got_ids) == (texts, ids)
    assert (stats.records, stats.replaced_rows, stats.skipped_undecodable_rows, stats.kept) == (3, replaced, skipped, 3 - skipped)


def test_parquet_invalid_utf8_row_counts_across_row_groups_and_batches(tmp_path):
    values = [f"row {i}".encode() for i in range(10)]
    values[7] = b"row \xc3\x28 seven"  # an invalid 2-byte sequence: only 0xc3 is bad, "(" decodes
    values[3] = None
    p = bad_utf8_parquet(tmp_path / "docs.parquet", values, row_group_size=4)
    with pytest.raises(CorpusReadError, match=r"docs.parquet: row 7 \(record_id 7\) is not valid UTF-8 text: byte 0xc3 at character 5;"):
        read_all(p, PARQUET, batch_rows=3)
    _, ids, texts, stats = read_all(p, TextFormat(format="parquet", decode_errors="replace"), batch_rows=3)
    assert ids == [0, 1, 2, 4, 5, 6, 7, 8, 9] and texts[6] == "row \ufffd( seven"
    assert (stats.records, stats.skipped_empty, stats.replaced_rows) == (10, 1, 1)


def test_a_corpus_store_that_answers_with_an_error_fails_each_partition_naming_the_corpus(monkeypatch):
    from dagster_gpu.corpus.listing import CorpusUnreadable
    from dagster_gpu.worker.unit import UnitOutcome, _resolve

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    corpus = CorpusSource(url="s3://corp/corpus", storage_options={
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},  # nothing listens on the discard port
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2}})
    with pytest.raises(CorpusUnreadable, match=r"^corpus 's3://corp/corpus' cannot be read: EndpointConnectionError"):
        corpus.file_for_key("a.txt")
    outcome = UnitOutcome()
    assert _resolve(corpus, ["a.txt", "b.txt"], outcome) == {}
    assert sorted(outcome.failed) == ["a.txt", "b.txt"]
    assert outcome.failed["b.txt"].startswith("partition 'b.txt': corpus 's3://corp/corpus' cannot be read: EndpointConnectionError")
