"""The fault benchmark's pure logic (bench/fault_plan.py): the seeded plan and how outcomes are counted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from fault_plan import FAULTS, fault_table, first_after, kills_for, plan_faults, summary_keys, tally  # noqa: E402


def test_kills_are_five_percent_of_the_units_and_at_least_one():
    assert [kills_for(n) for n in (0, 4, 20, 29, 30, 100)] == [1, 1, 1, 1, 2, 5]
    with pytest.raises(ValueError):
        kills_for(10, 1.5)


def test_plan_fires_every_fault_once_and_the_kill_per_unit_share_within_the_window():
    plan = plan_faults(seed=7, window_s=300, kills=2, lead_s=20)
    names = [f.name for f in plan]
    assert sorted(names) == sorted([*FAULTS, "worker_sigkill"])  # the kill twice, the rest once
    assert [f.label for f in plan if f.name == "worker_sigkill"] in (["worker_sigkill#1", "worker_sigkill#2"],
                                                                     ["worker_sigkill#2", "worker_sigkill#1"])
    assert all(20 <= f.at_s <= 300 for f in plan)
    assert [f.at_s for f in plan] == sorted(f.at_s for f in plan)


def test_plan_is_reproducible_from_its_seed():
    assert plan_faults(3, 200, 1) == plan_faults(3, 200, 1)
    assert plan_faults(3, 200, 1) != plan_faults(4, 200, 1)


@pytest.mark.parametrize("kw", [dict(window_s=10, lead_s=20), dict(kills=0), dict(faults=("meteor",))])
def test_plan_refuses_bad_arguments(kw):
    args = {"seed": 1, "window_s": 100, "kills": 1, **kw}
    with pytest.raises(ValueError):
        plan_faults(**args)


def test_tally_counts_once_duplicates_reasons_losses_and_recoveries():
    keys = ["a", "b", "c", "d", "e", "f"]
    mats = [("a", "r1"), ("b", "r1"), ("b", "r2"), ("b", "r3"),  # b three times: 1 duplicated partition, 2 extra events
            ("c", "r4"),                                        # c failed in the backfill, recovered by r4
            ("e", "r5")]                                        # e: the backfill lost it silently, recovered later
    end = {"a": ("ok", None), "b": ("ok", None), "c": ("failed", "worker SIGKILLed"),
           "d": ("failed", "slurm worker ended"), "e": ("running", None)}
    out = tally(keys, mats, end)  # f: no run of the backfill covered it, never materialized
    assert out.materialized_once == 3  # a, c, e
    assert out.duplicated == ["b"] and out.extra_materializations == 2
    assert out.failed_with_reason == ["c", "d"]
    assert out.lost_at_backfill_end == ["e", "f"]
    assert out.recovered == ["c", "e"]
    assert out.missing_after_recovery == ["d", "f"]
    assert out.partitions_lost == 3  # d, e, f: each once
    assert summary_keys(8, out, 2) == {"faults.injected": 8, "faults.partitions_lost": 3, "faults.duplicates": 1,
                                       "faults.leaked_objects": 2}


def test_first_materialization_after_a_fault_and_the_table():
    assert first_after([10.0, 12.5, 30.0], 11.0) == 1.5
    assert first_after([10.0], 11.0) is None and first_after([10.0], None) is None
    table = fault_table([{"fault": "etcd_restart", "at_s": 41.23, "outage_s": 3.0, "next_materialization_s": None,
                          "detail": "a|b"}])
    assert table.splitlines()[2] == "| etcd_restart | 41.2 | 3.0 | – | a/b |"
