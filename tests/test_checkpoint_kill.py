"""Kill tests: a unit SIGKILLed at a random instant of a partition leaves a committed part or nothing, never a torn
one, and the output after the rerun is the uninterrupted run's, byte for byte (rows, vectors, metadata); a unit
sent SIGTERM stops gracefully (status 143), its embedded batches committed.

The SIGKILLed units are children forked by one ``tests/checkpoint_child.py zygote`` that loaded the packaged model
once (a checkpoint part per read batch of 16 records); each seed SIGKILLs its child after a random delay within
the time an uninterrupted child takes here (timed first, through the same zygote), then reruns the partition in
this process and compares the output with one clean reference.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.checkpoint_child import embed, load_test_model, write_corpus
from tests.process_helpers import alive

pytestmark = pytest.mark.exclusive  # the kill instants are drawn from a child timed here: no other test runs meanwhile (tests/host_locks.py)

SEEDS = range(20)
RECORDS = 80  # 74 kept records: 5 read batches of 16
ROOT = Path(__file__).resolve().parents[1]
_PARTS_AT_KILL: dict[int, int] = {}  # seed -> committed parts the kill left
_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "DAGSTER_GPU_CPU_SHARE": "0"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """(model, corpus, the clean output's bytes, seconds a clean run takes here)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_GPU_CPU_SHARE", "0")
        model = load_test_model()
        d = tmp_path_factory.mktemp("kill")
        src = write_corpus(d / "corpus.txt", RECORDS, max_words=16)
        t0 = time.perf_counter()
        embed(str(src), str(d / "clean.parquet"), model, checkpoint=False)
        yield model, src, (d / "clean.parquet").read_bytes(), time.perf_counter() - t0


@pytest.fixture(scope="module")
def zygote():
    proc = subprocess.Popen([sys.executable, "-m", "tests.checkpoint_child", "zygote"], cwd=ROOT, env=_ENV,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait(60)


def _gone(pid: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        assert time.monotonic() < deadline, f"child {pid} still alive"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def child_s(reference, zygote, tmp_path_factory):
    """Seconds a child of the zygote takes to embed the file uninterrupted, checkpoints on: the span the kills are
    drawn from. Timed on the children themselves, not on the in-process clean run, whose time says little about
    a forked child's (checkpoint parts written, its first batch's warm-up, the host's load at that moment)."""
    _, src, _, _ = reference
    out = tmp_path_factory.mktemp("timed") / "out.parquet"
    t0 = time.perf_counter()
    zygote.stdin.write(f"{src} {out}\n")
    zygote.stdin.flush()
    _gone(int(zygote.stdout.readline()), timeout_s=600)
    assert out.exists()
    return time.perf_counter() - t0


@pytest.mark.parametrize("seed", SEEDS)
def test_sigkill_at_a_random_instant_then_rerun_gives_the_clean_output(reference, zygote, child_s, tmp_path, seed):
    model, src, clean_bytes, _ = reference
    out = tmp_path / "out.parquet"
    zygote.stdin.write(f"{src} {out}\n")
    zygote.stdin.flush()
    pid = int(zygote.stdout.readline())
    time.sleep(random.Random(seed).uniform(0.0, 1.1 * child_s))
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # it finished first
        pass
    _gone(pid)
    parts = sorted(tmp_path.glob(".out.parquet.parts/*/part-*.parquet"))
    others = [p.name for p in tmp_path.glob(".out.parquet.parts/*/*") if p not in parts]
    assert all(n.startswith(".part-") and ".tmp-" in n for n in others), others  # only temp objects besides parts
    # the parts are 0 … k at any instant, also when the kill fell while the finished unit removed them (last first)
    assert [p.name for p in parts] == [f"part-{i:06d}.parquet" for i in range(len(parts))], parts
    committed_rows = sum(pq.read_metadata(p).num_rows for p in parts)  # each committed part reads back whole
    _PARTS_AT_KILL[seed] = len(parts)

    result = embed(str(src), str(out), model)
    assert result.resumed_rows == committed_rows
    assert out.read_bytes() == clean_bytes  # rows, order, vectors bit for bit, schema and its metadata
    assert [p.name for p in tmp_path.iterdir()] == ["out.parquet"]  # the parts are removed


def test_the_kills_fell_at_various_points_of_the_file():
    """The seeds above killed the child before any part, and after some parts (not only at the ends)."""
    if len(_PARTS_AT_KILL) < len(SEEDS):
        pytest.skip("run with the seeds above")
    counts = list(_PARTS_AT_KILL.values())
    assert any(0 < c < 4 for c in counts), counts
    assert len(set(counts)) >= 3, counts


def test_sigterm_stops_gracefully_with_the_embedded_batches_committed(reference, tmp_path):
    model, src, clean_bytes, _ = reference
    out, ready = tmp_path / "out.parquet", tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-m", "tests.checkpoint_child", str(src), str(out), str(ready), "graceful"],
                            cwd=ROOT, env=_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 600
    while not list(tmp_path.glob(".out.parquet.parts/*/part-000001.parquet")):  # two batches embedded
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    from dagster_gpu.worker.preemption import EXIT_PREEMPTED

    assert proc.returncode == EXIT_PREEMPTED == 143, output
    assert "s after SIGTERM" in output, output
    parts = sorted(tmp_path.glob(".out.parquet.parts/*/part-*.parquet"))
    committed = sum(pq.read_metadata(p).num_rows for p in parts)
    assert len(parts) >= 2 and f"preempted after {committed} records" in output, (output, committed)
    assert not out.exists() and not list(tmp_path.glob(".out.parquet.parts/*/.part-*"))  # nothing torn, no temp
    result = embed(str(src), str(out), model)
    assert result.resumed_rows == committed
    assert out.read_bytes() == clean_bytes
