"""File groups, pure logic and listing: stable buckets, a bucket's version, which files changed, the group reader
(ids per file, batches refilled across files, a bad file named), CorpusSource's options."""

from __future__ import annotations

import json
import os

import pytest

from dagster_gpu.corpus.group_reads import read_group_batches
from dagster_gpu.corpus.groups import (
    FileChanges, bucket_of, file_changes, group_key, group_version, parse_group_key, split_into_buckets,
)
from dagster_gpu.corpus.listing import CorpusNotFound, CorpusSource
from dagster_gpu.corpus.readers import CorpusReadError, ReadStats, TextFormat


def _write(d, name, texts):
    (d / name).write_text("".join(json.dumps({"text": t, "n": i}) + "\n" for i, t in enumerate(texts)))


def test_bucket_of_is_sha256_of_the_relative_path_modulo_n():
    import hashlib

    name = "docs/2024/a.json"
    expected = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % 1024
    assert bucket_of(name, 1024) == expected
    assert bucket_of(name, 1) == 0
    # spread: 4,000 names over 16 buckets, each bucket within 25 % of the mean of 250
    counts = {b: len(v) for b, v in split_into_buckets([f"doc-{i}.json" for i in range(4000)], 16).items()}
    assert len(counts) == 16 and min(counts.values()) > 187 and max(counts.values()) < 313


def test_group_keys_sort_as_numbers_and_parse_back():
    keys = [group_key(i, 1024) for i in range(1024)]
    assert keys[42] == "group-0042-of-1024" and keys == sorted(keys)
    assert group_key(7, 20000) == "group-00007-of-20000"
    assert parse_group_key("group-0042-of-1024").index == 42
    assert [parse_group_key(k) for k in ("group-42-of-1024", "group-1024-of-1024", "a.json", "group-x-of-4")] == [None] * 4
    with pytest.raises(ValueError):
        group_key(4, 4)


def test_group_version_changes_when_a_file_changes_comes_or_goes_and_not_otherwise():
    files = {f"f{i}.json": f"size:{i},mtime:1.0" for i in range(5)}
    v = group_version(files)
    assert v.startswith("group:5:") and len(v) == len("group:5:") + 32
    assert group_version(dict(reversed(list(files.items())))) == v  # order does not matter
    assert group_version(dict(files)) == v
    assert group_version({**files, "f2.json": "size:2,mtime:2.0"}) != v  # one file changed
    assert group_version({**files, "f9.json": "etag:abc"}) != v  # one came
    assert group_version({k: x for k, x in files.items() if k != "f0.json"}) != v  # one went
    # no ambiguity between a key and a version that share a boundary
    assert group_version({"a": "bc"}) != group_version({"ab": "c"})


def test_file_changes_names_changed_added_and_removed_files():
    before = {"a": "1", "b": "1", "c": "1"}
    ch = file_changes(before, {"a": "1", "b": "2", "d": "1"})
    assert ch == FileChanges(changed=("b",), added=("d",), removed=("c",))
    assert ch.count == 3 and ch.describe() == "changed: b; added: d; removed: c"
    assert file_changes(before, before).count == 0 and file_changes(before, before).describe() == "none"
    first = file_changes(None, {"b": "1", "a": "1"})
    assert first.first and first.added == ("a", "b") and first.describe() == "first materialization: 2 file(s)"
    many = file_changes({}, {f"k{i:02d}": "1" for i in range(13)})
    assert many.describe(limit=3) == "added: k00, k01, k02 … (+10)"


def test_corpus_source_validates_group_buckets(tmp_path):
    for bad in (0, -1, True, 2.5, "4"):
        with pytest.raises(ValueError, match="group_buckets must be an integer >= 1"):
            CorpusSource(url=str(tmp_path), group_buckets=bad)
    with pytest.raises(ValueError, match="group_buckets and shard_bytes cannot both be set"):
        CorpusSource(url=str(tmp_path), group_buckets=4, shard_bytes=1000)


def test_listing_groups_files_and_a_new_file_never_moves_another(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(40):
        _write(d, f"doc-{i:03d}.json", [f"text {i}"])
    corpus = CorpusSource(url=str(d), group_buckets=8)
    groups = corpus.list_files()
    assert [g.key for g in groups] == sorted(g.key for g in groups)
    assert sum(len(g.members) for g in groups) == 40 and len(groups) <= 8
    where = {}
    for g in groups:
        assert g.key == group_key(g.group.index, 8) and g.uri == str(d)
        assert [m.key for m in g.members] == sorted(m.key for m in g.members)
        assert g.size_bytes == sum(m.size_bytes for m in g.members)
        assert g.mtime == max(m.mtime for m in g.members)
        assert g.version == group_version({m.key: m.version for m in g.members})
        for m in g.members:
            assert bucket_of(m.relative_name, 8) == g.group.index and m.group is None
            where[m.key] = g.key
    # 60 new files: every old file stays in its bucket; buckets without a new file keep their version
    versions = {g.key: g.version for g in groups}
    for i in range(40, 100):
        _write(d, f"doc-{i:03d}.json", [f"text {i}"])
    later = corpus.list_files()
    for g in later:
        for m in g.members:
            if m.key in where:
                assert where[m.key] == g.key
        if all(m.key in where for m in g.members):
            assert versions[g.key] == g.version
    # files_for_keys resolves bucket keys with one listing; an unknown key is named
    some = [g.key for g in later[:2]]
    assert [f.key for f in corpus.files_for_keys(some).values()] == some
    assert corpus.file_for_key(some[0]).members == later[0].members
    with pytest.raises(CorpusNotFound, match="group-0003-of-0004.*not a key of group_buckets=8"):
        corpus.files_for_keys(["group-0003-of-0004"])
    assert corpus.files_for_keys(["group-0003-of-0004"], missing_ok=True) == {}


def test_a_bucket_version_follows_its_own_files_only(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(30):
        _write(d, f"doc-{i:03d}.json", [f"text {i}"])
    corpus = CorpusSource(url=str(d), group_buckets=4)
    before = {g.key: g for g in corpus.list_files()}
    home = {m.key: g.key for g in before.values() for m in g.members}
    _write(d, "doc-005.json", ["text 5, rewritten", "and longer"])
    later = os.path.getmtime(d / "doc-005.json") + 5
    os.utime(d / "doc-005.json", (later, later))
    (d / "doc-017.json").unlink()
    after = {g.key: g for g in corpus.list_files()}
    touched = {home["doc-005.json"], home["doc-017.json"]}
    for k, g in after.items():
        assert (g.version != before[k].version) == (k in touched), k
    assert "doc-017.json" not in after[home["doc-017.json"]].member_versions


def _group(d, names):
    corpus = CorpusSource(url=str(d), group_buckets=1)
    (g,) = corpus.list_files()
    assert [m.key for m in g.members] == sorted(names)
    return g


def test_group_reader_keeps_each_files_ids_and_refills_batches_across_files(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    sizes = {"a.json": 3, "b.json": 1, "c.json": 0, "d.json": 7, "e.json": 2}
    for name, n in sizes.items():
        _write(d, name, [f"{name} record {i}" for i in range(n)])
    (d / "d.json").write_text((d / "d.json").read_text().replace('"d.json record 2"', '"  "'))  # an empty record
    g = _group(d, list(sizes))
    fmt = TextFormat(carry_columns=("n",))
    outs = []
    for parallel, whole in ((8, 8 << 20), (1, 8 << 20), (3, 0)):  # pooled whole reads, one at a time, streamed
        stats = ReadStats()
        batches = list(read_group_batches(g.members, fmt, 4, stats, parallel_files=parallel, whole_file_bytes=whole))
        assert [len(b) for b in batches] == [4, 4, 4]  # 12 kept records, cut across files
        doc_ids = [x for b in batches for x in b.doc_ids]
        ids = [x for b in batches for x in b.ids]
        texts = [x for b in batches for x in b.texts]
        carried = [x for b in batches for x in b.columns["n"].to_pylist()]
        assert doc_ids[:5] == ["a.json/0", "a.json/1", "a.json/2", "b.json/0", "d.json/0"]
        assert "d.json/2" not in doc_ids and doc_ids[-3:] == ["d.json/6", "e.json/0", "e.json/1"]
        assert ids == [int(x.rsplit("/", 1)[1]) for x in doc_ids] == carried  # each file's own ordinals
        assert texts[3] == "b.json record 0"
        assert (stats.records, stats.skipped_empty, stats.kept) == (13, 1, 12)
        outs.append((doc_ids, texts))
    assert outs[0] == outs[1] == outs[2]


def test_group_reader_names_a_bad_file(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    _write(d, "a.json", ["fine"])
    (d / "b.json").write_text('{"text": "fine"}\n{"text": oops}\n')
    g = _group(d, ["a.json", "b.json"])
    with pytest.raises(CorpusReadError, match=r"b\.json: line 2"):
        list(read_group_batches(g.members, TextFormat(), 16, ReadStats()))


def test_group_reader_casts_carried_columns_to_the_first_files_type_or_names_the_file(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "a.json").write_text('{"text": "x", "n": null}\n')
    (d / "b.json").write_text('{"text": "y", "n": "two"}\n')
    g = _group(d, ["a.json", "b.json"])
    (batch,) = read_group_batches(g.members, TextFormat(carry_columns=("n",)), 16, ReadStats())
    assert batch.columns["n"].to_pylist() == [None, "two"]
    (d / "a.json").write_text('{"text": "x", "n": 1}\n')
    (d / "c.json").write_text('{"text": "z", "n": [1, 2]}\n')
    g = _group(d, ["a.json", "b.json", "c.json"])
    with pytest.raises(CorpusReadError, match=r"b\.json: carried column 'n'"):
        list(read_group_batches(g.members, TextFormat(carry_columns=("n",)), 16, ReadStats()))


def test_group_reader_refuses_an_id_two_files_of_the_bucket_share(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "a.json").write_text('{"id": "x1", "text": "one"}\n{"id": "x2", "text": "two"}\n')
    (d / "b.json").write_text('{"id": "x3", "text": "three"}\n{"id": "x2", "text": "again"}\n')
    g = _group(d, ["a.json", "b.json"])
    with pytest.raises(CorpusReadError, match=r"b\.json: record_id 1: id 'x2' .* also in file 'a\.json'"):
        list(read_group_batches(g.members, TextFormat(id_column="id"), 16, ReadStats()))
    (d / "b.json").write_text('{"id": "x3", "text": "three"}\n')
    (batch,) = read_group_batches(g.members, TextFormat(id_column="id"), 16, ReadStats())
    assert batch.doc_ids == ["x1", "x2", "x3"] and batch.ids == [0, 1, 0]
