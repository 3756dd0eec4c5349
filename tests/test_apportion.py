"""Apportioning a work unit's bill to its partitions (pure) and resolving a run's partition range."""

import math

import pytest

from dagster_gpu.billing.apportion import apportion_unit_bill, partition_wall_seconds, split_by_shares, startup_shares
from dagster_gpu.corpus.listing import CorpusNotFound, CorpusSource
from dagster_gpu.partitions.run_ranges import PartitionRangeError, keys_in_range, run_partition_keys


def test_startup_shares_follow_file_sizes_and_sum_to_one():
    shares = startup_shares({"a": 300, "b": 100, "empty": 0})
    assert shares["a"] == pytest.approx(300 / 401) and shares["empty"] == pytest.approx(1 / 401)
    assert math.fsum(shares.values()) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        startup_shares({})


def test_measured_shares_add_up_to_the_units_wall_seconds():
    # a unit: 12 s start-up, then three partitions of 5, 1 and 2 s on the device
    sizes = {"a": 5000, "b": 1000, "c": 2000}
    shares = startup_shares(sizes)
    billed = {k: partition_wall_seconds(12.0, shares[k], t) for k, t in (("a", 5.0), ("b", 1.0), ("c", 2.0))}
    assert billed["a"] == pytest.approx(12 * 5 / 8 + 5)
    assert math.fsum(billed.values()) == pytest.approx(12 + 5 + 1 + 2)
    with pytest.raises(ValueError):
        partition_wall_seconds(float("nan"), 0.5, 1.0)


def test_split_by_shares_is_exact_and_proportional():
    parts = split_by_shares(10.0, [("a", 1.0), ("b", 3.0)])
    assert parts == [("a", 2.5), ("b", 7.5)]
    thirds = split_by_shares(1.0, [("a", 1.0), ("b", 1.0), ("c", 1.0)])
    assert sum(v for _, v in thirds) == 1.0
    assert split_by_shares(6.0, [("a", 0.0), ("b", 0.0)]) == [("a", 3.0), ("b", 3.0)]
    with pytest.raises(ValueError):
        split_by_shares(1.0, [])
    with pytest.raises(ValueError):
        split_by_shares(1.0, [("a", -1.0)])


def test_unit_bill_gives_the_unfinished_partitions_what_was_not_measured():
    # sacct billed 20 GPU-s; two partitions measured 6 + 4; the killed one gets the remaining 10
    parts = dict(apportion_unit_bill(20.0, [("a", 6.0), ("b", 4.0)], ["killed"]))
    assert parts == {"a": 6.0, "b": 4.0, "killed": 10.0}
    # every partition finished: proportional, exact sum (teardown spread)
    parts = dict(apportion_unit_bill(11.0, [("a", 6.0), ("b", 4.0)], []))
    assert parts["a"] == pytest.approx(6.6) and math.fsum(parts.values()) == pytest.approx(11.0)
    # the scheduler billed less than measured (whole seconds): scaled down, failed get nothing
    parts = dict(apportion_unit_bill(9.0, [("a", 6.0), ("b", 4.0)], ["bad"]))
    assert parts["bad"] == 0.0 and math.fsum(parts.values()) == pytest.approx(9.0)
    # nothing materialized: the failed share it equally
    assert apportion_unit_bill(4.0, [], ["x", "y"]) == [("x", 2.0), ("y", 2.0)]
    with pytest.raises(ValueError):
        apportion_unit_bill(1.0, [], [])


class _Store:
    def __init__(self, keys):
        self.keys = keys
        self.calls = 0

    def get_dynamic_partitions(self, name):
        self.calls += 1
        assert name == "files"
        return self.keys


def test_run_partition_keys_single_range_and_unpartitioned():
    store = _Store(["a", "b", "c", "d"])
    assert run_partition_keys(store, {"dagster/partition": "b"}, "files") == ("b",)
    tags = {"dagster/asset_partition_range_start": "b", "dagster/asset_partition_range_end": "d"}
    assert run_partition_keys(store, tags, "files") == ("b", "c", "d")
    assert run_partition_keys(store, {}, "files") == ()
    with pytest.raises(PartitionRangeError, match="zz"):
        keys_in_range(["a", "b"], "a", "zz")
    with pytest.raises(PartitionRangeError, match="before"):
        keys_in_range(["a", "b"], "b", "a")


def test_files_for_keys_resolves_without_listing_per_key(tmp_path, monkeypatch):
    for name, size in (("a.txt", 10), ("b.txt", 20), ("my file.txt", 30)):
        (tmp_path / name).write_bytes(b"x" * size)
    corpus = CorpusSource(str(tmp_path))
    listings = []
    real = CorpusSource._list  # what list_files and the lookup of keys not found directly both list through
    monkeypatch.setattr(CorpusSource, "_list", lambda self, wanted: listings.append(1) or real(self, wanted))
    files = corpus.files_for_keys(["a.txt", "b.txt"])
    assert {k: f.size_bytes for k, f in files.items()} == {"a.txt": 10, "b.txt": 20}
    assert listings == []  # each resolved by one info call
    # a rewritten key (space in the name) costs one listing for the whole call
    files = corpus.files_for_keys(["a.txt", "my_file.txt-" + CorpusSource(str(tmp_path)).list_files()[-1].key[-8:]])
    assert len(files) == 2
    listings.clear()
    many = corpus.files_for_keys(["a.txt", "b.txt"], max_direct_lookups=1)
    assert len(many) == 2 and listings == [1]
    with pytest.raises(CorpusNotFound, match="'gone'"):
        corpus.files_for_keys(["a.txt", "gone"])
    assert list(corpus.files_for_keys(["a.txt", "gone"], missing_ok=True)) == ["a.txt"]
