"""The unit-size rules (pure): a unit's useful fraction, the corpus sensor's hold decision, bridging scattered
partitions into one ranged run."""

from __future__ import annotations

import pytest

from dagster_gpu.policy.batching import Held, UnitCost, bridge_ranges, hold_decision

# the packaged calibration's start-up and per-partition seconds; 1 µs of embedding per byte
COST = UnitCost(startup_s=15.719, per_partition_s=1.032, seconds_per_byte=1e-6)


def test_useful_fraction_is_embedding_over_billed_seconds():
    assert COST.useful_fraction([]) == 0.0
    # 1 MB: 1 s of embedding + 1.032 s of the partition's read/write, 15.719 + 2.032 billed
    assert COST.useful_fraction([1_000_000]) == pytest.approx(2.032 / 17.751)
    # 40 MB in 4 files: (40 + 4.128) / (15.719 + 4.128 + 40)
    assert COST.useful_fraction([10_000_000] * 4) == pytest.approx(44.128 / 59.847)
    with pytest.raises(ValueError):
        UnitCost(1.0, 0.0, 0.0)
    with pytest.raises(ValueError):
        UnitCost(-1.0, 0.0, 1e-6)


def test_hold_until_target_or_max_delay():
    small = [Held("a", "v1", 3_000, since=1000.0), Held("b", "v1", 1_200_000, since=1030.0)]
    d = hold_decision(small, now=1040.0, cost=COST, target_useful_fraction=0.5, max_delay_s=300)
    assert not d.release
    assert d.useful_fraction == pytest.approx((1.203 + 2 * 1.032) / (15.719 + 2 * 1.032 + 1.203))
    assert d.why == "held 2 files, 1.2 MB: a unit now would be 17 % useful (target 50 %); oldest waited 40 s of 300"
    late = hold_decision(small, now=1300.0, cost=COST, target_useful_fraction=0.5, max_delay_s=300)
    assert late.release and late.why == ("requested 2 files, 1.2 MB in 1 unit (max delay reached): 17 % useful (target 50 %); "
                                      "oldest waited 300 s of 300")
    big = small + [Held("c", "v2", 15_000_000, since=1039.0)]
    enough = hold_decision(big, now=1040.0, cost=COST, target_useful_fraction=0.5, max_delay_s=300)
    assert enough.release and enough.useful_fraction >= 0.5 and "max delay" not in enough.why
    assert [h.key for h in enough.released] == ["a", "b", "c"] and enough.kept == ()
    with pytest.raises(ValueError):
        hold_decision([], 0.0, COST, 0.5, 300)
    with pytest.raises(ValueError):
        hold_decision(small, 0.0, COST, 0.0, 300)
    with pytest.raises(ValueError):
        hold_decision(small, 0.0, COST, 0.5, 300, max_per_unit=0)


def test_hold_releases_whole_units_and_holds_the_remainder():
    # 14 files of 1 kB at 5 s spacing, units of at most 10 (the asset's max_partitions_per_run); 1.033 s a file
    files = [Held(f"f{i:02d}", "v1", 1_000, since=1000.0 + 5 * i) for i in range(14)]
    cost = UnitCost(startup_s=8.0, per_partition_s=1.0, seconds_per_byte=1e-6)
    # a unit of 10: 10.01 / 18.01 = 56 % >= 50 %: released; the 4 after it (4.004 / 12.004 = 33 %) are held on
    d = hold_decision(files, now=1070.0, cost=cost, target_useful_fraction=0.5, max_delay_s=120, max_per_unit=10)
    assert [h.key for h in d.released] == [f"f{i:02d}" for i in range(10)]
    assert [h.key for h in d.kept] == ["f10", "f11", "f12", "f13"]
    assert d.why == ("requested 10 files, 10.0 kB in 1 unit: 56 % useful (target 50 %); oldest waited 70 s of 120; "
                     "held on 4 files, 4.0 kB: a unit now would be 33 % useful (target 50 %); oldest waited 20 s of 120")
    # the remainder goes once its oldest has waited out the delay, alone
    late = hold_decision(files[10:], now=1170.0, cost=cost, target_useful_fraction=0.5, max_delay_s=120, max_per_unit=10)
    assert len(late.released) == 4 and late.kept == () and "(max delay reached)" in late.why
    # a target no unit of 3 can reach: units go by age only, oldest first, whole units while each is due
    slow = UnitCost(startup_s=100.0, per_partition_s=1.0, seconds_per_byte=1e-6)
    d = hold_decision(files, now=1135.0, cost=slow, target_useful_fraction=0.5, max_delay_s=120, max_per_unit=3)
    # unit f00-f02 (oldest 135 s), f03-f05 (120 s) due; f06-f08 (oldest 105 s) not: it and all after are held on
    assert [h.key for h in d.released] == [f"f{i:02d}" for i in range(6)] and len(d.kept) == 8
    assert d.why.startswith("requested 6 files, 6.0 kB in 2 units (max delay reached): 3 %, 3 % useful (target 50 %); "
                            "oldest waited 135 s of 120; held on 3 files, 3.0 kB: a unit now would be 3 % useful")
    assert d.units == (("f00", "f01", "f02"), ("f03", "f04", "f05"))
    # the order is by age, whatever order the listing gave
    d = hold_decision(list(reversed(files)), now=1070.0, cost=cost, target_useful_fraction=0.5, max_delay_s=120, max_per_unit=10)
    assert [h.key for h in d.released] == [f"f{i:02d}" for i in range(10)]


def test_bridge_merges_only_cheap_fine_gaps():
    keys = ["a", "b", "c", "d", "e", "f", "g"]
    # without a cost: contiguous ranges only
    assert bridge_ranges(keys, ["a", "c", "d", "g"], 50) == [("a",), ("c", "d"), ("g",)]
    fine = {k: 1_000 for k in keys}
    # b (1 kB: 1.033 s to redo) < 15.7 s start-up: one run a..d; e, f (2.066 s) too: one run a..g
    assert bridge_ranges(keys, ["a", "c", "d", "g"], 50, bridgeable=fine, cost=COST) == [tuple(keys)]
    # f is in flight (not bridgeable): g stays apart
    not_f = {k: v for k, v in fine.items() if k != "f"}
    assert bridge_ranges(keys, ["a", "c", "d", "g"], 50, bridgeable=not_f, cost=COST) == [("a", "b", "c", "d"), ("g",)]
    # a 20 MB gap file costs 21 s to redo in full: more than a start-up, no bridge
    big_b = {**fine, "b": 20_000_000}
    assert bridge_ranges(keys, ["a", "c"], 50, bridgeable=big_b, cost=COST) == [("a",), ("c",)]
    # the merged run stays within max_per_run
    assert bridge_ranges(keys, ["a", "c", "g"], 3, bridgeable=fine, cost=COST) == [("a", "b", "c"), ("g",)]
    with pytest.raises(ValueError):
        bridge_ranges(keys, ["a"], 0)


def test_trickle_prices_the_knob_off_and_on():
    from dagster_gpu.policy.batching import trickle

    cost = UnitCost(15.719, 1.032, 1e-4)  # a 2 kB file: 0.2 s of embedding
    off = trickle(5, 2000, cost, rate_usd_per_hour=0.36, tick_s=30)
    # a tick finds 6 files: 2880 units a day, each 15.719 + 6 × 1.232 s
    assert off.files_per_unit == 6 and off.units_per_day == pytest.approx(2880)
    assert off.useful_fraction == pytest.approx(7.392 / 23.111)
    assert off.billed_s_per_day == pytest.approx(2880 * 23.111)
    assert off.cost_usd_per_day == pytest.approx(2880 * 23.111 * 0.36 / 3600)
    on = trickle(5, 2000, cost, rate_usd_per_hour=0.36, tick_s=30, max_delay_s=120)
    # 13 files (the fewest reaching 50 %: 13 × 1.232 >= 15.719) arrive in 60 s, within the 120 s delay
    assert on.files_per_unit == 13 and on.useful_fraction >= 0.5 and on.cost_usd_per_day < off.cost_usd_per_day
    assert on.freshness_mean_s == pytest.approx(12 * 5 / 2 + 15 + 15.719 + 13 * 1.232)
    # a short delay caps the wait: in 30 s the first file and 6 more gather
    assert trickle(5, 2000, cost, rate_usd_per_hour=0.36, tick_s=30, max_delay_s=30).files_per_unit == 7
    # runs of at most 10 partitions: 10 files a unit, 1728 units a day, 12.32 / 28.039 useful
    capped = trickle(5, 2000, cost, rate_usd_per_hour=0.36, tick_s=30, max_delay_s=120, max_per_unit=10)
    assert (capped.files_per_unit, capped.units_per_day) == (10, pytest.approx(1728))
    assert capped.useful_fraction == pytest.approx(12.32 / 28.039)
    with pytest.raises(ValueError):
        trickle(0, 2000, cost, rate_usd_per_hour=0.36)
    with pytest.raises(ValueError):
        trickle(5, 2000, cost, rate_usd_per_hour=0.36, max_per_unit=0)


def test_whatif_trickle_json(tmp_path, capsys):
    import json

    from dagster_gpu.commands.whatif import whatif_main

    hist = tmp_path / "history.json"
    hist.write_text(json.dumps([{"rows": 10, "texts_per_second": 50.0, "bytes": 2000, "product": "cpu"}]))
    assert whatif_main(["--trickle-every", "5", "--file-bytes", "2000", "--max-delay", "120", "--history", str(hist), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["trickle"]
    assert [(r["max_delay_seconds"], r["files_per_unit"]) for r in rows] == [(None, 6), (120.0, 13)]
    assert rows[1]["useful_fraction"] >= 0.5 > rows[0]["useful_fraction"]
    assert rows[1]["cost_usd_per_day"] < rows[0]["cost_usd_per_day"]


def test_learned_overheads_are_medians_of_what_units_paid_beyond_their_partitions():
    from dagster_gpu.policy.batching import UnitSample, learned_overheads

    assert learned_overheads([], 1e-6) is None
    # figures of the trickle bench's units (docs/benchmarks.md): a cold unit of 16 files, forked units of 20 and 24
    units = [UnitSample(16, 12.93, 2.63, 16 * 700), UnitSample(20, 5.94, 3.71, 20 * 700), UnitSample(24, 6.70, 4.30, 24 * 700)]
    startup, per_partition = learned_overheads(units, seconds_per_byte=1e-4)  # 700 bytes: 0.07 s of embedding
    assert startup == pytest.approx(6.70 - 4.30)  # the median of 10.30, 2.23, 2.40: one cold start does not move it
    assert per_partition == pytest.approx((4.30 - 1.68) / 24)  # the median of 0.0944, 0.1155, 0.1092 s
    # a unit whose useful seconds exceed what it was billed (clock rounding) counts as no start-up
    assert learned_overheads([UnitSample(1, 1.0, 1.2, 0)], 1e-6) == (0.0, pytest.approx(1.2))


def test_whatif_trickle_with_a_fork_servers_start_up(tmp_path, capsys):
    import json

    from dagster_gpu.commands.whatif import whatif_main

    hist = tmp_path / "history.json"
    hist.write_text(json.dumps([{"rows": 10, "texts_per_second": 50.0, "bytes": 2000, "product": "cpu"}]))
    base = ["--trickle-every", "5", "--file-bytes", "2000", "--max-delay", "120", "--history", str(hist), "--json"]
    assert whatif_main([*base, "--startup-seconds", "2"]) == 0
    rows = json.loads(capsys.readouterr().out)["trickle"]
    # 2 s of start-up: 2 files (0.4 s embedding + 2 x 1.032 s a partition: 2.464 / 4.464) already reach 50 %,
    # fewer than a 30 s tick brings, so the knob changes nothing: 6 files a unit either way
    assert [(r["max_delay_seconds"], r["files_per_unit"]) for r in rows] == [(None, 6), (120.0, 6)]
    assert rows[0]["cost_source"].startswith("start-up 2.0 s, 1.03 s a partition (--startup-seconds, unit_startup.json)")


def test_each_unit_is_priced_as_it_will_run_with_reuse_counted_as_reuse():
    # a new file and a changed one whose earlier 29 MB are reused, in two runs (their keys are not consecutive)
    a = Held("a", "v1", 30_000_000, since=1000.0)
    b = Held("b", "v2", 30_000_000, since=1000.0, reused_bytes=29_000_000)
    d = hold_decision([a, b], now=1010.0, cost=COST, target_useful_fraction=0.5, max_delay_s=300, units=[("a",), ("b",)])
    # a: 30 s of embedding + 1.032 over 15.719 more: released; b: 1 s + 1.032: held (priced as one unit of
    # 60 MB, both would read 80 % and launch as two runs)
    assert d.units == (("a",),) and [h.key for h in d.released] == ["a"] and [h.key for h in d.kept] == ["b"]
    assert d.unit_fractions == (pytest.approx(31.032 / 46.751),) and d.useful_fraction == d.unit_fractions[0]
    assert d.why == ("requested 1 file, 30.0 MB in 1 unit: 66 % useful (target 50 %); oldest waited 10 s of 300; "
                     "held on 1 file, 30.0 MB: a unit now would be 11 % useful (target 50 %, 29.0 MB of it reused); "
                     "oldest waited 10 s of 300")
    # a bridged key in a unit: its partition's overhead counts, its bytes are reuse
    c = Held("c", "v1", 1_000_000, since=1000.0)
    d = hold_decision([a, c], now=1010.0, cost=COST, target_useful_fraction=0.5, max_delay_s=300,
                      units=[("a", "x", "c")], bridged={"x": 5_000_000})
    assert d.units == (("a", "x", "c"),)
    assert d.unit_fractions == (pytest.approx((31.0 + 3 * 1.032) / (15.719 + 31.0 + 3 * 1.032)),)
    assert d.why.startswith("requested 2 files, 31.0 MB in 1 unit: 68 % useful (target 50 %, 5.0 MB of it reused)")
    with pytest.raises(ValueError, match="leave held files out \\['c'\\]"):
        hold_decision([a, c], now=1010.0, cost=COST, target_useful_fraction=0.5, max_delay_s=300, units=[("a",)])
    with pytest.raises(ValueError, match="neither held nor bridged \\['z'\\]"):
        hold_decision([a], now=1010.0, cost=COST, target_useful_fraction=0.5, max_delay_s=300, units=[("a", "z")])
    assert COST.useful_fraction([1_000_000], reused_bytes=1_000_000) == pytest.approx(1.032 / 16.751)
