"""The partition ledger's three shared rules, each in its one home in dagster_gpu/partitions/:

- which keys a run may cover though not due (``partitions.status.bridgeable``),
- how many partitions one run covers (``partitions.run_ranges.max_partitions_per_run``),
- which keys need a run: missing or failed, none in flight (``partitions.status.missing_or_failed``),

and the corpus sensor, the missing-partitions schedule and ``dagster-gpu backfill`` reach them there only.
"""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg

from dagster_gpu.corpus.listing import CorpusFile
from dagster_gpu.partitions.run_ranges import UNBOUNDED_PER_RUN, max_partitions_per_run
from dagster_gpu.partitions.run_requests import ranged_run_requests
from dagster_gpu.partitions.status import bridgeable, missing_or_failed

PACKAGE = Path(__file__).resolve().parents[1] / "dagster_gpu"
PDEF = dg.DynamicPartitionsDefinition(name="rules_files")


def _file(key: str, size: int) -> CorpusFile:
    return CorpusFile(key=key, uri=f"/corpus/{key}.txt", relative_name=f"{key}.txt", size_bytes=size, version=f"v-{key}")


def _asset(policy: dg.BackfillPolicy | None) -> dg.AssetsDefinition:
    @dg.asset(partitions_def=PDEF, backfill_policy=policy)
    def rules_asset():
        return None

    return rules_asset


# materialized a b c d, failed c (a later run failed it), e never materialized, b and f in flight
STATUS = ({"a", "b", "c", "d"}, {"c"}, {"b", "f"})
KEYS = ["a", "b", "c", "d", "e", "f", "g"]


def test_bridgeable_keys_are_materialized_fine_not_in_flight_and_listed_with_their_bytes():
    files = [_file("a", 100), _file("b", 200), _file("c", 300), _file("e", 500), _file("g", 700)]
    # d is fine but gone from the listing; b is in flight; c failed; e and g were never materialized
    assert bridgeable(files, STATUS) == {"a": 100}
    assert bridgeable([_file("d", 4_096), _file("a", 1)], STATUS) == {"d": 4_096, "a": 1}
    assert bridgeable([], STATUS) == {}


def test_partitions_per_run_follow_the_backfill_policy():
    assert max_partitions_per_run(_asset(None)) == 1
    assert max_partitions_per_run(_asset(dg.BackfillPolicy.multi_run(7))) == 7
    assert max_partitions_per_run(_asset(dg.BackfillPolicy.single_run())) == UNBOUNDED_PER_RUN == 2**31 - 1


def test_run_requests_cut_ranges_at_the_assets_partitions_per_run():
    keys = [f"k{i}" for i in range(7)]
    reqs = ranged_run_requests(_asset(dg.BackfillPolicy.multi_run(3)), keys, keys)
    assert [r.run_key for r in reqs] == ["k0..k2", "k3..k5", "k6..k6"]
    assert reqs[0].tags == {"dagster/asset_partition_range_start": "k0", "dagster/asset_partition_range_end": "k2"}
    assert reqs[2].partition_key == "k6"
    assert [r.run_key for r in ranged_run_requests(_asset(None), keys[:2], keys[:2])] == ["k0..k0", "k1..k1"]


def test_missing_or_failed_keeps_the_order_and_leaves_what_is_in_flight():
    assert missing_or_failed(KEYS, STATUS) == ["c", "e", "g"]
    assert missing_or_failed(KEYS, STATUS, failed=False) == ["e", "g"]
    assert missing_or_failed(KEYS, STATUS, missing=False) == ["c"]
    assert missing_or_failed(KEYS, STATUS, missing=False, failed=False) == []
    assert missing_or_failed(list(reversed(KEYS)), STATUS) == ["g", "e", "c"]


def _sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in PACKAGE.rglob("*.py")}


def _where(pattern: str) -> list[str]:
    return sorted(name for name, text in _sources().items() if re.search(pattern, text))


def test_each_rule_is_written_once_in_its_home():
    # (b) the unbounded "single_run" limit and the reading of the policy's limit
    assert _where(r"2\s*\*\*\s*31") == ["partitions/run_ranges.py"]
    assert _where(r"max_partitions_per_run if \w+\.backfill_policy else 1") == []
    # (a) materialized, not failed, not in flight: the bridgeable keys
    assert _where(r"in materialized and \w+\.key not in failed") == ["partitions/status.py"]
    # (c) missing or failed, none in flight
    assert _where(r"not in in_progress\s+and\s+\(+\s*(\w+ and )?k not in materialized") == ["partitions/status.py"]
    for caller in ("definitions/sensors.py", "definitions/partitions.py"):
        text = _sources()[caller]
        assert "missing_or_failed(" in text and "bridgeable(" in text, caller
