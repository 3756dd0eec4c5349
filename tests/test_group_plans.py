"""File group plans: a unit resolves its bucket keys from the member lists the last full listing stored, checking
each member with one ``info`` call, without listing the corpus; anything that does not hold (a member changed or
gone, a plan missing, corrupt or of another group version) falls back to the full listing and gives its result.
Real files on a local disk and on moto's S3 server; the listings are counted on the fsspec filesystems."""

from __future__ import annotations

import json
import os
import time
from collections import Counter

import pytest
from fsspec.implementations.local import LocalFileSystem

from dagster_gpu import CorpusSource
from dagster_gpu.corpus.group_plan_store import forget_group_plans
from dagster_gpu.corpus.group_plans import (Member, PlanSource, plan_doc, plan_members, plan_name, planned_version,
                                            pointer_doc, pointer_name, replaces)
from dagster_gpu.corpus.groups import group_version

N_FILES, BUCKETS = 40, 4


@pytest.fixture()
def calls(monkeypatch):
    """Counts of the filesystems' listing and ``info`` calls (fsspec's own methods wrapped, then called)."""
    seen: Counter = Counter()

    def counting(cls, name):
        real = getattr(cls, name)

        def wrapper(self, *a, **kw):
            seen[name] += 1
            return real(self, *a, **kw)

        monkeypatch.setattr(cls, name, wrapper)

    for name in ("find", "ls", "info"):
        counting(LocalFileSystem, name)
    forget_group_plans()
    yield seen
    forget_group_plans()


def _write(d, i: int, text: str = "") -> None:
    (d / f"doc-{i:03d}.json").write_text(json.dumps({"text": text or f"document {i}"}) + "\n")


@pytest.fixture()
def corpus(tmp_path, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(N_FILES):
        _write(d, i)
    return CorpusSource(url=str(d), group_buckets=BUCKETS, group_plan_url=str(tmp_path / "plans"))


def _reference(corpus: CorpusSource, tmp_path) -> dict:
    """What a full listing gives now (another plan directory, so the one under test is left alone)."""
    other = CorpusSource(url=corpus.url, group_buckets=corpus.group_buckets, group_plan_url=str(tmp_path / "ref"))
    return {g.key: g for g in other.list_files()}


def _touch_later(path, seconds: float = 5.0) -> None:
    t = os.path.getmtime(path) + seconds
    os.utime(path, (t, t))


def _s3_corpus(s3, name: str, files: int = 20) -> tuple[CorpusSource, object, str]:
    """(a CorpusSource of ``files`` JSON documents in a new moto bucket ``name``, 3 buckets, plans under its
    ``plans/``; the boto3 client; the bucket)."""
    endpoint, client = s3
    bucket = s3.bucket(name)
    for i in range(files):
        client.put_object(Bucket=bucket, Key=f"corpus/doc-{i:03d}.json", Body=json.dumps({"text": f"doc {i}"}).encode())
    opts = {"client_kwargs": {"endpoint_url": endpoint}}
    return (CorpusSource(url=f"s3://{bucket}/corpus", group_buckets=3, storage_options=opts,
                         group_plan_url=f"s3://{bucket}/plans"), client, bucket)


def _store_at(corpus: CorpusSource, groups, listed_at: float) -> int:
    """``groups`` stored as a listing started at ``listed_at`` would store them; the plans it deleted."""
    from dagster_gpu.corpus.group_plan_store import store_group_plans

    return store_group_plans(*corpus._plan_source(), {g.group.index: (g.version, lambda g=g: list(g.members))
                                                      for g in groups}, listed_at)


# -- pure: names and documents ------------------------------------------------------------------------
def test_plan_names_depend_on_every_input_and_documents_are_checked():
    src = PlanSource("s3://b/docs/", "*.json", True, 1024)
    members = [Member("a.json", "b/docs/a.json", "a.json", 10, 1.5, "etag:1"),
               Member("b.json", "b/docs/b.json", "b.json", 20, 2.5, "etag:2")]
    doc = plan_doc(src, 7, members)
    version = doc["version"]
    assert version == group_version({"a.json": "etag:1", "b.json": "etag:2"})
    names = {plan_name(src, 7, version), plan_name(src, 8, version), plan_name(src, 7, "group:2:x"),
             plan_name(PlanSource("s3://b/docs", "*", True, 1024), 7, version),
             plan_name(PlanSource("s3://b/docs", "*.json", False, 1024), 7, version),
             plan_name(PlanSource("s3://b/docs", "*.json", True, 512), 7, version),
             plan_name(PlanSource("s3://b/other", "*.json", True, 1024), 7, version)}
    assert len(names) == 7
    assert plan_name(PlanSource("s3://b/docs", "*.json", True, 1024), 7, version) == plan_name(src, 7, version)
    # a document round-trips through JSON; only the plan of exactly this source, bucket and version is used
    doc = json.loads(json.dumps(doc))
    assert plan_members(src, 7, version, doc) == members
    assert plan_members(src, 7, "group:2:0000", doc) is None
    assert plan_members(src, 8, version, doc) is None
    assert plan_members(PlanSource("s3://b/docs", "*.json", True, 512), 7, version, doc) is None
    tampered = json.loads(json.dumps(doc))
    tampered["members"][0][5] = "etag:changed"  # members that do not hash to the version the document claims
    assert plan_members(src, 7, version, tampered) is None
    for junk in (None, [], "x", {"format": 1}, {**doc, "members": [["too", "short"]]}, {**doc, "format": 2}):
        assert plan_members(src, 7, version, junk) is None
    # a pointer names its version's plan, nothing else
    assert planned_version(src, 7, pointer_doc(src, 7, version, 100.0)) == version
    assert planned_version(src, 8, pointer_doc(src, 7, version, 100.0)) is None
    assert planned_version(src, 7, {"version": version, "plan": plan_name(src, 7, "group:1:x")}) is None
    assert planned_version(src, 7, None) is None and planned_version(src, 7, {"version": 3}) is None
    assert pointer_name(src, 7) != pointer_name(src, 8)
    # a pointer is replaced by another version's from a listing that started no earlier, never set back
    now = pointer_doc(src, 7, version, 100.0)
    assert replaces(None, now) and replaces({"version": version}, now)
    assert replaces(pointer_doc(src, 7, "group:1:old", 99.0), now)
    assert not replaces(pointer_doc(src, 7, "group:1:new", 101.0), now)
    assert not replaces(pointer_doc(src, 7, version, 50.0), now)  # the same version: nothing to write


# -- local disk ---------------------------------------------------------------------------------------
def test_a_unit_resolves_its_buckets_from_the_plans_without_listing(corpus, calls, tmp_path):
    listed = {g.key: g for g in corpus.list_files()}
    assert len(listed) == BUCKETS and calls["find"] == 1
    plans = sorted(p.name for p in (tmp_path / "plans").iterdir())
    assert len(plans) == 2 * BUCKETS and sum(p.startswith("latest-") for p in plans) == BUCKETS
    calls.clear()
    keys = sorted(listed)
    found = corpus.files_for_keys(keys)
    assert found == listed  # equal CorpusFiles: keys, uris, sizes, mtimes, versions, members
    assert calls["find"] == 0 and calls["ls"] == 0 and calls["info"] == N_FILES  # one stat per member
    assert corpus.file_for_key(keys[1]) == listed[keys[1]] and calls["find"] == 0
    # a bucket's version is its members' exactly, as the listing's
    g = found[keys[0]]
    assert g.version == group_version(g.member_versions) and corpus.current_version(g) == g.version
    # a second listing writes only the pointers again (the plans' content never changes)
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "plans").iterdir()}
    corpus.list_files()
    assert sorted(p.name for p in (tmp_path / "plans").iterdir()) == plans
    assert all(p.stat().st_mtime_ns == before[p.name] for p in (tmp_path / "plans").iterdir()
               if not p.name.startswith("latest-"))


def test_a_changed_or_deleted_member_falls_back_to_the_listing(corpus, calls, tmp_path):
    d = tmp_path / "corpus"
    listed = {g.key: g for g in corpus.list_files()}
    changed_key, deleted_key = "doc-004.json", "doc-011.json"
    home = {m.key: g.key for g in listed.values() for m in g.members}
    _write(d, 4, "document 4, rewritten at another length")
    _touch_later(d / changed_key)
    (d / deleted_key).unlink()
    want = _reference(corpus, tmp_path)
    calls.clear()
    keys = sorted({home[changed_key], home[deleted_key]})
    got = corpus.files_for_keys(keys)
    assert got == {k: want[k] for k in keys} and all(got[k].version != listed[k].version for k in keys)
    assert calls["find"] == 1  # the fallback: one listing for the call
    # that listing stored the new membership: the next unit reads it
    calls.clear()
    assert corpus.files_for_keys(sorted(want)) == want and calls["find"] == 0


@pytest.mark.parametrize("damage", ["plan gone", "plan corrupt", "pointer corrupt", "pointer gone",
                                    "plan of another version", "stale pointer"])
def test_a_missing_corrupt_or_foreign_plan_falls_back_to_the_listing(corpus, calls, tmp_path, damage):
    d, plans = tmp_path / "corpus", tmp_path / "plans"
    listed = {g.key: g for g in corpus.list_files()}
    key = sorted(listed)[2]
    bucket = listed[key].group.index
    src = PlanSource(corpus.url, corpus.pattern, corpus.recursive, BUCKETS)
    pointer = plans / pointer_name(src, bucket)
    plan = plans / plan_name(src, bucket, listed[key].version)
    if damage == "plan gone":
        plan.unlink()
    elif damage == "plan corrupt":
        plan.write_text(plan.read_text()[:-20])
    elif damage == "pointer corrupt":
        pointer.write_text("{not json")
    elif damage == "pointer gone":
        pointer.unlink()
    else:
        # a member of the bucket changes and a listing stores the new version's plan and pointer
        old_pointer, old_plan = pointer.read_text(), plan.read_text()
        first = listed[key].members[0]
        (d / first.relative_name).write_text(json.dumps({"text": "rewritten"}) + "\n")
        _touch_later(d / first.relative_name)
        new = {g.key: g for g in corpus.list_files()}[key]
        new_plan = plans / plan_name(src, bucket, new.version)
        assert new.version != listed[key].version and new_plan.exists()
        if damage == "plan of another version":  # the new version's file holds the old version's plan
            new_plan.write_text(old_plan)
        else:  # the pointer back at the old version (its plan still there): its member no longer matches
            pointer.write_text(old_pointer)
    want = _reference(corpus, tmp_path)
    calls.clear()
    assert corpus.files_for_keys([key]) == {key: want[key]}
    assert calls["find"] == 1


def test_a_file_added_after_the_listing_comes_with_the_next_listing(corpus, calls, tmp_path):
    """The rule: a unit embeds the bucket as the latest listing saw it (every member unchanged), and records the
    version of exactly those files; a file added since makes the next listing's version differ from the recorded
    one, so the corpus sensor requests the bucket again."""
    d = tmp_path / "corpus"
    listed = {g.key: g for g in corpus.list_files()}
    _write(d, 999)
    now = _reference(corpus, tmp_path)
    key = next(k for k in now if now[k].version != listed.get(k, now[k]).version)
    calls.clear()
    got = corpus.files_for_keys([key])[key]
    assert calls["find"] == 0 and got == listed[key]
    assert "doc-999.json" not in got.member_versions and got.version == group_version(got.member_versions)
    assert got.version != now[key].version  # stale against the next listing: requested again
    corpus.list_files()  # the sensor's next tick
    assert corpus.files_for_keys([key])[key] == now[key]


def test_a_slower_listing_of_an_older_state_never_sets_a_pointer_back(corpus, calls, tmp_path):
    d = tmp_path / "corpus"
    started = time.time() - 60  # a unit's fallback listing that started a minute ago ...
    old = corpus.list_files()
    key = old[0].key
    (d / old[0].members[0].relative_name).write_text(json.dumps({"text": "rewritten"}) + "\n")
    _touch_later(d / old[0].members[0].relative_name)
    new = {g.key: g for g in corpus.list_files()}  # ... a tick's listing since, of the new state ...
    corpus._store_group_plans(old, started)  # ... and the old listing's plans stored after it
    calls.clear()
    assert corpus.files_for_keys([key]) == {key: new[key]} and calls["find"] == 0


def test_without_a_plan_directory_a_unit_lists_as_before(tmp_path, calls, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(12):
        _write(d, i)
    corpus = CorpusSource(url=str(d), group_buckets=3)
    listed = {g.key: g for g in corpus.list_files()}
    calls.clear()
    assert corpus.files_for_keys(sorted(listed)) == listed and calls["find"] == 1
    assert not (tmp_path / "plans").exists()
    with pytest.raises(FileNotFoundError, match="not a key of group_buckets=3"):
        corpus.files_for_keys(["group-0001-of-0004"])
    # the default directory: beside the shard plans under DAGSTER_HOME
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    corpus.list_files()
    calls.clear()
    assert corpus.files_for_keys(sorted(listed)) == listed and calls["find"] == 0
    assert len(list((tmp_path / "home" / "dagster_gpu" / "group_plans").iterdir())) == 2 * len(listed)


# -- S3 (moto's server) -------------------------------------------------------------------------------
def test_on_s3_a_unit_reads_plans_and_heads_members_without_listing(s3, monkeypatch):
    import s3fs

    seen: Counter = Counter()
    real = s3fs.S3FileSystem._lsdir

    async def lsdir(self, *a, **kw):
        seen["lsdir"] += 1
        return await real(self, *a, **kw)

    monkeypatch.setattr(s3fs.S3FileSystem, "_lsdir", lsdir)
    forget_group_plans()
    corpus, client, bucket = _s3_corpus(s3, "dgpu-group-plans")
    opts = corpus.storage_options
    listed = {g.key: g for g in corpus.list_files()}
    assert seen["lsdir"] >= 1 and sum(len(g.members) for g in listed.values()) == 20
    assert all(v.startswith("etag:") for g in listed.values() for v in g.member_versions.values())
    seen.clear()
    assert corpus.files_for_keys(sorted(listed)) == listed and seen["lsdir"] == 0
    # a member rewritten: its bucket falls back to a listing, the others still come from their plans
    first = sorted(listed)[0]
    member = listed[first].members[0]
    client.put_object(Bucket=bucket, Key=f"corpus/{member.relative_name}", Body=b'{"text": "rewritten"}\n')
    other = CorpusSource(url=corpus.url, group_buckets=3, storage_options=opts, group_plan_url=f"s3://{bucket}/ref")
    want = {g.key: g for g in other.list_files()}
    seen.clear()
    got = corpus.files_for_keys(sorted(listed))
    assert got == want and got[first].version != listed[first].version and seen["lsdir"] >= 1
    forget_group_plans()


def test_members_of_another_version_are_never_stored_under_a_version(tmp_path, caplog):
    from dagster_gpu.corpus.group_plan_store import load_group_plans, store_group_plans
    from dagster_gpu.corpus.plan_dir import PlanDir

    forget_group_plans()
    src = PlanSource(str(tmp_path / "corpus"), "*", False, 2)
    members = [Member("a.json", str(tmp_path / "corpus" / "a.json"), "a.json", 3, 1.0, "size:3,mtime:1.0")]
    good = group_version({"a.json": "size:3,mtime:1.0"})
    plans = PlanDir(str(tmp_path / "plans"))
    store_group_plans(plans, src, {0: ("group:1:not-these-members", lambda: members)}, 10.0)
    assert "not stored" in caplog.text and load_group_plans(plans, src, [0]) == {}
    store_group_plans(plans, src, {0: (good, lambda: members)}, 10.0)
    assert load_group_plans(plans, src, [0, 1]) == {0: members}
    forget_group_plans()


# -- housekeeping: superseded plans pruned, a maximum plan age ----------------------------------------
def test_a_pointer_records_the_plans_it_superseded_and_prune_keeps_them_for_the_grace_period():
    from dagster_gpu.corpus.group_plans import next_pointer, pointer_age, prune, superseded_plans

    src = PlanSource("/c", "*", False, 4)
    first = next_pointer(src, 1, "group:1:a", 100.0, None)
    assert first == pointer_doc(src, 1, "group:1:a", 100.0) and superseded_plans(first) == []
    assert next_pointer(src, 1, "group:1:a", 150.0, first) is None  # the same version: nothing to write
    second = next_pointer(src, 1, "group:1:b", 200.0, first)
    assert second["plan"] == plan_name(src, 1, "group:1:b")
    assert superseded_plans(second) == [(plan_name(src, 1, "group:1:a"), 200.0)]
    # back to a: a's plan is current again (never in the list), b's is superseded
    third = next_pointer(src, 1, "group:1:a", 300.0, second)
    assert superseded_plans(third) == [(plan_name(src, 1, "group:1:b"), 300.0)]
    # an older listing never moves the pointer back, whatever it saw
    assert next_pointer(src, 1, "group:1:b", 250.0, third) is None
    # prune: only what stopped being current grace_s or more before now
    assert prune(third, 300.0 + 599.0, 600.0) == ([], third)
    due, kept = prune(third, 300.0 + 600.0, 600.0)
    assert due == [plan_name(src, 1, "group:1:b")] and kept == pointer_doc(src, 1, "group:1:a", 300.0)
    # a crafted entry never names anything but a plan file, nor the current plan
    crafted = {**third, "superseded": [["../../etc/passwd", 1.0], [third["plan"], 1.0], ["latest-x-1.json", 1.0], "x"]}
    assert prune(crafted, 1e9, 0.0)[0] == []
    # refresh: the same version rewritten once the stored pointer is refresh_s older than this listing
    assert next_pointer(src, 1, "group:1:a", 300.0 + 999.0, third, refresh_s=1000.0) is None
    refreshed = next_pointer(src, 1, "group:1:a", 300.0 + 1000.0, third, refresh_s=1000.0)
    assert refreshed["listed_at"] == 1300.0 and superseded_plans(refreshed) == superseded_plans(third)
    assert pointer_age(refreshed, 1350.0) == 50.0 and pointer_age({}, 1.0) is None


def _rewrite_member(d, relative_name: str, text: str = "rewritten") -> None:
    (d / relative_name).write_text(json.dumps({"text": text}) + "\n")
    _touch_later(d / relative_name)


def test_superseded_plans_are_pruned_by_a_later_listing_without_listing_the_plan_directory(corpus, calls, tmp_path, monkeypatch):
    from pathlib import Path

    from dagster_gpu.corpus import group_plan_store as store

    d, plans = tmp_path / "corpus", tmp_path / "plans"
    listed = {g.key: g for g in corpus.list_files()}
    src = PlanSource(corpus.url, corpus.pattern, corpus.recursive, BUCKETS)
    changed = sorted(listed)[:2]
    for k in changed:
        _rewrite_member(d, listed[k].members[0].relative_name, f"rewritten {k}")
    now = {g.key: g for g in corpus.list_files()}
    old_plans = [plans / plan_name(src, listed[k].group.index, listed[k].version) for k in changed]
    # within the grace period the superseded plans stay, listed in their pointers
    assert all(p.exists() for p in old_plans) and len(list(plans.iterdir())) == 2 * BUCKETS + 2
    pointer = json.loads((plans / pointer_name(src, now[changed[0]].group.index)).read_text())
    assert pointer["superseded"][0][0] == old_plans[0].name
    # a listing past the grace period deletes exactly those, one unlink each, and lists no directory
    unlinked, scanned = [], []
    real_unlink, real_iterdir = Path.unlink, Path.iterdir
    monkeypatch.setattr(Path, "unlink", lambda self, *a, **kw: (unlinked.append(self.name), real_unlink(self, *a, **kw))[1])
    monkeypatch.setattr(Path, "iterdir", lambda self: (scanned.append(str(self)), real_iterdir(self))[1])
    groups = corpus.groups_of(corpus._list(None))
    calls.clear()
    assert _store_at(corpus, groups, time.time() + store.SUPERSEDED_GRACE_S) == 2
    assert sorted(unlinked) == sorted(p.name for p in old_plans) and scanned == [] and calls["find"] == 0
    monkeypatch.undo()
    assert not any(p.exists() for p in old_plans) and len(list(plans.iterdir())) == 2 * BUCKETS
    assert "superseded" not in json.loads((plans / pointer_name(src, now[changed[0]].group.index)).read_text())
    # every current plan is still there: the units resolve without listing
    calls.clear()
    assert corpus.files_for_keys(sorted(now)) == now and calls["find"] == 0
    # nothing left to prune: a listing of an unchanged corpus writes nothing at all
    before = {p.name: p.stat().st_mtime_ns for p in plans.iterdir()}
    assert _store_at(corpus, groups, time.time() + 2 * store.SUPERSEDED_GRACE_S) == 0
    assert {p.name: p.stat().st_mtime_ns for p in plans.iterdir()} == before


def test_a_current_plan_is_never_pruned_even_when_its_version_comes_back(corpus, calls, tmp_path, monkeypatch):
    from dagster_gpu.corpus import group_plan_store as store

    monkeypatch.setattr(store, "SUPERSEDED_GRACE_S", 0.0)  # every superseded plan is due at the next listing
    d, plans = tmp_path / "corpus", tmp_path / "plans"
    listed = {g.key: g for g in corpus.list_files()}
    key = sorted(listed)[1]
    member = listed[key].members[0]
    original = (d / member.relative_name).read_text()
    mtime = os.path.getmtime(d / member.relative_name)
    _rewrite_member(d, member.relative_name)
    changed = {g.key: g for g in corpus.list_files()}[key]  # a -> b: a's plan superseded, and due at once
    src = PlanSource(corpus.url, corpus.pattern, corpus.recursive, BUCKETS)
    plan_a = plans / plan_name(src, listed[key].group.index, listed[key].version)
    plan_b = plans / plan_name(src, changed.group.index, changed.version)
    assert not plan_a.exists() and plan_b.exists()
    (d / member.relative_name).write_text(original)  # b -> a: the same size and mtime, the same version as before
    os.utime(d / member.relative_name, (mtime, mtime))
    back = {g.key: g for g in corpus.list_files()}
    assert back[key].version == listed[key].version
    assert plan_a.exists() and not plan_b.exists()  # a's plan written again (its pointer moved to it), b's pruned
    for _ in range(3):  # later listings keep every current plan
        corpus.list_files()
    assert sorted(p.name for p in plans.iterdir() if not p.name.startswith("latest-")) == sorted(
        plan_name(src, g.group.index, g.version) for g in back.values())
    calls.clear()
    assert corpus.files_for_keys(sorted(back)) == back and calls["find"] == 0


def test_a_unit_that_read_its_pointer_before_a_listing_moved_it_still_reads_its_plan(corpus, calls, tmp_path, monkeypatch):
    """A unit reads a bucket's pointer (version a); a listing then sees a file added to the bucket (version b) and
    moves the pointer; the unit reads a's plan, still there for the grace period: every member of a unchanged, it
    resolves the bucket as a's listing saw it without listing (the sensor requests b later)."""
    from dagster_gpu.corpus.plan_dir import PlanDir

    d = tmp_path / "corpus"
    listed = {g.key: g for g in corpus.list_files()}
    src = PlanSource(corpus.url, corpus.pattern, corpus.recursive, BUCKETS)
    _write(d, 999)
    now = _reference(corpus, tmp_path)
    key = next(k for k in now if now[k].version != listed.get(k, now[k]).version)
    index = listed[key].group.index
    real_read = PlanDir.read
    moved = []

    def read(self, name):
        doc = real_read(self, name)
        if name == pointer_name(src, index) and not moved and self.url == corpus.group_plan_url:
            moved.append(True)
            corpus.list_files()  # the sensor's tick, between the unit's two reads
        return doc

    monkeypatch.setattr(PlanDir, "read", read)
    calls.clear()
    got = corpus.files_for_keys([key])[key]
    assert moved and calls["find"] == 1  # the tick's listing only: the unit itself listed nothing
    assert got == listed[key] and "doc-999.json" not in got.member_versions
    pointer = json.loads((tmp_path / "plans" / pointer_name(src, index)).read_text())
    assert pointer["version"] == now[key].version and pointer["superseded"][0][0] == plan_name(src, index, listed[key].version)


def test_a_plan_older_than_the_maximum_age_is_ignored_and_the_unit_lists(tmp_path, calls, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(N_FILES):
        _write(d, i)
    corpus = CorpusSource(url=str(d), group_buckets=BUCKETS, group_plan_url=str(tmp_path / "plans"),
                          group_plan_max_age_seconds=3600)
    groups = corpus.groups_of(corpus._list(None))
    corpus._store_group_plans(groups, time.time() - 3700)  # the last listing that saw the buckets: 3,700 s ago
    listed = {g.key: g for g in groups}
    calls.clear()
    assert corpus.files_for_keys(sorted(listed)) == listed and calls["find"] == 1  # aged: listed instead
    # that listing refreshed the pointers (older than half the maximum age): the next unit reads the plans
    calls.clear()
    assert corpus.files_for_keys(sorted(listed)) == listed and calls["find"] == 0 and calls["info"] == N_FILES
    # within the maximum age a plan is used; with no maximum, any age is
    corpus._store_group_plans(groups, time.time() - 3500)  # older than the stored pointers: changes nothing
    calls.clear()
    assert corpus.files_for_keys(sorted(listed)) == listed and calls["find"] == 0
    forget_group_plans()
    ageless = CorpusSource(url=str(d), group_buckets=BUCKETS, group_plan_url=str(tmp_path / "plans2"),
                           group_plan_max_age_seconds=None)
    ageless._store_group_plans(ageless.groups_of(ageless._list(None)), time.time() - 10 * 86400)
    calls.clear()
    assert ageless.files_for_keys(sorted(listed)) == listed and calls["find"] == 0
    # the default is a day
    assert CorpusSource(url=str(d)).group_plan_max_age_seconds == 86400.0
    with pytest.raises(ValueError, match="group_plan_max_age_seconds must be > 0"):
        CorpusSource(url=str(d), group_buckets=2, group_plan_max_age_seconds=0)


def test_on_s3_superseded_plans_are_deleted_without_listing_the_plan_prefix(s3, monkeypatch):
    import s3fs

    from dagster_gpu.corpus import group_plan_store as store

    seen: Counter = Counter()  # S3 API calls by name (list_objects_v2, delete_object, ...)
    real = s3fs.S3FileSystem._call_s3

    async def call_s3(self, method, *a, **kw):
        seen[method] += 1
        return await real(self, method, *a, **kw)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", call_s3)
    forget_group_plans()
    corpus, client, bucket = _s3_corpus(s3, "dgpu-group-plan-prune")

    def plan_objects() -> set[str]:
        out = client.list_objects_v2(Bucket=bucket, Prefix="plans/").get("Contents", [])
        return {o["Key"].split("/", 1)[1] for o in out if not o["Key"].split("/", 1)[1].startswith("latest-")}

    listed = {g.key: g for g in corpus.list_files()}
    first = sorted(listed)[0]
    src = PlanSource(corpus.url, corpus.pattern, corpus.recursive, 3)
    client.put_object(Bucket=bucket, Key=f"corpus/{listed[first].members[0].relative_name}", Body=b'{"text": "new"}\n')
    corpus.filesystem()[0].invalidate_cache()  # s3fs's listing cache: the next tick's listing asks S3
    now = {g.key: g for g in corpus.list_files()}
    assert now[first].version != listed[first].version
    old = plan_name(src, listed[first].group.index, listed[first].version)
    assert old in plan_objects() and len(plan_objects()) == 4  # kept for the grace period
    seen.clear()
    deleted = _store_at(corpus, list(now.values()), time.time() + store.SUPERSEDED_GRACE_S)
    assert deleted == 1 and old not in plan_objects() and len(plan_objects()) == 3
    assert seen["delete_object"] == 1 and seen["delete_objects"] == 0 and seen["list_objects_v2"] == 0  # no listing
    seen.clear()
    assert corpus.files_for_keys(sorted(now)) == now and seen["list_objects_v2"] == 0
    forget_group_plans()
