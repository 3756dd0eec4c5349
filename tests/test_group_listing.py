"""A file-grouped corpus listed in bounded memory (``list_files(members=False)``): the entries stream (an S3 page or a
directory at a time), the files spill to disk by bucket, and the buckets, group versions and stored plans are exactly
those of the listing that holds every file. Real files on a local disk and on moto's S3 server."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace

import pytest

from dagster_gpu import CorpusSource
from dagster_gpu.corpus.bucket_spill import by_bucket
from dagster_gpu.corpus.group_plan_store import forget_group_plans
from dagster_gpu.corpus.listing import CorpusNotFound, CorpusUnreadable
from dagster_gpu.corpus.stream import iter_entries


@pytest.fixture(autouse=True)
def _fresh_plans(monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    forget_group_plans()
    yield
    forget_group_plans()


def _tree(root, files: int = 60) -> None:
    """``files`` JSON documents in nested directories, plus what a listing leaves out: a dot file, a ``_``
    directory, a name the pattern does not match; and a symbolic link to a document (listed as that file)."""
    for i in range(files):
        d = root / f"shelf-{i % 4}" / ("deep" if i % 3 == 0 else "")
        d.mkdir(parents=True, exist_ok=True)
        (d / f"doc {i:03d}.json").write_text(json.dumps({"text": f"document {i}"}) + "\n")
    (root / ".hidden.json").write_text("{}\n")
    (root / "_staging").mkdir()
    (root / "_staging" / "part.json").write_text("{}\n")
    (root / "notes.txt").write_text("not a corpus file\n")
    os.symlink(root / "shelf-1" / "doc 001.json", root / "linked.json")


def _summaries(groups):
    return [(g.key, g.version, g.size_bytes, g.mtime, g.file_count) for g in groups]


@pytest.mark.parametrize("recursive", [True, False])
def test_a_streamed_listing_gives_the_buckets_versions_and_plans_of_the_full_one(tmp_path, recursive):
    root = tmp_path / "corpus"
    root.mkdir()
    _tree(root)
    streamed = CorpusSource(url=str(root), pattern="*.json", recursive=recursive, group_buckets=7,
                            group_plan_url=str(tmp_path / "plans"))
    full = replace(streamed, group_plan_url=str(tmp_path / "ref"))
    got, want = streamed.list_files(members=False), full.list_files()
    assert _summaries(got) == _summaries(want)
    assert sum(g.file_count for g in got) == (61 if recursive else 1)  # 60 documents + the link; nothing hidden
    assert all(g.members == () for g in got) and all(len(g.members) == g.file_count for g in want)
    # the plans it stored are what a unit resolves its buckets from: the same members, no listing
    forget_group_plans()
    resolved = streamed.files_for_keys([g.key for g in got])
    assert {k: [(m.key, m.version) for m in f.members] for k, f in resolved.items()} == \
        {g.key: [(m.key, m.version) for m in g.members] for g in want}


def test_the_spill_gives_each_bucket_whole_once_one_spill_file_at_a_time(tmp_path, monkeypatch):
    (tmp_path / "t").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "t"))  # this test's spill directories only
    rows = [(i % 10, [f"k{i:03d}", i]) for i in range(95)]
    seen_dirs = []

    def watched():
        yield from rows
        seen_dirs.extend(n for n in os.listdir(tempfile.gettempdir()) if n.startswith("dagster-gpu-spill-"))

    out = list(by_bucket(watched(), buckets=10, shards=3))
    assert len(out) == 3  # one dict per spill file
    assert [sorted(d) for d in out] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]  # whole buckets, bucket % 3
    assert {b: rs for d in out for b, rs in d.items()} == {b: [r for bb, r in rows if bb == b] for b in range(10)}
    assert len(seen_dirs) == 1 and os.listdir(tmp_path / "t") == []  # it existed while the rows were read, then went
    assert len(list(by_bucket(iter([(0, ["a"])]), buckets=1, shards=64))) == 1  # never more files than buckets

    def failing():
        yield (1, ["x"])
        raise OSError("listing cut off")

    with pytest.raises(OSError, match="cut off"):
        list(by_bucket(failing(), buckets=4))
    assert os.listdir(tmp_path / "t") == []


def test_a_missing_corpus_and_a_refusing_store_are_named(tmp_path, s3):
    with pytest.raises(CorpusNotFound, match="nowhere"):
        CorpusSource(url=str(tmp_path / "nowhere"), group_buckets=4).list_files(members=False)
    endpoint, _client = s3
    bad = CorpusSource(url="s3://no-such-bucket-dgpu/corpus", group_buckets=4,
                       storage_options={"client_kwargs": {"endpoint_url": endpoint}})
    with pytest.raises((CorpusNotFound, CorpusUnreadable), match="no-such-bucket-dgpu"):
        bad.list_files(members=False)


@pytest.mark.parametrize("recursive", [True, False])
def test_on_s3_the_stream_reads_page_by_page_what_find_lists(s3, recursive):
    endpoint, client = s3
    bucket = s3.bucket(f"dgpu-group-listing-{int(recursive)}")
    for i in range(45):
        key = f"corpus/{'sub/' if i % 5 == 0 else ''}doc-{i:03d}.json"
        client.put_object(Bucket=bucket, Key=key, Body=json.dumps({"text": f"doc {i}"}).encode())
    client.put_object(Bucket=bucket, Key="corpus-other/doc.json", Body=b"{}")  # a sibling prefix, never listed
    opts = {"client_kwargs": {"endpoint_url": endpoint}}
    src = CorpusSource(url=f"s3://{bucket}/corpus", recursive=recursive, group_buckets=5, storage_options=opts,
                       group_plan_url=f"s3://{bucket}/plans")
    fs, root = src.filesystem()
    fs.invalidate_cache()
    found = fs.find(root, maxdepth=None if recursive else 1, detail=True, withdirs=False)
    streamed = dict(iter_entries(fs, root, recursive, page_items=7))  # 7 entries per trip into s3fs's loop
    assert sorted(streamed) == sorted(found) and len(streamed) == (45 if recursive else 36)
    assert all(streamed[p]["ETag"] == found[p]["ETag"] and streamed[p]["size"] == found[p]["size"] for p in found)
    ref = replace(src, group_plan_url=f"s3://{bucket}/ref")
    assert _summaries(src.list_files(members=False)) == _summaries(ref.list_files())


def test_the_sensor_lists_without_members_and_records_each_buckets_file_count(tmp_path):
    from dagster_gpu.partitions.source_versions import corpus_updates
    import dagster as dg

    root = tmp_path / "corpus"
    root.mkdir()
    _tree(root, files=20)
    groups = CorpusSource(url=str(root), recursive=True, group_buckets=3).list_files(members=False)
    events = corpus_updates(dg.AssetKey("corpus"), groups, {})
    counts = {e.partition: e.metadata["corpus/files"].value for e in events if isinstance(e, dg.AssetObservation)}
    assert counts == {g.key: g.file_count for g in groups} and sum(counts.values()) == 22  # + the link and notes.txt
