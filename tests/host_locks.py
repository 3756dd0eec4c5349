"""pytest plugin (loaded by tests/conftest.py): what the tests share on this host is used by one test at a time,
so that the pytest-xdist workers ``scripts/test.sh`` starts never meet on it.

Shared here, each with a lock (``fcntl.flock`` on ``<name>.lock`` under ``$DAGSTER_GPU_TEST_LOCKS``, default
``/tmp/dagster-gpu-test-locks``), held from a test's first function-scoped fixture to its teardown:

- ``slurm-<version>``: a local Slurm cluster (its 4 GPUs, its queue, its accounting; tests start on an idle
  cluster and count what they submitted). A test parametrized by the ``slurm_cluster`` fixture holds its
  version's; any other test marked ``slurm`` holds every version's.
- ``k8s``: the Kubernetes control plane and its one node (its devices, ResourceSlice, pods): tests marked ``k8s``.
- The files in :data:`UNMARKED` use a cluster with neither marker: their tests hold it too.
- ``sshd``: the OpenSSH login node, whose log the ssh tests count connections in (``test_slurm_ssh*``).
- ``forkserver``: this checkout's fork server (one per key on the host; ``test_forkserver*``).

A test marked ``exclusive`` (it times a few seconds of this host's CPU) runs alone: it holds the ``host`` lock
exclusively where every other test holds it shared, behind a ``turnstile`` lock, so that a waiting exclusive
test is not starved by the other worker's next tests. Locks are taken in one order (``host``, then the
resources sorted by name), so two tests never wait on each other.

``scripts/test.sh`` runs pytest-xdist (``DAGSTER_GPU_TEST_WORKERS`` workers, default 2) with ``--dist loadfile``: a file's tests run in one worker, so module-scoped
fixtures (a model, a zygote process, a token) are set up once and module state stays in one process. Without
pytest-xdist the locks are taken all the same, never waited for.
"""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

LOCK_DIR_ENV = "DAGSTER_GPU_TEST_LOCKS"
EXCLUSIVE = "exclusive"


def _slurm_versions() -> list[str]:
    from tests.slurm_helpers import tested_versions

    return list(tested_versions())


#: Files whose tests use a cluster with no ``slurm`` or ``k8s`` marker (their fixtures check for the service).
UNMARKED = {"test_slurm_rest.py": ("slurm-24.11",), "test_k8s_node_agent.py": ("k8s",)}


def resources(item: pytest.Item) -> list[str]:
    """The shared things of the host ``item`` uses (see the module doc), sorted: the order they are locked in."""
    name = item.path.name
    marks = {m.name for m in item.iter_markers()}
    out: set[str] = set(UNMARKED.get(name, ()))
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "slurm_cluster" in callspec.params:
        out.add(f"slurm-{callspec.params['slurm_cluster']}")
    elif "slurm" in marks:
        out.update(f"slurm-{v}" for v in _slurm_versions())
    if "k8s" in marks:
        out.add("k8s")
    if name.startswith("test_slurm_ssh"):
        out.add("sshd")
    if name.startswith("test_forkserver"):
        out.add("forkserver")
    return sorted(out)


def _lock_dir() -> Path:
    d = Path(os.environ.get(LOCK_DIR_ENV) or "/tmp/dagster-gpu-test-locks")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _flock(stack: ExitStack, name: str, mode: int) -> float:
    """Lock ``name`` in ``mode`` until ``stack`` closes; returns the seconds waited for it."""
    f = stack.enter_context(open(_lock_dir() / f"{name}.lock", "a+"))
    t0 = time.monotonic()
    fcntl.flock(f.fileno(), mode)
    stack.callback(fcntl.flock, f.fileno(), fcntl.LOCK_UN)
    return time.monotonic() - t0


_module_holds_host = False  # a module marked ``exclusive`` holds the host lock for all its tests and fixtures


def _host_lock(stack: ExitStack, exclusive: bool) -> float:
    with ExitStack() as turnstile:  # released once the host lock is held: a waiting writer blocks new readers
        _flock(turnstile, "turnstile", fcntl.LOCK_EX)
        return _flock(stack, "host", fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)


@pytest.fixture(scope="module", autouse=True)
def _host_lock_of_an_exclusive_module(request: pytest.FixtureRequest):
    """A module marked ``exclusive`` (``pytestmark``) holds the host lock exclusively from its first fixture on:
    its module-scoped fixtures time the host too (a child's run the kill instants are drawn from)."""
    global _module_holds_host
    if request.node.get_closest_marker(EXCLUSIVE) is None:
        yield
        return
    with ExitStack() as stack:
        _host_lock(stack, exclusive=True)
        _module_holds_host = True
        try:
            yield
        finally:
            _module_holds_host = False


@pytest.fixture(autouse=True)
def _host_locks(request: pytest.FixtureRequest):
    """Holds the host lock (shared, or exclusive for a test marked ``exclusive``) and the test's resources."""
    names = resources(request.node)
    with ExitStack() as stack:
        waited = 0.0
        if not _module_holds_host:
            waited += _host_lock(stack, exclusive=request.node.get_closest_marker(EXCLUSIVE) is not None)
        for name in names:
            waited += _flock(stack, name, fcntl.LOCK_EX)
        if waited >= 1.0:
            print(f"host_locks: waited {waited:.1f} s for {', '.join(['host'] + names)}")
        yield



def _kind(names: set[str]) -> str:
    return "slurm" if any(n.startswith("slurm-") for n in names) else ("k8s" if "k8s" in names else "other")


def _interleave(*lists: list) -> list:
    out, n = [], max((len(x) for x in lists), default=0)
    for i in range(n):
        out.extend(x[i] for x in lists if i < len(x))
    return out


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist: files in the order ``--dist loadfile --no-loadscope-reorder`` hands them out as workers free up, each file's
    tests in their order: a file that uses a cluster (Slurm and Kubernetes ones alternately), then one that does not
    (end-to-end ones first), and so on. A worker then rarely waits for the cluster the other one holds, and the
    short files even out the end."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # one process: the files in their own (alphabetical) order
        return
    files: dict[Path, list[pytest.Item]] = {}
    uses: dict[Path, set[str]] = {}
    e2e: set[Path] = set()
    for item in items:
        files.setdefault(item.path, []).append(item)
        uses.setdefault(item.path, set()).update(resources(item))
        if item.get_closest_marker("e2e") is not None:
            e2e.add(item.path)
    by_kind: dict[str, list[Path]] = {"slurm": [], "k8s": [], "other": []}
    for path in files:
        by_kind[_kind(uses[path])].append(path)
    others = [p for p in by_kind["other"] if p in e2e] + [p for p in by_kind["other"] if p not in e2e]
    order = _interleave(_interleave(by_kind["slurm"], by_kind["k8s"]), others)
    items[:] = [item for path in order for item in files[path]]
