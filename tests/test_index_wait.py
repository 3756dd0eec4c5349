"""``dagster-gpu backfill``'s wait for the vector index following its embeddings: read from the index asset's
materializations and load failures in a real (SQLite) instance against the embeddings', whoever requests the
index's runs."""

from __future__ import annotations

import sys
import threading
import time

import dagster as dg
import pytest

from dagster_gpu.commands.index_wait import IndexLag, index_assets_following, index_lag, lag_lines, wait_for_indexes
from dagster_gpu.definitions.vector_index import LOAD_FAILED_KEY


@pytest.fixture
def location(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_GPU_INDEX_TEST_DIR", str(tmp_path))
    monkeypatch.delitem(sys.modules, "tests.index_pipeline", raising=False)  # its paths are read at import
    import importlib

    return importlib.import_module("tests.index_pipeline")


def _emit(instance, key, pk, **metadata):
    instance.report_runless_asset_event(dg.AssetMaterialization(key, partition=pk, metadata=metadata))


def test_the_index_is_behind_until_it_materialized_each_partition_after_its_embeddings(location):
    emb, idx = location.emb, location.emb_index
    assert [a.key for a in index_assets_following(location.defs, emb.key)] == [idx.key]
    keys = ["a.txt", "b.txt", "c.txt"]
    with dg.instance_for_test() as instance:
        for pk in keys:  # first load: both partitions indexed
            _emit(instance, emb.key, pk)
            _emit(instance, idx.key, pk)
        assert index_lag(instance, idx, emb.key, keys) == IndexLag("emb_index", (), {}, automated=True)
        for pk in keys:  # a --stale backfill materializes the embeddings again: the index's rows are the old ones
            _emit(instance, emb.key, pk)
        assert index_lag(instance, idx, emb.key, keys).behind == ("a.txt", "b.txt", "c.txt")
        _emit(instance, idx.key, "a.txt", **{"index/rows": 0})  # loaded with no rows is loaded
        instance.report_runless_asset_event(dg.AssetObservation(idx.key, partition="b.txt", metadata={
            LOAD_FAILED_KEY: "IndexSchemaError: column 'package' missing"}))
        lag = index_lag(instance, idx, emb.key, keys)
        assert lag.behind == ("c.txt",) and lag.failed == {"b.txt": "IndexSchemaError: column 'package' missing"}
        assert not lag.current
        assert index_lag(instance, idx, emb.key, ["a.txt", "b.txt", "never.txt"]).current  # failed: reported, not waited


def test_the_wait_ends_once_the_index_caught_up_whoever_loaded_it(location):
    emb, idx = location.emb, location.emb_index
    with dg.instance_for_test() as instance:
        _emit(instance, emb.key, "a.txt")
        _emit(instance, emb.key, "b.txt")
        lags = lambda: [index_lag(instance, idx, emb.key, ["a.txt", "b.txt"])]  # noqa: E731

        def load_later():  # as the daemon's index runs would, one partition per run, a few seconds late
            for pk in ("a.txt", "b.txt"):
                time.sleep(1.5)
                _emit(instance, idx.key, pk)

        t = threading.Thread(target=load_later)
        start = time.monotonic()
        t.start()
        got = wait_for_indexes(lags, timeout_s=60, poll_s=0.2)
        t.join()
        assert got[0].current and 2.5 < time.monotonic() - start < 30
        _emit(instance, emb.key, "a.txt")
        start = time.monotonic()  # the daemon gone: no wait
        assert wait_for_indexes(lags, timeout_s=60, poll_s=0.2, alive=lambda: False)[0].behind == ("a.txt",)
        assert time.monotonic() - start < 5
        assert wait_for_indexes(lags, timeout_s=0.5, poll_s=0.2)[0].behind == ("a.txt",)


def test_an_index_without_automation_is_not_waited_for_and_each_lag_says_why():
    manual = IndexLag("docs_index", ("x.txt",), {}, automated=False)
    start = time.monotonic()
    assert wait_for_indexes(lambda: [manual], timeout_s=60) == [manual]
    assert time.monotonic() - start < 1
    loc = "-m my.defs"
    assert lag_lines([manual], 0, False, loc) == [
        "Index docs_index is behind its embeddings for 1 partition(s) (x.txt): it has no automation condition "
        "(automation_condition=None: only backfills load it); search answers from their previous rows until then; "
        "load them: dagster-gpu backfill -m my.defs -a docs_index --stale"]
    slow = IndexLag("docs_index", tuple(f"f{i}.txt" for i in range(7)), {"bad.txt": "IndexSchemaError: x"})
    lines = lag_lines([slow], 300, False, loc)
    assert lines[0].startswith("Index docs_index is behind its embeddings for 7 partition(s) (f0.txt, f1.txt, f2.txt, "
                               "f3.txt, f4.txt …): no run loaded them within 300 s (--runs-wait;")
    assert lines[1] == ("Index docs_index: 1 partition(s) failed to load: bad.txt: IndexSchemaError: x; once fixed, "
                        "load them: dagster-gpu backfill -m my.defs -a docs_index --stale")
    assert "the dagster-daemon stopped before it loaded them" in lag_lines([slow], 3, True, loc)[0]
    assert lag_lines([IndexLag("docs_index")], 3, False, loc) == []
