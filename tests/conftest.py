"""Shared fixtures: a PostgreSQL-backed Dagster instance (the server comes from resources/postgres/postgres.sh)."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from pipelines.instance_yaml import dagster_yaml
from tests import slurm_helpers as SH
from tests.processes import end_processes_using
from tests.ssh_helpers import short_dir

# Under CI=true (and in scripts/test.sh) a skipped end-to-end test fails the session (tests/strict_e2e.py);
# scripts/test.sh prints the session's failures once pytest has exited (tests/failure_summary.py); the clusters,
# the login node and the fork server are used by one test at a time across pytest-xdist workers (tests/host_locks.py).
pytest_plugins = ["strict_e2e", "failure_summary", "host_locks"]

REPO = Path(__file__).resolve().parents[1]
PG_SCRIPT = REPO / "resources" / "postgres" / "postgres.sh"
FORTUNES = Path("/usr/share/games/fortunes")


def fortune_records(name: str, n: int) -> list[str]:
    """The first ``n`` non-empty records of the Debian fortune file ``name`` (package fortunes, which
    scripts/setup.sh installs). Fails under CI=true when the package is missing, else skips."""
    if not (FORTUNES / name).is_file():
        if os.environ.get("CI") == "true":
            pytest.fail("the Debian fortunes package is not installed (scripts/setup.sh installs it)")
        pytest.skip("the Debian fortunes package is not installed")
    return [r for r in (FORTUNES / name).read_text(errors="replace").split("\n%\n") if r.strip()][:n]


@pytest.fixture(autouse=True)
def _no_defs_state_storage_of_an_earlier_test() -> None:
    """Each test starts with no current ``DefsStateStorage``. ``DagsterInstance.__enter__`` puts its instance's
    storage in a context variable (``dagster/_core/storage/defs_state/base.py``, ``_current_storage``), which
    keeps only a weak reference to the instance; once an earlier test's instance is gone, loading a code location
    in this process raises "Attempted to resolve undefined DagsterInstance weakref"."""
    from dagster._core.storage.defs_state import base

    base._current_storage.set(None)


def reimport(name: str):
    """Module ``name`` imported afresh (a code location that reads environment variables at import): what
    ``importlib.reload`` gives, also when another test in this process removed or replaced it in ``sys.modules``
    (``reload`` then refuses the module its package still holds)."""
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def pg_settings() -> dict[str, str]:
    """Start (idempotently) the private PostgreSQL server and return its connection settings."""
    subprocess.run(["bash", str(PG_SCRIPT), "start"], check=True, capture_output=True)
    out = subprocess.run(["bash", str(PG_SCRIPT), "env"], check=True, capture_output=True, text=True).stdout
    settings = dict(kv.split("=", 1) for kv in out.replace("export ", "").split())
    settings["DAGSTER_PG_PASSWORD"] = Path(settings["DAGSTER_PG_PASSWORD_FILE"]).read_text().strip()
    return settings


@pytest.fixture(scope="session")
def pg() -> dict[str, str]:
    return pg_settings()


@pytest.fixture(params=SH.tested_versions(), ids=lambda v: f"slurm-{v}")
def slurm_cluster(request, monkeypatch) -> Iterator[SH.SlurmCluster]:
    """Each local Slurm cluster in turn (22.05 from resources/slurm/cluster.sh, 24.11 from
    resources/slurm/trixie.sh; ``DAGSTER_GPU_SLURM_VERSIONS=22.05`` limits it to those named): sets SLURM_CONF, PATH (the 24.11 client wrappers first) and the worker
    interpreter for the test and the processes it starts. Skips with the reason when that cluster does not
    answer as its version (a failure under CI=true or DAGSTER_GPU_REQUIRE_SERVICES=1, tests/strict_e2e.py).
    Each test starts on an idle cluster (:func:`tests.slurm_helpers.idle_cluster`); the run workers it started
    and left running are killed when it ends."""
    cluster = SH.CLUSTERS[request.param]
    reason = SH.cluster_unavailable_reason(cluster)
    if reason:
        pytest.skip(f"Slurm {cluster.version}: {reason}")
    for k, v in cluster.env().items():
        monkeypatch.setenv(k, v)
    if not cluster.worker_python:
        monkeypatch.delenv(SH.WORKER_PYTHON_ENV, raising=False)
    left = SH.idle_cluster(cluster)
    if left:
        print(f"Slurm {cluster.version}: an earlier test left {left}; waited for them or cancelled them")
    yield cluster
    killed = SH.kill_started()
    if killed:
        print(f"killed run workers the test left running: {killed}")


@pytest.fixture
def runtime_dir(monkeypatch) -> Iterator[Path]:
    """A private ``$XDG_RUNTIME_DIR`` with a short path: a socket's path must stay under 108 bytes (``sun_path``),
    and pytest's tmp_path (under pytest-xdist, ``…/popen-gw1/<test name>``) can be longer."""
    d = Path(short_dir("dgf-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(d))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def instance_yaml(db: str, max_runs: int = 2) -> str:
    """dagster.yaml for a PostgreSQL instance; the password is an env var reference, never written out."""
    return dagster_yaml(db, max_runs=max_runs)


@contextmanager
def fresh_pg_home(pg: dict[str, str], tmp_path: Path, monkeypatch, max_runs: int = 2) -> Iterator[Path]:
    """A fresh PostgreSQL database and a DAGSTER_HOME on it (``max_runs`` concurrent runs) set in the
    environment; yields the home directory and drops the database afterwards."""
    import psycopg2

    db = f"t_{uuid.uuid4().hex[:12]}"
    conn = psycopg2.connect(
        host=pg["DAGSTER_PG_HOST"], port=pg["DAGSTER_PG_PORT"], user=pg["DAGSTER_PG_USER"],
        password=pg["DAGSTER_PG_PASSWORD"], dbname=pg["DAGSTER_PG_DB"],
    )
    conn.autocommit = True
    conn.cursor().execute(f"CREATE DATABASE {db}")
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(instance_yaml(db, max_runs=max_runs))
    for k, v in pg.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    try:
        yield home
    finally:
        # Every process on this instance ends first (a daemon, run or step worker left running would retry the
        # dropped database until it is killed): the dagster-daemon of a test that failed mid-way, a run worker the
        # daemon started, a step worker of the local backend in its own process group.
        left = end_processes_using(home)
        if left:
            print(f"ended the processes still using {home} before dropping its database: {left}")
        # Only our own sessions: an autovacuum worker in the database has no role, and terminating it needs a
        # superuser (CI saw "must be a superuser to terminate superuser process"); DROP DATABASE stops those.
        conn.cursor().execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND usename = current_user AND pid <> pg_backend_pid()", (db,))
        conn.cursor().execute(f"DROP DATABASE IF EXISTS {db}")
        conn.close()


@pytest.fixture
def pg_home(pg, tmp_path, monkeypatch):
    """A fresh database and DAGSTER_HOME for one test; yields the home directory."""
    with fresh_pg_home(pg, tmp_path, monkeypatch) as home:
        yield home


def expected_records(path: Path, separator_line: str = "%") -> list[tuple[int, str]]:
    """(ordinal, text) of every non-blank record, parsed independently of dagster_gpu's reader."""
    text = path.read_bytes().decode("utf-8")
    records, cur = [], []
    for line in text.splitlines():
        if line == separator_line:
            records.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    if cur:
        records.append("\n".join(cur))
    return [(i, r) for i, r in enumerate(records) if r.strip()]


@pytest.fixture(scope="session")
def s3():
    """The session's S3 endpoint: moto's threaded server (tests/s3_helpers.py), fake AWS credentials in the
    environment while it runs. One backend per process: each test module creates buckets of its own names."""
    from tests.s3_helpers import threaded_moto_s3

    with threaded_moto_s3() as endpoint:
        yield endpoint
