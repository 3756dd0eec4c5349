"""EmbedAhead: a unit's embedding loop on a thread, its partitions handed over in order through a bounded queue.

Real corpus files and real BatchPrefetchers; ``embed_one`` stands in for the encoder (it returns the texts it
read), so what is tested is the hand-over: order, per-partition failures, intervals, bounded look-ahead, stop.
"""

from __future__ import annotations

import threading
import time

import pytest

from dagster_gpu.corpus.listing import CorpusFile
from dagster_gpu.corpus.prefetch import BatchPrefetcher
from dagster_gpu.corpus.readers import TextFormat
from dagster_gpu.worker.embed_ahead import EmbedAhead

FORTUNE = TextFormat(format="text", record_separator_line="%")


def corpus(tmp_path, n, bad=()):
    items = []
    for i in range(n):
        p = tmp_path / f"f{i:02d}.txt"
        if i in bad:
            p.write_bytes(b"ok\n%\ncaf\xe9\n%\n")  # latin-1: not valid utf-8
        else:
            p.write_text(f"record {i} a\n%\nrecord {i} b\n%\n", encoding="utf-8")
        items.append((p.name, CorpusFile(key=p.name, uri=str(p), relative_name=p.name, size_bytes=p.stat().st_size, mtime=0.0)))
    return items


def prefetch(source):
    return BatchPrefetcher(source.uri, FORTUNE, 16).start()


def read_all(key, source, reader):
    return [t for b in reader for t in b.texts], "telemetry"


def threads(name="dagster-gpu-embed"):
    return [t for t in threading.enumerate() if t.name in (name, "dagster-gpu-reader")]


def test_partitions_in_order_with_their_results_and_intervals(tmp_path):
    items = corpus(tmp_path, 5)
    ready = time.time()
    got = list(EmbedAhead(items, read_all, prefetch, ready).start())
    assert [d.key for d in got] == [k for k, _ in items]
    assert [d.index for d in got] == [0, 1, 2, 3, 4]
    assert got[3].result == ["record 3 a", "record 3 b"]
    assert all(d.error is None and d.telemetry == "telemetry" for d in got)
    # the intervals tile the span from `ready` to the last partition's end: nothing counted twice or lost
    span = time.time() - ready
    assert 0 < sum(d.interval_s for d in got) <= span
    assert threads() == []


def test_a_bad_file_fails_alone_and_is_not_retryable(tmp_path):
    items = corpus(tmp_path, 4, bad={1})
    got = list(EmbedAhead(items, read_all, prefetch, time.time()).start())
    assert [d.key for d in got] == ["f00.txt", "f01.txt", "f02.txt", "f03.txt"]
    assert got[1].result is None and got[1].retryable is False
    assert "f01.txt" in got[1].error and "utf-8" in got[1].error
    assert [d.result for d in got if d.key != "f01.txt"][2] == ["record 3 a", "record 3 b"]


def test_an_unexpected_error_fails_its_partition_retryably(tmp_path):
    items = corpus(tmp_path, 3)

    def flaky(key, source, reader):
        if key == "f00.txt":
            raise MemoryError("device out of memory")
        return read_all(key, source, reader)

    got = list(EmbedAhead(items, flaky, prefetch, time.time()).start())
    assert got[0].error == "partition 'f00.txt': MemoryError: device out of memory" and got[0].retryable
    assert got[1].result == ["record 1 a", "record 1 b"]


def test_looks_ahead_at_most_depth_partitions(tmp_path):
    items = corpus(tmp_path, 8)
    embedded = []

    def record(key, source, reader):
        embedded.append(key)
        return read_all(key, source, reader)

    ahead = EmbedAhead(items, record, prefetch, time.time(), depth=2).start()
    it = iter(ahead)
    first = next(it)
    deadline = time.monotonic() + 60  # waits for the thread, not a speed assertion
    while len(embedded) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # had it run past depth, more would be embedded by now
    # one handed over, two in the queue, one finished and waiting to be put
    assert first.key == "f00.txt" and len(embedded) == 4
    ahead.close()
    assert threads() == []


def test_close_stops_the_thread_early(tmp_path):
    items = corpus(tmp_path, 6)
    ahead = EmbedAhead(items, read_all, prefetch, time.time(), depth=1).start()
    next(iter(ahead))
    ahead.close()
    assert threads() == []


def test_a_crash_of_the_loop_itself_is_raised_in_the_consumer(tmp_path):
    items = corpus(tmp_path, 2)

    def broken_prefetch(source):
        raise OSError(f"cannot open {source.uri}")

    with pytest.raises(OSError, match="f00.txt"):
        list(EmbedAhead(items, read_all, broken_prefetch, time.time()).start())
