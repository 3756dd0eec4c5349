"""An incremental listing of a file-grouped local corpus (``CorpusSource(full_listing_interval_seconds=...)``): after
every kind of change an atomic writer makes, it gives exactly the buckets a full listing of the same files gives,
reading only the directories whose mtime moved; a file rewritten in place waits for the next full listing; a
missing, corrupt or foreign snapshot means a full listing. Real files on a local disk."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from dataclasses import replace

import pytest

from dagster_gpu import CorpusSource
from dagster_gpu.corpus import incremental
from dagster_gpu.corpus.group_plan_store import forget_group_plans
from dagster_gpu.corpus.groups import bucket_of, group_key
from dagster_gpu.corpus.incremental import state_path

BUCKETS = 7


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    forget_group_plans()
    yield
    forget_group_plans()


def _write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"text": text}) + "\n")


def _tree(root) -> None:
    """24 documents in nested directories, plus what a listing leaves out (a ``_`` directory, a dot file, a name the
    pattern does not match) and a symbolic link to a document."""
    for i in range(24):
        _write(root / f"shelf-{i % 3}" / ("deep" if i % 2 else "") / f"doc-{i:03d}.json", f"document {i}")
    _write(root / "_staging" / "part.json", "staged")
    _write(root / ".hidden.json", "hidden")
    (root / "notes.txt").write_text("not a corpus file\n")
    os.symlink(root / "shelf-1" / "doc-004.json", root / "linked.json")


def _backdate(root) -> None:
    """Every directory's mtime a minute back, as if the tree had been written long before the listing."""
    then = time.time() - 60
    for d, _dirs, _files in os.walk(root):
        os.utime(d, (then, then))


def _summaries(groups):
    assert all(g.members == () for g in groups)
    return [(g.key, g.version, g.size_bytes, g.mtime, g.file_count) for g in groups]


def _source(tmp_path, **kw) -> CorpusSource:
    return CorpusSource(url=str(tmp_path / "corpus"), pattern="*.json", recursive=True, group_buckets=BUCKETS,
                        group_plan_url=str(tmp_path / "plans"), full_listing_interval_seconds=3600, **kw)


def _full(src: CorpusSource, tmp_path):
    """The buckets of a full listing of the same files (no snapshot, its plans elsewhere)."""
    return replace(src, full_listing_interval_seconds=None, group_plan_url=str(tmp_path / "ref")).list_files(members=False)


@pytest.fixture
def listed(tmp_path):
    """A corpus listed once in full (snapshot made) and its directories backdated: the next listing is incremental."""
    root = tmp_path / "corpus"
    _tree(root)
    _backdate(root)
    src = _source(tmp_path)
    groups, report = src.list_buckets()
    assert report.kind == "full" and report.why == "no snapshot" and report.files == 25
    assert _summaries(groups) == _summaries(_full(src, tmp_path))
    return src, root


def _replace_atomically(path, text: str) -> None:
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_text(json.dumps({"text": text}) + "\n")
    os.replace(tmp, path)


CHANGES = {
    # name: (change, relative names whose buckets change, (added, changed, removed), directories read)
    "new file": (lambda r: _write(r / "shelf-0" / "doc-new.json", "new"), ["shelf-0/doc-new.json"], (1, 0, 0), 1),
    "new subdirectory": (lambda r: [_write(r / "shelf-2" / "fresh" / "inner" / f"n{i}.json", "n") for i in range(3)],
                         [f"shelf-2/fresh/inner/n{i}.json" for i in range(3)], (3, 0, 0), 3),
    "deleted file": (lambda r: (r / "shelf-1" / "deep" / "doc-001.json").unlink(), ["shelf-1/deep/doc-001.json"],
                     (0, 0, 1), 1),
    "replaced by rename": (lambda r: _replace_atomically(r / "shelf-0" / "doc-000.json", "rewritten, longer text"),
                           ["shelf-0/doc-000.json"], (0, 1, 0), 1),
    "directory removed": (lambda r: shutil.rmtree(r / "shelf-2" / "deep"),
                          [f"shelf-2/deep/doc-{i:03d}.json" for i in range(24) if i % 3 == 2 and i % 2], (0, 0, 4), 1),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_an_incremental_listing_equals_a_full_one_after_each_change(listed, tmp_path, change, monkeypatch):
    src, root = listed
    before = {g.key: g.version for g in src.list_buckets()[0]}
    do, rels, (added, changed, removed), read = CHANGES[change]
    do(root)
    groups, report = src.list_buckets()
    assert report.kind == "incremental"
    assert (report.added, report.changed, report.removed) == (added, changed, removed)
    assert report.dirs_read == read
    assert _summaries(groups) == _summaries(_full(src, tmp_path))
    touched = {group_key(bucket_of(r, BUCKETS), BUCKETS) for r in rels}
    after = {g.key: g.version for g in groups}
    assert {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)} == touched
    assert report.buckets_assembled == len(touched)
    # the plans stored for the changed buckets are what a unit resolves them from, without a listing
    want = _full_members(src, tmp_path)
    forget_group_plans()
    monkeypatch.setattr(CorpusSource, "_list", lambda self, wanted: pytest.fail("listed instead of reading plans"))
    present = sorted(touched & after.keys())
    resolved = src.files_for_keys(present)
    for key in present:
        assert resolved[key].version == after[key]
        assert [(m.key, m.version) for m in resolved[key].members] == [(m.key, m.version) for m in want[key]]


def _full_members(src, tmp_path):
    return {g.key: g.members for g in replace(src, full_listing_interval_seconds=None,
                                              group_plan_url=str(tmp_path / "ref2")).list_files()}


def test_an_unchanged_corpus_reads_no_directory(listed):
    src, _root = listed
    first, report = src.list_buckets()
    assert report.kind == "incremental" and report.dirs_read == 0 and report.buckets_assembled == 0
    assert report.dirs_checked == 7  # the root, shelf-0..2 and their deep/ (not _staging: nothing under it is listed)
    again, report = src.list_buckets()
    assert report.dirs_read == 0 and _summaries(again) == _summaries(first)
    assert "incremental listing" in report.describe() and "0 read" in report.describe()


def test_a_directory_changed_just_before_its_read_is_read_again_next_time(listed, tmp_path):
    src, root = listed
    _write(root / "shelf-0" / "doc-new.json", "new")
    assert src.list_buckets()[1].dirs_read == 1
    groups, report = src.list_buckets()  # its mtime was too recent to trust (a coarse clock): read once more
    assert report.dirs_read == 1 and (report.added, report.changed, report.removed) == (0, 0, 0)
    then = time.time() - 60
    os.utime(root / "shelf-0", (then, then))
    assert src.list_buckets()[1].dirs_read == 1  # old enough now: read once more (the backdating moved it), then trusted
    assert src.list_buckets()[1].dirs_read == 0


def test_a_file_rewritten_in_place_waits_for_the_next_full_listing(listed, tmp_path, monkeypatch):
    src, root = listed
    before = _summaries(src.list_buckets()[0])
    with open(root / "shelf-1" / "doc-004.json", "a") as fh:  # the same directory entry: no directory mtime moves
        fh.write(json.dumps({"text": "appended"}) + "\n")
    groups, report = src.list_buckets()
    assert report.kind == "incremental" and report.dirs_read == 0
    assert _summaries(groups) == before != _summaries(_full(src, tmp_path))
    later = time.time() + 3601  # the full listing interval has passed
    monkeypatch.setattr(incremental, "_clock", lambda: later)
    groups, report = src.list_buckets()
    assert report.kind == "full" and "last full listing" in report.why
    assert _summaries(groups) == _summaries(_full(src, tmp_path))
    monkeypatch.setattr(incremental, "_clock", lambda: later + 10)
    assert src.list_buckets()[1].kind == "incremental"  # the interval counts from that full listing


@pytest.mark.parametrize("damage", ["missing", "corrupt", "foreign", "tables missing"])
def test_a_missing_corrupt_or_foreign_snapshot_means_a_full_listing(listed, tmp_path, damage):
    src, root = listed
    path = state_path(src._identity().digest)[0]
    assert os.path.exists(path)
    if damage == "missing":
        os.unlink(path)
    elif damage == "corrupt":
        with open(path, "r+b") as fh:
            fh.write(b"not a database" * 100)
    elif damage == "foreign":
        con = sqlite3.connect(path)
        con.execute("UPDATE meta SET v = '[\"/elsewhere\", \"*\", true, 7]' WHERE k = 'source'")
        con.commit()
        con.close()
    else:
        con = sqlite3.connect(path)
        con.execute("DROP TABLE files")
        con.commit()
        con.close()
    _write(root / "shelf-0" / "doc-new.json", "new")
    groups, report = src.list_buckets()
    assert report.kind == "full" and report.why
    assert _summaries(groups) == _summaries(_full(src, tmp_path))
    _backdate(root)
    assert src.list_buckets()[1].kind == "incremental"  # rebuilt


def test_without_dagster_home_or_a_writable_snapshot_directory_every_listing_is_full(listed, tmp_path, monkeypatch):
    src, root = listed
    monkeypatch.delenv("DAGSTER_HOME")
    groups, report = src.list_buckets()
    assert report.kind == "full" and "DAGSTER_HOME" in report.why
    assert _summaries(groups) == _summaries(_full(src, tmp_path))
    (tmp_path / "other" / "dagster_gpu").mkdir(parents=True)
    (tmp_path / "other" / "dagster_gpu" / "listing_state").write_text("a file where the directory goes")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "other"))
    groups, report = src.list_buckets()
    assert report.kind == "full" and "cannot be created" in report.why
    assert _summaries(groups) == _summaries(_full(src, tmp_path))


def test_a_file_name_that_is_not_utf8_means_full_listings_without_a_snapshot(listed, tmp_path):
    src, root = listed
    with open(os.path.join(os.fsencode(root / "shelf-0"), b"bad-\xff.json"), "w") as fh:
        fh.write(json.dumps({"text": "a name in Latin-1"}) + "\n")
    groups, report = src.list_buckets()
    assert report.kind == "full" and "not UTF-8" in report.why
    assert _summaries(groups) == _summaries(_full(src, tmp_path)) and report.files == 26


def test_a_flat_corpus_reads_only_its_root(tmp_path):
    root = tmp_path / "corpus"
    _tree(root)
    _write(root / "top.json", "top")
    _backdate(root)
    src = replace(_source(tmp_path), recursive=False)
    assert src.list_buckets()[1].kind == "full"
    _write(root / "shelf-0" / "ignored.json", "below the root")
    groups, report = src.list_buckets()
    assert report.kind == "incremental" and report.dirs_checked == 1 and report.dirs_read == 0
    _write(root / "top2.json", "top")
    groups, report = src.list_buckets()
    assert report.dirs_read == 1 and report.added == 1
    assert _summaries(groups) == _summaries(_full(src, tmp_path)) and sum(g.file_count for g in groups) == 3


@pytest.mark.parametrize("kw, words", [
    ({"group_buckets": None}, "needs group_buckets"),
    ({"url": "s3://bucket/docs"}, "only with append_only_keys=True"),
    ({"url": "gs://bucket/docs"}, "only a local directory"),
    ({"append_only_keys": True}, "append_only_keys applies to an S3 corpus"),
    ({"full_listing_interval_seconds": 0}, "> 0"),
    ({"full_listing_interval_seconds": 50_000}, "half of group_plan_max_age_seconds"),
])
def test_the_option_is_refused_where_it_cannot_hold(tmp_path, kw, words):
    args = {"url": str(tmp_path / "corpus"), "group_buckets": 4, "full_listing_interval_seconds": 600, **kw}
    if args["group_buckets"] is None:
        del args["group_buckets"]
    with pytest.raises(ValueError, match=words) as e:
        CorpusSource(**args)
    assert repr(args["url"]) in str(e.value)


def test_the_sensor_logs_which_listing_ran(listed, tmp_path, capfd):
    import dagster as dg

    from dagster_gpu import corpus_sensor, embedding_asset

    src, root = listed
    asset = embedding_asset(name="incr_emb", corpus=src, output_url=str(tmp_path / "out"), device="cpu")
    sensor = corpus_sensor(asset, src, bridge=False)
    defs = dg.Definitions(assets=[asset], sensors=[sensor])
    with dg.instance_for_test() as instance:  # its own DAGSTER_HOME: no snapshot there yet
        for _tick in range(2):
            sensor(dg.build_sensor_context(instance=instance, definitions=defs))
    lines = [line for line in capfd.readouterr().err.splitlines() if "listing in" in line]
    assert len(lines) == 2, lines
    assert "full listing" in lines[0] and "(no snapshot)" in lines[0] and "25 file(s) in 7 bucket(s)" in lines[0]
    assert "incremental listing" in lines[1] and "7 directories checked, 0 read" in lines[1]


@pytest.mark.parametrize("recursive", [True, False])
def test_on_s3_with_append_only_keys_a_listing_reads_only_the_keys_after_the_last_one(s3, tmp_path, monkeypatch,
                                                                                     recursive):
    endpoint, client = s3
    bucket = s3.bucket(f"dgpu-incremental-{int(recursive)}")

    def put(key: str, text: str) -> None:
        client.put_object(Bucket=bucket, Key=f"corpus/{key}", Body=(json.dumps({"text": text}) + "\n").encode())

    for i in range(20):
        put(f"2026-12-01-doc-{i:03d}.json", f"doc {i}")
    put("2026-12-01-sub/doc-sub.json", "below the prefix's top level")
    opts = {"client_kwargs": {"endpoint_url": endpoint}}
    src = CorpusSource(url=f"s3://{bucket}/corpus", pattern="*.json", recursive=recursive, group_buckets=5,
                       storage_options=opts, group_plan_url=f"s3://{bucket}/plans", full_listing_interval_seconds=3600,
                       append_only_keys=True)

    def full():
        return replace(src, full_listing_interval_seconds=None, append_only_keys=False,
                       group_plan_url=f"s3://{bucket}/ref").list_files(members=False)

    groups, report = src.list_buckets()
    assert report.kind == "full" and report.files == (21 if recursive else 20)
    assert _summaries(groups) == _summaries(full())
    groups, report = src.list_buckets()
    assert report.kind == "incremental"
    assert report.after_key == ("corpus/2026-12-01-sub/doc-sub.json" if recursive else "corpus/2026-12-01-doc-019.json")
    assert (report.added, report.buckets_assembled) == (0, 0) and _summaries(groups) == _summaries(full())
    for i in range(3):  # the next day's drop: keys after every earlier one
        put(f"2026-12-02-doc-{i:03d}.json", f"new doc {i}")
    groups, report = src.list_buckets()
    assert report.kind == "incremental" and report.added == 3 and "keys after" in report.describe()
    assert _summaries(groups) == _summaries(full())
    touched = sorted({group_key(bucket_of(f"2026-12-02-doc-{i:03d}.json", 5), 5) for i in range(3)})
    assert report.buckets_assembled == len(touched)
    forget_group_plans()
    resolved = src.files_for_keys(touched)  # from the plans this listing stored
    assert {k: f.version for k, f in resolved.items()} == {g.key: g.version for g in groups if g.key in touched}
    # what this mode cannot see until the next full listing: an earlier key, an overwritten object
    put("2026-11-30-late.json", "late")
    put("2026-12-01-doc-000.json", "overwritten")
    before = _summaries(groups)
    groups, report = src.list_buckets()
    assert report.added == 0 and _summaries(groups) == before != _summaries(full())
    later = time.time() + 3601
    monkeypatch.setattr(incremental, "_clock", lambda: later)
    groups, report = src.list_buckets()
    assert report.kind == "full" and _summaries(groups) == _summaries(full())


def test_a_missing_corpus_is_named_with_or_without_a_snapshot(listed, tmp_path):
    from dagster_gpu.corpus.listing import CorpusNotFound

    src, root = listed
    shutil.rmtree(root)
    with pytest.raises(CorpusNotFound, match="corpus"):
        src.list_buckets()
    with pytest.raises(CorpusNotFound):
        replace(src, url=str(tmp_path / "never")).list_files(members=False)


def test_two_listers_at_once_both_give_the_full_listings_buckets(listed, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    src, root = listed
    for i in range(5):
        _write(root / "shelf-1" / f"more-{i}.json", f"more {i}")
    (root / "shelf-0" / "doc-000.json").unlink()
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: src.list_buckets(), range(2)))
    want = _summaries(_full(src, tmp_path))
    assert [_summaries(g) for g, _r in results] == [want, want]
    assert sorted(r.added for _g, r in results) == [0, 5]  # one brought the snapshot up to date, then the other read it
