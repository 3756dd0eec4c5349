"""The work unit's lines in the worker's log: a partition's start, its heartbeat while it runs, its end."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest

from dagster_gpu.worker.unit_log import HANDLER_NAME, PartitionWatch, unit_logger


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def log():
    logger = logging.getLogger("test_unit_log")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    h = Lines()
    logger.addHandler(h)
    yield logger, h.lines
    logger.removeHandler(h)


def test_a_long_partition_logs_its_start_heartbeats_and_end(log):
    logger, lines = log
    shard = SimpleNamespace(records=4508)
    src = SimpleNamespace(uri="/corpus/big.changelog", size_bytes=2_000_000, shard=shard)
    with PartitionWatch("big.changelog", 2, 48, src, every_s=0.05, logger=logger) as w:
        w.on_batch(1200)
        time.sleep(0.3)  # the heartbeat thread's clock, not an assertion on speed
        w.on_batch(4508)
    assert lines[0] == "partition 'big.changelog' (3/48) started: /corpus/big.changelog (2000000 bytes)"
    beats = [ln for ln in lines if "still embedding" in ln]
    assert beats and beats[0].startswith("partition 'big.changelog' (3/48) still embedding: 1200 records of 4508 encoded, ")
    assert lines[-1].startswith("partition 'big.changelog' (3/48) finished in ") and lines[-1].endswith(
        ": 4508 records of 4508 encoded")


def test_a_failed_partition_says_why_and_stops_its_heartbeat(log):
    logger, lines = log
    with pytest.raises(ValueError):
        with PartitionWatch("bad.jsonl", 0, 1, SimpleNamespace(uri="/c/bad.jsonl", size_bytes=10), every_s=60, logger=logger):
            raise ValueError("line 3 is not valid JSON")
    assert lines[0] == "partition 'bad.jsonl' (1/1) started: /c/bad.jsonl (10 bytes)"
    assert lines[1].startswith("partition 'bad.jsonl' (1/1) failed after ") and lines[1].endswith(
        "s: ValueError: line 3 is not valid JSON")
    assert len(lines) == 2  # no heartbeat after the end


def test_the_lines_go_to_stderr_once():
    a, b = unit_logger(), unit_logger()
    ours = [h for h in a.handlers if h.get_name() == HANDLER_NAME]
    assert a is b and len(ours) == 1 and type(ours[0]) is logging.StreamHandler and not a.propagate and a.level == logging.INFO
