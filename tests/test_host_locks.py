"""tests/host_locks.py: which shared things of the host a test holds, and the host lock's order (a waiting
exclusive test goes before shared tests that asked after it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from host_locks import _interleave, _kind, resources
from tests import slurm_helpers as SH

REPO = Path(__file__).resolve().parents[1]
SLURM_ALL = [f"slurm-{v}" for v in SH.tested_versions()]


def _item(file: str, marks=(), params=None):
    item = SimpleNamespace(path=Path("/x/tests") / file, iter_markers=lambda: [SimpleNamespace(name=m) for m in marks])
    if params is not None:
        item.callspec = SimpleNamespace(params=params)
    return item


@pytest.mark.parametrize("item, expected", [
    (_item("test_slurm_e2e.py", ("slurm", "e2e"), {"slurm_cluster": "24.11"}), ["slurm-24.11"]),
    (_item("test_auto_e2e.py", ("slurm", "k8s"), {"slurm_cluster": "22.05"}), ["k8s", "slurm-22.05"]),
    (_item("test_slurm_rest.py", ("e2e",), {"version": "v0.0.42"}), ["slurm-24.11"]),  # the live slurmrestd, unmarked
    (_item("test_retry_e2e.py", ("slurm",)), SLURM_ALL),
    (_item("test_k8s_node_agent.py"), ["k8s"]),
    (_item("test_slurm_ssh_e2e.py", ("slurm",), {"slurm_cluster": "22.05"}), ["slurm-22.05", "sshd"]),
    (_item("test_forkserver_e2e.py", ("e2e",)), ["forkserver"]),
    (_item("test_batching.py"), []),
    (_item("test_slurm_units.py"), []),  # recorded outputs: no cluster
    (_item("test_k8s_manifests.py"), []),
])
def test_what_a_test_holds(item, expected):
    assert resources(item) == expected


def test_files_alternate_between_clusters_and_the_rest():
    assert (_kind({"slurm-22.05", "k8s"}), _kind({"k8s"}), _kind({"sshd"}), _kind(set())) == ("slurm", "k8s", "other", "other")
    assert _interleave(_interleave(["s1", "s2", "s3"], ["k1"]), ["o1", "o2"]) == ["s1", "o1", "k1", "o2", "s2", "s3"]


_HOLDER = """
import sys, time
from contextlib import ExitStack
from host_locks import _host_lock
name, exclusive, hold_s = sys.argv[1], sys.argv[2] == "1", float(sys.argv[3])
with ExitStack() as stack:
    _host_lock(stack, exclusive)
    print(f"{name} {time.time():.3f}", flush=True)
    time.sleep(hold_s)
"""


def test_a_waiting_exclusive_test_goes_before_shared_ones_that_asked_after_it(tmp_path):
    env = {**os.environ, "DAGSTER_GPU_TEST_LOCKS": str(tmp_path), "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)])}

    def start(name: str, exclusive: bool, hold_s: float) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", _HOLDER, name, "1" if exclusive else "0", str(hold_s)],
                                env=env, stdout=subprocess.PIPE, text=True)

    reader = start("reader", False, 2.0)
    first = reader.stdout.readline()
    assert first.startswith("reader ")  # holds the host lock shared for 2 s
    writer = start("writer", True, 0.5)
    time.sleep(0.5)  # the writer waits for the reader now, holding the turnstile
    late = start("late", False, 0.0)
    out = dict([first.split()])
    for p in (reader, writer, late):
        out.update(line.split() for line in p.communicate(timeout=60)[0].splitlines())
        assert p.returncode == 0
    # the late reader asked while the writer waited: it got the lock only after the writer had it (and left it)
    assert float(out["reader"]) < float(out["writer"]) < float(out["late"])
    assert float(out["late"]) - float(out["writer"]) >= 0.4
