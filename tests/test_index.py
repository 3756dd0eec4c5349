"""The vector index (dagster_gpu.index): rows, one-commit partition replacement, the Dagster asset and its
check, concurrent writers of different partitions, and a loader killed mid-way. Real LanceDB on local dirs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow as pa
import pytest

from dagster_gpu.index.lance import VectorIndex, is_commit_conflict
from dagster_gpu.index.rows import (
    IndexSchemaError, default_nprobes, index_rows, ivf_partitions, partition_filter, recall_at_k, schema_difference,
    sql_string,
)
from tests.index_helpers import output_rows, write_output

HELPER = Path(__file__).with_name("index_helpers.py")


def test_sql_string_escapes_quotes():
    assert sql_string("it's") == "'it''s'"
    assert partition_filter("a' OR '1'='1") == "partition_key = 'a'' OR ''1''=''1'"


def test_index_rows_adds_key_and_fingerprint_columns():
    t, _ = output_rows(3, 4, pk="p.txt", fingerprint="fp1-aa")
    r = index_rows(t, "p.txt", "fp1-aa")
    assert r.column_names[:3] == ["partition_key", "index_row", "fingerprint"]
    assert r.column("index_row").to_pylist() == [0, 1, 2]
    assert set(r.column("partition_key").to_pylist()) == {"p.txt"}
    assert r.column_names[3:] == t.column_names and r.schema.metadata is None
    with pytest.raises(IndexSchemaError, match=r"x.parquet: columns \['fingerprint'\] are the index's own"):
        index_rows(t.append_column("fingerprint", pa.array(["a"] * 3)), "p", "f", source="x.parquet")
    with pytest.raises(IndexSchemaError, match="no fixed_size_list column 'vector'"):
        index_rows(t.drop(["vector"]), "p", "f")


def test_schema_difference_and_sizes():
    a = pa.schema([("x", pa.int64()), ("v", pa.list_(pa.float32(), 4))])
    b = pa.schema([("x", pa.int32()), ("y", pa.string()), ("v", pa.list_(pa.float32(), 4))])
    assert schema_difference(a, a) == []
    assert schema_difference(a, b) == ["extra column 'y'", "column 'x' is int32, the table's is int64"]
    assert ivf_partitions(0) == 1 and ivf_partitions(15_217) == 4 and ivf_partitions(10_000, "IVF_PQ") == 40
    # a third of the lists, never fewer than LanceDB's 20: unchanged up to ~240,000 rows, 83 of 247 at 1,010,000
    assert [default_nprobes(n) for n in (0, 100_000, 240_000, 300_000, 1_010_000)] == [20, 20, 20, 25, 83]
    assert default_nprobes(100_000, "IVF_PQ") == 131  # 391 lists of 256 rows
    assert recall_at_k([[1, 2, 3]], [[3, 4, 1]], 3) == pytest.approx(2 / 3)


def test_is_commit_conflict_on_lance_messages():
    # message raised by lance 13.0.0 (lancedb 0.40.0) when a compaction lost to a merge: seen in test_concurrent_*
    assert is_commit_conflict(RuntimeError("lance error: Retryable commit conflict for version 161: This Rewrite "
                                           "transaction was preempted by concurrent transaction Update at version 161."))
    assert not is_commit_conflict(RuntimeError("lance error: Schema error: field vector not found"))


def test_replace_partition_is_one_commit_and_leaves_other_partitions(tmp_path):
    ix = VectorIndex(str(tmp_path / "db"), "emb")
    for pk, n in (("a.txt", 5), ("b.txt", 3), ("it's.txt", 4)):
        ix.replace_partition(pk, index_rows(output_rows(n, 8, pk=pk, fingerprint="fp1-x")[0], pk, "fp1-x"))
    v0 = ix.open().version
    r = ix.replace_partition("a.txt", index_rows(output_rows(2, 8, pk="a.txt", fingerprint="fp1-y", seed=9)[0], "a.txt", "fp1-y"))
    assert r.version == v0 + 1 and (r.updated, r.inserted, r.deleted) == (2, 0, 3)
    assert [ix.partition_rows(k) for k in ("a.txt", "b.txt", "it's.txt")] == [2, 3, 4]
    rows = ix.open().search().where(partition_filter("a.txt")).limit(None).to_arrow()
    assert set(rows.column("fingerprint").to_pylist()) == {"fp1-y"}
    # the previous version still holds the old rows: a reader sees one or the other
    old = ix.open()
    old.checkout(v0)
    assert old.count_rows(partition_filter("a.txt")) == 5
    # an empty output deletes the partition's rows only
    empty = index_rows(output_rows(1, 8, pk="b.txt", fingerprint="fp1-x")[0].slice(0, 0), "b.txt", "fp1-x")
    assert ix.replace_partition("b.txt", empty).deleted == 3
    assert [ix.partition_rows(k) for k in ("a.txt", "b.txt", "it's.txt")] == [2, 0, 4]
    assert ix.delete_partition("it's.txt") == 4 and ix.count_rows() == 2


def test_replace_partition_refuses_another_schema(tmp_path):
    ix = VectorIndex(str(tmp_path / "db"), "emb")
    ix.replace_partition("a", index_rows(output_rows(3, 8, pk="a", fingerprint="f")[0], "a", "f"))
    with pytest.raises(IndexSchemaError, match=r"partition 'b' does not fit index table 'emb'.*column 'vector' is "
                       r"fixed_size_list<item: float>\[4\].*rebuild the index from the current outputs: dagster-gpu index "
                       r"-m MODULE -a INDEX_ASSET --rebuild"):
        ix.replace_partition("b", index_rows(output_rows(3, 4, pk="b", fingerprint="f")[0], "b", "f"))
    assert ix.count_rows() == 3


def test_the_table_follows_a_change_of_the_outputs_carried_and_text_columns(tmp_path):
    """Outputs first written with ``text`` and a carried ``package`` column, then with neither, then with another
    carried column: every partition loads (once: IndexSchemaError "column 'package' missing"); the old rows keep
    their values, the new ones are null where they lack a column."""
    import pyarrow as pa

    from dagster_gpu.index.rows import column_migration

    ix = VectorIndex(str(tmp_path / "db"), "emb")
    old = output_rows(2, 8, pk="a", fingerprint="f", texts=["x", "y"], carried={"package": pa.array(["p1", "p2"])})[0]
    ix.write_partition("a", index_rows(old, "a", "f"))
    assert not ix.open().schema.field("text").nullable  # as in the outputs
    plain = index_rows(output_rows(1, 8, pk="b", fingerprint="f")[0], "b", "f")
    plan = column_migration(ix.open().schema, plain.schema)
    assert (plan.add, plan.make_nullable, plan.conflicts) == ((), ("text",), ())
    assert ix.write_partition("b", plain).inserted == 1
    assert ix.open().schema.field("text").nullable
    other = output_rows(1, 8, pk="c", fingerprint="f", carried={"section": pa.array(["s"])})[0]
    assert ix.replace_partition("c", index_rows(other, "c", "f")).inserted == 1
    got = {(r["partition_key"], r["index_row"]): (r["package"], r["text"], r["section"])
           for r in ix.open().to_arrow().to_pylist()}
    assert got == {("a", 0): ("p1", "x", None), ("a", 1): ("p2", "y", None), ("b", 0): (None, None, None),
                   ("c", 0): (None, None, "s")}


def test_upkeep_compacts_and_deletes_old_versions_on_the_policy(tmp_path):
    """A flat table is compacted once it has ``compact_min_fragments`` fragments, its older versions deleted with the
    files only they used (folder size measured); an indexed one is left to its rebuild, forced by ``max_versions``."""
    from datetime import timedelta

    soon = timedelta(milliseconds=1)  # every version but the latest is older than this by the time it runs
    ix = VectorIndex(str(tmp_path / "db"), "emb")
    for i in range(6):
        pk = f"p{i % 3}"  # three partitions, each replaced once: six commits
        ix.write_partition(pk, index_rows(output_rows(40, 16, pk=pk, fingerprint="f", seed=i)[0], pk, "f"))
    assert ix.maintain(None, soon) == "below" and ix.maintain(50, soon) == "below"
    before = (ix.versions(), ix.fragments(), ix.disk_bytes())
    assert before[0] == 7 and before[1] >= 3
    content = ix.open().to_arrow().sort_by([("partition_key", "ascending"), ("index_row", "ascending")])
    time.sleep(0.1)  # the six loads' versions are all older than ``soon`` now
    assert ix.maintain(3, soon) == "compacted"
    after = (ix.versions(), ix.fragments(), ix.disk_bytes())
    # left: the compaction's version (and, on a loaded host, at most the one Lance stamped within ``soon`` of it)
    assert after[0] <= 2 and after[1] == 1 and after[2] < before[2], (before, after)
    assert ix.open().to_arrow().sort_by([("partition_key", "ascending"), ("index_row", "ascending")]).equals(content)
    # with an ANN index the upkeep leaves the table to the index's rebuild (optimize would fold the index)
    big = VectorIndex(str(tmp_path / "db2"), "emb")
    for pk in ("a", "b"):
        big.write_partition(pk, index_rows(output_rows(600, 16, pk=pk, fingerprint="f")[0], pk, "f"))
    time.sleep(0.1)  # both loads' versions are older than ``soon`` when the build's compaction prunes
    assert big.ensure_ann_index(min_rows=1000, cleanup_older_than=soon) == "created"
    for seed in (1, 2):  # a small partition loaded, then replaced: 10 rows out of the index
        big.write_partition("c", index_rows(output_rows(10, 16, pk="c", fingerprint="f", seed=seed)[0], "c", "f"))
    assert big.maintain(1, soon) == "indexed"
    assert big.ensure_ann_index(min_rows=1000, cleanup_older_than=soon) == "deferred"
    versions = big.versions()
    assert versions == 5  # the build's compaction (older versions deleted), its two indices, the two loads of "c"
    assert big.ensure_ann_index(min_rows=1000, cleanup_older_than=soon, max_versions=5) == "rebuilt"
    # what is left: the versions the rebuild itself committed after its compaction deleted the older ones
    assert big.versions() <= 4 < versions and big.count_rows() == 1210


def test_search_exact_and_ann_agree_and_fingerprints_listed(tmp_path):
    ix = VectorIndex(str(tmp_path / "db"), "emb")
    rng = np.random.default_rng(1)
    centers = rng.standard_normal((20, 16))
    for p in range(4):
        vec = centers[rng.integers(0, 20, 600)] + 0.3 * rng.standard_normal((600, 16))
        t, _ = output_rows(600, 16, pk=f"p{p}", fingerprint="fp1-a", vectors=vec)
        ix.record_lineage("fp1-a", {"model": "m"})
        ix.replace_partition(f"p{p}", index_rows(t, f"p{p}", "fp1-a"))
    assert ix.ensure_ann_index(min_rows=10_000) == "flat"
    assert ix.ensure_ann_index(min_rows=1000) == "created"
    assert ix.ann_index() is not None and ix.ensure_ann_index(min_rows=1000) == "current"
    ix.replace_partition("p0", index_rows(output_rows(50, 16, pk="p0", fingerprint="fp1-a", seed=5)[0], "p0", "fp1-a"))
    assert ix.ensure_ann_index(min_rows=1000) == "deferred"  # 50 rows out of the index: searched exactly beside it
    big = centers[rng.integers(0, 20, 2500)] + 0.3 * rng.standard_normal((2500, 16))
    ix.replace_partition("p9", index_rows(output_rows(2500, 16, pk="p9", fingerprint="fp1-a", vectors=big)[0], "p9", "fp1-a"))
    assert ix.ensure_ann_index(min_rows=1000) == "rebuilt"  # 2550 rows out of the index > 10 % of 2400: trained again
    assert ix.open().index_stats(ix.ann_index().name).num_unindexed_rows == 0
    tbl = ix.open()
    assert ix._default_nprobes(tbl) == default_nprobes(tbl.index_stats(ix.ann_index().name).num_indexed_rows) == 20
    assert ix._nprobes == (tbl.version, 20)  # looked up once per table version
    ix.delete_partition("p9")
    assert ix.fingerprints() == {"fp1-a": {"rows": 1850, "lineage": {"model": "m"}}}
    q = rng.standard_normal((20, 16))
    ids = lambda t: list(zip(t.column("partition_key").to_pylist(), t.column("index_row").to_pylist()))
    exact = [ids(ix.search(v, 10, exact=True)) for v in q]
    approx = [ids(ix.search(v, 10)) for v in q]
    assert recall_at_k(exact, approx, 10) >= 0.9
    d = ix.search(q[0], 3, exact=True).column("_distance").to_pylist()
    assert d == sorted(d) and 0 <= d[0] <= 2
    # the same rows have the same distance through the index as without it: the exact cosine distance
    for v in q:
        flat = {k: x for k, x in zip(ids(ix.search(v, 10, exact=True)), ix.search(v, 10, exact=True).column("_distance").to_pylist())}
        hits = ix.search(v, 10)
        for k, x in zip(ids(hits), hits.column("_distance").to_pylist()):
            if k in flat:
                assert x == pytest.approx(flat[k], abs=1e-5), (k, x, flat[k])


def _embeddings(tmp_path):
    from dagster_gpu import CorpusSource, TextFormat, embedding_asset

    (tmp_path / "corpus").mkdir(exist_ok=True)
    return embedding_asset(name="emb", corpus=CorpusSource(url=str(tmp_path / "corpus"), text_format=TextFormat()),
                           output_url=str(tmp_path / "out"), device="cpu")


def test_index_asset_materializes_partitions_and_checks_rows(tmp_path):
    from dagster_gpu.definitions.assets import output_uri_for
    from dagster_gpu.definitions.vector_index import vector_index_asset

    emb = _embeddings(tmp_path)
    idx = vector_index_asset(emb, uri=str(tmp_path / "lance"), ann_min_rows=10**9)
    assert idx.key == dg.AssetKey("emb_index") and idx.partitions_def == emb.partitions_def
    assert idx.asset_deps[idx.key] == {emb.key}
    keys = ["a.txt", "b.txt", "c.txt"]
    for i, k in enumerate(keys[:2]):
        write_output(Path(output_uri_for(str(tmp_path / "out"), "emb", k)), 10 + i, 8, pk=k, fingerprint="fp1-a", seed=i)
    with dg.instance_for_test() as inst:
        inst.add_dynamic_partitions(emb.partitions_def.name, keys)
        res = dg.materialize([idx], instance=inst, partition_key="a.txt")
        assert res.success
        res = dg.materialize([idx], instance=inst, partition_key="b.txt")
        mats = res.asset_materializations_for_node(idx.op.name)
        assert [m.partition for m in mats] == ["b.txt"] and mats[0].metadata["index/rows"].value == 11
        evals = res.get_asset_check_evaluations()
        assert [(e.check_name, e.partition, e.passed) for e in evals] == [("index_rows_match_output", "b.txt", True)]
        # a missing output fails its partition, naming it; the table is untouched
        res = dg.materialize([idx], instance=inst, partition_key="c.txt", raise_on_error=False)
        assert not res.success
        failure = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"][0]
        assert "c.txt: FileNotFoundError: no output of emb for partition 'c.txt'" in failure.step_failure_data.error.message
        ix = VectorIndex(str(tmp_path / "lance"), "emb")
        assert [ix.partition_rows(k) for k in keys] == [10, 11, 0]
        # re-embedded with fewer rows: the partition's rows are replaced
        write_output(Path(output_uri_for(str(tmp_path / "out"), "emb", "a.txt")), 4, 8, pk="a.txt", fingerprint="fp1-b", seed=7)
        assert dg.materialize([idx], instance=inst, partition_key="a.txt").success
        assert [ix.partition_rows(k) for k in keys] == [4, 11, 0]
        assert {fp: v["rows"] for fp, v in ix.fingerprints().items()} == {"fp1-a": 11, "fp1-b": 4}


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HELPER), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=str(HELPER.parents[1]))


def test_concurrent_writers_of_different_partitions_lose_no_rows(tmp_path):
    db = str(tmp_path / "db")
    ix = VectorIndex(db, "emb")
    ix.replace_partition("seed", index_rows(output_rows(10, 8, pk="seed", fingerprint="f")[0], "seed", "f"))
    procs = [_spawn("load", db, "emb", k, str(rows), "8", "f", "3", "8") for k, rows in (("a", 300), ("b", 200))]
    procs.append(_spawn("optimize", db, "emb", "10"))  # compactions beside them: lost commits happen and are retried
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1][-2000:] for o in outs]
    assert outs[0][0].count("committed") == 8 and outs[1][0].count("committed") == 8
    assert [ix.partition_rows(k) for k in ("a", "b", "seed")] == [300, 200, 10]
    lost = sum(int(line.split()[2]) + int(line.split()[3]) - 1 for o in outs[:2] for line in o[0].splitlines()
               if line.startswith("committed"))
    print("lost commits retried (ours + Lance's):", lost, "; compactions lost:", outs[2][0].count("optimize lost"))


def test_loader_killed_mid_way_leaves_old_or_new_rows(tmp_path):
    db = str(tmp_path / "db")
    ix = VectorIndex(db, "emb")
    ix.replace_partition("p", index_rows(output_rows(1000, 64, pk="p", fingerprint="old")[0], "p", "old"))
    ix.replace_partition("q", index_rows(output_rows(50, 64, pk="q", fingerprint="old")[0], "q", "old"))
    seen = set()
    for delay in (0.0, 0.05, 0.2, 0.5):
        p = _spawn("load", db, "emb", "p", "10000", "64", "new", "1", "3")
        line = p.stdout.readline()  # "staged": the rows are built, the merge (delete + insert) is under way
        assert line.startswith("staged"), p.stderr.read()
        time.sleep(delay)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        t = ix.open().search().where(partition_filter("p")).select(["fingerprint"]).limit(None).to_arrow()
        fps = set(t.column("fingerprint").to_pylist())
        assert (t.num_rows, fps) in ((1000, {"old"}), (10000, {"new"})), (delay, t.num_rows, fps)
        seen.add(t.num_rows)
        assert ix.partition_rows("q") == 50
        if t.num_rows == 10000:  # back to the old state for the next kill
            ix.replace_partition("p", index_rows(output_rows(1000, 64, pk="p", fingerprint="old")[0], "p", "old"))
    assert 1000 in seen  # at least one kill landed before the commit


def test_demo_code_location_has_the_index_and_search_finds_it(monkeypatch, tmp_path):
    monkeypatch.setenv("DAGSTER_GPU_INDEX_URI", str(tmp_path / "lance"))
    monkeypatch.delitem(sys.modules, "pipelines.definitions", raising=False)
    import pipelines.definitions as d
    from dagster_gpu.commands.search import index_of

    assert d.fortune_index.partitions_def == d.fortune_embeddings.partitions_def
    assert d.fortune_index.op.tags["dagster-gpu/gpu-count"] == "0"
    for asset in ("fortune_embeddings", "fortune_embeddings_index"):
        ix, key, emb = index_of(d.defs, asset)
        assert (ix.uri, ix.table_name, key.to_user_string(), emb) == (
            str(tmp_path / "lance"), "fortune_embeddings", "fortune_embeddings_index", "fortune_embeddings")
