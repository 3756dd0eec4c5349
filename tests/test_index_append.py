"""Loading partitions into the index: a partition new to the table is appended (one Append commit, no merge), a
partition the table holds is replaced by one ``merge_insert`` commit; both give the table the same rows. Real
LanceDB (0.40.0) on local directories and on moto's S3 server (tests/conftest.py ``s3``)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from dagster_gpu.definitions.vector_index import load_partition, read_output
from dagster_gpu.index.lance import VectorIndex
from dagster_gpu.index.rows import index_rows, partition_filter
from tests.index_helpers import output_rows, write_output

SORT = [("partition_key", "ascending"), ("index_row", "ascending")]


def _content(ix: VectorIndex) -> pa.Table:
    """Every row of the index's latest version, in key order (Lance's own row order is not part of the content)."""
    return ix.open().to_arrow().sort_by(SORT)


def test_append_path_and_replace_path_give_the_same_table(tmp_path):
    outputs = {pk: write_output(tmp_path / "out" / f"{pk}.parquet", n, 8, pk=pk, fingerprint="fp1-a", seed=s)
               for pk, n, s in (("a.txt", 7, 1), ("b's.txt", 3, 2), ("c.txt", 11, 3))}
    appended = VectorIndex(str(tmp_path / "db1"), "emb")
    facts = [load_partition(appended, pk, str(p)) for pk, p in outputs.items()]
    assert [f["mode"] for f in facts] == ["append"] * 3
    assert [(f["inserted"], f["updated"], f["deleted"], f["index_rows"]) for f in facts] == [(7, 0, 0, 7), (3, 0, 0, 3), (11, 0, 0, 11)]
    # one commit per partition: the table's versions follow each other
    assert [f["version"] for f in facts] == [facts[0]["version"] + i for i in range(3)]

    merged = VectorIndex(str(tmp_path / "db2"), "emb")
    for pk, p in outputs.items():
        t, lineage = read_output(str(p))
        r = merged.replace_partition(pk, index_rows(t, pk, lineage["fingerprint"]))
        assert r.mode == "replace" and r.inserted == t.num_rows
    a, m = _content(appended), _content(merged)
    assert a.num_rows == 21 and a.schema == m.schema
    assert a.equals(m)
    assert a.column("vector").to_pylist() == m.column("vector").to_pylist()


def test_changed_partition_still_replaced_in_one_commit(tmp_path):
    ix = VectorIndex(str(tmp_path / "db"), "emb")
    out = tmp_path / "out"
    load_partition(ix, "a.txt", str(write_output(out / "a.parquet", 5, 8, pk="a.txt", fingerprint="fp1-a")))
    load_partition(ix, "b.txt", str(write_output(out / "b.parquet", 4, 8, pk="b.txt", fingerprint="fp1-a", seed=2)))
    v0 = ix.open().version
    # the file changed: 2 rows instead of 5, new vectors and a new fingerprint
    f = load_partition(ix, "a.txt", str(write_output(out / "a2.parquet", 2, 8, pk="a.txt", fingerprint="fp1-b", seed=9)))
    assert f["mode"] == "replace" and f["version"] == v0 + 1
    assert (f["updated"], f["inserted"], f["deleted"], f["index_rows"]) == (2, 0, 3, 2)
    assert [ix.partition_rows(k) for k in ("a.txt", "b.txt")] == [2, 4]
    fresh = VectorIndex(str(tmp_path / "db_fresh"), "emb")
    load_partition(fresh, "b.txt", str(out / "b.parquet"))
    load_partition(fresh, "a.txt", str(out / "a2.parquet"))
    assert _content(ix).equals(_content(fresh))  # replace on top of old rows = append into an empty table
    old = ix.open()
    old.checkout(v0)  # the version before holds the old rows: a reader sees one or the other
    assert old.count_rows(partition_filter("a.txt")) == 5
    assert set(old.search().where(partition_filter("a.txt")).limit(None).to_arrow().column("fingerprint").to_pylist()) == {"fp1-a"}


def test_write_partition_appends_only_when_the_partition_has_no_rows(tmp_path):
    ix = VectorIndex(str(tmp_path / "db"), "emb")
    rows = lambda pk, n, seed=0: index_rows(output_rows(n, 8, pk=pk, fingerprint="f", seed=seed)[0], pk, "f")
    assert ix.write_partition("a", rows("a", 3)).mode == "append"
    r = ix.write_partition("a", rows("a", 3, seed=1))  # same keys again: never doubled
    assert r.mode == "replace" and (r.updated, r.inserted, r.deleted) == (3, 0, 0) and ix.count_rows() == 3
    assert ix.delete_partition("a") == 3
    assert ix.write_partition("a", rows("a", 2)).mode == "append" and ix.count_rows() == 2
    empty = ix.write_partition("b", rows("b", 1).slice(0, 0))  # nothing to append: the merge (deletes nothing)
    assert empty.mode == "replace" and ix.count_rows() == 2


def test_partition_key_index_serves_the_new_partition_check(tmp_path):
    ix = VectorIndex(str(tmp_path / "db"), "emb")
    for p in range(3):
        ix.write_partition(f"p{p}", index_rows(output_rows(400, 8, pk=f"p{p}", fingerprint="f", seed=p)[0], f"p{p}", "f"))
    assert ix.ensure_ann_index(min_rows=1000) == "created"
    key_ix = ix.key_index()
    assert key_ix is not None and key_ix.index_type == "BTree"
    r = ix.write_partition("p3", index_rows(output_rows(50, 8, pk="p3", fingerprint="f", seed=7)[0], "p3", "f"))
    assert r.mode == "append"
    assert ix.write_partition("p1", index_rows(output_rows(10, 8, pk="p1", fingerprint="f", seed=8)[0], "p1", "f")).mode == "replace"
    assert [ix.partition_rows(f"p{p}") for p in range(4)] == [400, 10, 400, 50]
    # 60 new rows, 5 % of the 1,200 indexed: left out of both indices, found by a scan beside the BTREE
    assert ix.ensure_ann_index(min_rows=800) == "deferred"
    tbl = ix.open()
    assert tbl.index_stats(key_ix.name).num_unindexed_rows == 60 and tbl.index_stats(ix.ann_index().name).num_unindexed_rows == 60
    assert [ix.partition_rows(f"p{p}") for p in range(4)] == [400, 10, 400, 50]
    assert ix.ensure_ann_index(min_rows=800, max_unindexed_fraction=0.01) == "rebuilt"
    tbl = ix.open()
    assert tbl.index_stats(key_ix.name).num_unindexed_rows == 0 and tbl.index_stats(ix.ann_index().name).num_unindexed_rows == 0
    assert [ix.partition_rows(f"p{p}") for p in range(4)] == [400, 10, 400, 50]


@pytest.fixture(scope="module")
def s3_opts(s3):
    """LanceDB object-store options (lancedb.connect(storage_options=...)) for the session's moto endpoint."""
    s3.bucket("dgpu-index-append")
    return {"aws_endpoint": s3.endpoint, "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
            "region": "us-east-1", "allow_http": "true"}


def test_s3_table_round_trip_append_replace_and_ann(s3_opts, tmp_path):
    ix = VectorIndex("s3://dgpu-index-append/lance", "emb", s3_opts)
    local = VectorIndex(str(tmp_path / "db"), "emb")
    out = tmp_path / "out"
    for p in range(3):
        uri = str(write_output(out / f"p{p}.parquet", 500, 8, pk=f"p{p}", fingerprint="fp1-a", seed=p))
        f = load_partition(ix, f"p{p}", uri)
        assert (f["mode"], f["index_rows"]) == ("append", 500)
        load_partition(local, f"p{p}", uri)
    assert ix.ensure_ann_index(min_rows=1000) == "created"
    uri = str(write_output(out / "p1b.parquet", 20, 8, pk="p1", fingerprint="fp1-b", seed=11))
    f = load_partition(ix, "p1", uri)
    assert (f["mode"], f["updated"], f["deleted"], f["index_rows"]) == ("replace", 20, 480, 20)
    load_partition(local, "p1", uri)
    assert ix.ensure_ann_index(min_rows=1000) == "deferred"  # 20 replaced rows: 1.3 % of the 1,500 indexed
    # a second client reading the bucket sees what the local table holds, row for row
    again = VectorIndex("s3://dgpu-index-append/lance", "emb", s3_opts)
    assert again.count_rows() == 1020 and _content(again).equals(_content(local))
    v = output_rows(20, 8, pk="p1", fingerprint="fp1-b", seed=11)[0].column("vector")[3].as_py()
    hit = again.search(v, 1)
    assert hit.column("doc_id").to_pylist() == ["p1/3"] and hit.column("_distance")[0].as_py() < 1e-4


def test_load_partitions_reads_ahead_and_keeps_each_partitions_error_its_own(tmp_path):
    """The index asset's loop: outputs read one partition ahead (``load_partitions``), the same table and facts as
    loading one after the other; a partition with no output, one whose file is not parquet and one that does not
    fit the table fail alone, each with its own error, and the partitions after them are loaded."""
    from dagster_gpu.definitions.vector_index import load_partitions

    out = tmp_path / "out"
    good = {pk: str(write_output(out / f"{pk}.parquet", n, 8, pk=pk, fingerprint="fp1-a", seed=s))
            for pk, n, s in (("a.txt", 7, 1), ("b.txt", 3, 2), ("d.txt", 5, 4), ("f.txt", 2, 6))}
    (out / "c.parquet").write_bytes(b"not parquet")
    narrow = str(write_output(out / "e.parquet", 4, 4, pk="e.txt", fingerprint="fp1-a", seed=5))  # 4 dims, not 8
    uris = {**good, "c.txt": str(out / "c.parquet"), "e.txt": narrow}
    order = ["a.txt", "b.txt", "c.txt", "missing.txt", "d.txt", "e.txt", "f.txt"]

    def locate(pk: str) -> str:
        if pk not in uris:
            raise FileNotFoundError(f"no output for {pk!r}")
        return uris[pk]

    ix = VectorIndex(str(tmp_path / "db"), "emb")
    done = list(load_partitions(ix, order, locate))
    assert [d.partition_key for d in done] == order
    ok = {d.partition_key: d for d in done if d.error is None}
    assert sorted(ok) == sorted(good)
    assert [(ok[k].facts["mode"], ok[k].facts["index_rows"], ok[k].facts["output_rows"], ok[k].source)
            for k in sorted(good)] == [("append", 7, 7, good["a.txt"]), ("append", 3, 3, good["b.txt"]),
                                       ("append", 5, 5, good["d.txt"]), ("append", 2, 2, good["f.txt"])]
    assert all(d.seconds > 0 for d in done)
    bad = {d.partition_key: d for d in done if d.error is not None}
    assert bad["missing.txt"].source is None and bad["missing.txt"].error == "FileNotFoundError: no output for 'missing.txt'"
    assert bad["c.txt"].source == uris["c.txt"] and bad["c.txt"].error.startswith("ArrowInvalid: ")
    assert bad["e.txt"].source == narrow and bad["e.txt"].error.startswith("IndexSchemaError: partition 'e.txt' does not fit")
    assert bad["e.txt"].facts is None

    sequential = VectorIndex(str(tmp_path / "db_seq"), "emb")
    for pk in sorted(good):
        load_partition(sequential, pk, good[pk])
    assert _content(ix).equals(_content(sequential))


def test_count_back_of_an_append_reads_the_manifests_unless_another_commit_came_between(tmp_path):
    """An append committed right after the version that had none of the partition's rows is counted from the two
    versions' row counts (no scan); when another commit came between (a second writer of the same partition could
    have appended too), the partition's rows are counted by a filtered scan, which sees the duplicates."""
    from dagster_gpu.index.lance import ReplaceResult

    ix = VectorIndex(str(tmp_path / "db"), "emb")
    out = tmp_path / "out"
    load_partition(ix, "b.txt", str(write_output(out / "b.parquet", 4, 8, pk="b.txt", fingerprint="fp1-a", seed=2)))
    t, lineage = read_output(str(write_output(out / "a.parquet", 6, 8, pk="a.txt", fingerprint="fp1-a")))
    rows = index_rows(t, "a.txt", lineage["fingerprint"])
    r = ix.write_partition("a.txt", rows)
    assert (r.mode, r.version, r.checked_version) == ("append", r.checked_version + 1, r.checked_version)
    assert ix.partition_rows_at("a.txt", r) == 6
    # another writer appends the same partition's rows again (what the one-writer rule excludes)
    tbl = ix.open()
    second = tbl.add(rows)
    dup = ReplaceResult(version=int(second.version), inserted=6, updated=0, deleted=0, attempts=1, retries=0,
                        mode="append", checked_version=r.checked_version)  # checked before the first append
    assert dup.version == r.checked_version + 2
    assert ix.partition_rows_at("a.txt", dup) == 12  # filtered: both appends' rows
    alone = ReplaceResult(version=int(second.version), inserted=6, updated=0, deleted=0, attempts=1, retries=0,
                          mode="append", checked_version=int(second.version) - 1)
    assert ix.partition_rows_at("a.txt", alone) == 6  # the manifests' difference: the rows that one commit added
    assert ix.partition_rows_at("b.txt", ReplaceResult(int(second.version), 0, 0, 0, 1, 0)) == 4  # a replace: filtered
