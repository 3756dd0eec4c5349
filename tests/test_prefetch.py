"""BatchPrefetcher: the reader thread and its bounded queue, on real files."""

from __future__ import annotations

import threading
import time

import pytest

from dagster_gpu.corpus.prefetch import BatchPrefetcher
from dagster_gpu.corpus.readers import CorpusReadError, TextFormat

FORTUNE = TextFormat(format="text", record_separator_line="%")


def fortune_file(path, records):
    path.write_text("".join(f"{r}\n%\n" for r in records), encoding="utf-8")
    return path


def reader_threads():
    return [t for t in threading.enumerate() if t.name == "dagster-gpu-reader"]


def test_batches_and_stats(tmp_path):
    src = fortune_file(tmp_path / "f", ["one", "", "two", "three", "  ", "four", "five"])
    with BatchPrefetcher(str(src), FORTUNE, read_batch_rows=2, depth=1) as p:
        batches = list(p)
    assert [b.ids for b in batches] == [[0, 2], [3, 5], [6]]
    assert [t for b in batches for t in b.texts] == ["one", "two", "three", "four", "five"]
    assert (p.stats.records, p.stats.skipped_empty, p.stats.kept) == (7, 2, 5)
    assert reader_threads() == []


def test_reads_ahead_of_the_consumer_but_no_more_than_depth(tmp_path):
    src = fortune_file(tmp_path / "f", [f"record {i}" for i in range(50)])
    p = BatchPrefetcher(str(src), FORTUNE, read_batch_rows=5, depth=2).start()
    try:
        it = iter(p)
        first = next(it)
        # the reader fills the queue (2 batches) and holds one more it cannot put: 4 batches read = 20 records
        deadline = time.monotonic() + 60  # a wait for the reader, not a speed assertion
        while p.stats.records < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # had it read past depth, the count would now exceed 20
        assert first.ids == [0, 1, 2, 3, 4]
        assert p.stats.records == 20
    finally:
        p.close()
    assert reader_threads() == []


def test_reader_error_is_raised_in_the_consumer(tmp_path):
    bad = tmp_path / "latin1 file"
    bad.write_bytes(b"fine record\n%\n" + "caf\u00e9\n%\n".encode("latin-1"))
    p = BatchPrefetcher(str(bad), FORTUNE, read_batch_rows=1)
    with pytest.raises(CorpusReadError) as e:
        for _ in p:  # starts the reader on first iteration
            pass
    assert str(bad) in str(e.value)
    p.close()


def test_missing_file_names_it(tmp_path):
    with BatchPrefetcher(str(tmp_path / "nope"), FORTUNE) as p:
        with pytest.raises(Exception) as e:
            list(p)
    assert "nope" in str(e.value)


def test_iterates_once_and_validates(tmp_path):
    src = fortune_file(tmp_path / "f", ["a"])
    with BatchPrefetcher(str(src), FORTUNE) as p:
        assert [b.texts for b in p] == [["a"]]
        with pytest.raises(RuntimeError, match="once"):
            list(p)
    with pytest.raises(ValueError, match="depth"):
        BatchPrefetcher(str(src), FORTUNE, depth=0)
