"""Kill tests: a unit SIGKILLed at a random instant of a partition leaves a committed part or nothing, never a torn
one, and the output after the rerun is the uninterrupted run's, byte for byte (rows, vectors, metadata).

Each seed starts ``tests/checkpoint_child.py`` (the packaged model on CPU, a checkpoint part per read batch of 16
records), waits until its model is loaded, SIGKILLs it after a random delay within the time a clean run of the
file takes here, then reruns the partition in this process and compares the output with one clean reference.
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

SEEDS = range(20)
RECORDS = 300  # 277 kept records: 18 read batches
ROOT = Path(__file__).resolve().parents[1]
_PARTS_AT_KILL: dict[int, int] = {}  # seed -> committed parts the kill left


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """(model, corpus, the clean output's bytes, seconds a clean run takes here)."""
    os.environ["DAGSTER_GPU_CPU_SHARE"] = "0"
    model = load_test_model()
    d = tmp_path_factory.mktemp("kill")
    src = write_corpus(d / "corpus.txt", RECORDS)
    t0 = time.perf_counter()
    embed(str(src), str(d / "clean.parquet"), model, checkpoint=False)
    return model, src, (d / "clean.parquet").read_bytes(), time.perf_counter() - t0


def _child(src: Path, out: Path, ready: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "DAGSTER_GPU_CPU_SHARE": "0"}
    return subprocess.Popen([sys.executable, "-m", "tests.checkpoint_child", str(src), str(out), str(ready), *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_ready(proc: subprocess.Popen, ready: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if proc.poll() is not None:
            pytest.fail(f"child exited {proc.returncode} before it was ready:\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("child not ready in time")
        time.sleep(0.005)


@pytest.mark.parametrize("seed", SEEDS)
def test_sigkill_at_a_random_instant_then_rerun_gives_the_clean_output(reference, tmp_path, seed):
    model, src, clean_bytes, clean_s = reference
    out, ready = tmp_path / "out.parquet", tmp_path / "ready"
    proc = _child(src, out, ready)
    _wait_ready(proc, ready)
    time.sleep(random.Random(seed).uniform(0.0, 1.2 * clean_s))
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    parts = sorted(tmp_path.glob(".out.parquet.parts/*/part-*.parquet"))
    others = [p.name for p in tmp_path.glob(".out.parquet.parts/*/*") if p not in parts]
    assert all(n.startswith(".part-") and ".tmp-" in n for n in others), others  # only temp objects besides parts
    committed_rows = sum(pq.read_metadata(p).num_rows for p in parts)  # each committed part reads back whole
    _PARTS_AT_KILL[seed] = len(parts)

    result = embed(str(src), str(out), model)
    assert result.resumed_rows == committed_rows
    assert out.read_bytes() == clean_bytes  # rows, order, vectors bit for bit, schema and its metadata
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet", "ready"]  # parts removed


def test_the_kills_fell_at_various_points_of_the_file():
    """The seeds above killed the child before any part, and after some parts (not only at the ends)."""
    if len(_PARTS_AT_KILL) < len(SEEDS):
        pytest.skip("run with the seeds above")
    counts = list(_PARTS_AT_KILL.values())
    assert any(0 < c < 17 for c in counts), counts
    assert len(set(counts)) >= 4, counts
