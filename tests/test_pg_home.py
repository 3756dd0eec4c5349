"""The test instance's database is dropped only after every process using that instance ended: a process left
running (a daemon, a run worker, a step worker in its own process group) would otherwise retry the dropped database
(``database "t_…" does not exist``) after the test, and after pytest's summary."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import psycopg2

from tests.conftest import fresh_pg_home
from tests.processes import processes_using

#: A process that holds a session on the instance's database and reconnects when it is ended, as a Dagster daemon
#: polling its storage does; it prints once it holds its first session, and when it gets SIGTERM.
_POLLER = r"""
import os, signal, sys, time, psycopg2
db = sys.argv[1]
signal.signal(signal.SIGTERM, lambda *_: (print("SIGTERM", flush=True), os._exit(0)))
while True:
    try:
        conn = psycopg2.connect(host=os.environ["DAGSTER_PG_HOST"], port=os.environ["DAGSTER_PG_PORT"],
                                user=os.environ["DAGSTER_PG_USER"], password=os.environ["DAGSTER_PG_PASSWORD"], dbname=db)
        conn.cursor().execute("SELECT 1")
        print("connected", flush=True)
        while True:
            conn.cursor().execute("SELECT 1")
            time.sleep(0.2)
    except psycopg2.Error:
        time.sleep(0.2)
"""


def _database(home) -> str:
    text = (home / "dagster.yaml").read_text()
    return next(w for w in text.replace('"', " ").replace("'", " ").split() if w.startswith("t_"))


def _exists(pg, db: str) -> bool:
    conn = psycopg2.connect(host=pg["DAGSTER_PG_HOST"], port=pg["DAGSTER_PG_PORT"], user=pg["DAGSTER_PG_USER"],
                            password=pg["DAGSTER_PG_PASSWORD"], dbname=pg["DAGSTER_PG_DB"])
    try:
        cur = conn.cursor()
        cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,))
        return cur.fetchone() is not None
    finally:
        conn.close()


def test_processes_using_the_instance_end_before_its_database_is_dropped(pg, tmp_path, monkeypatch):
    unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                 env={**os.environ, "DAGSTER_HOME": str(tmp_path / "another_home")})
    try:
        with fresh_pg_home(pg, tmp_path, monkeypatch) as home:
            db = _database(home)
            assert _exists(pg, db)
            env = {**os.environ, "DAGSTER_HOME": str(home)}
            daemon = subprocess.Popen([sys.executable, "-c", _POLLER, db], env=env, stdout=subprocess.PIPE, text=True)
            # a step worker of the local backend: its own session and process group, outside the test's
            worker = subprocess.Popen([sys.executable, "-c", _POLLER, db], env=env, stdout=subprocess.PIPE, text=True,
                                      start_new_session=True)
            assert daemon.stdout.readline() == "connected\n" and worker.stdout.readline() == "connected\n"
            assert {p.pid for p in processes_using(home)} == {daemon.pid, worker.pid}
        # ended (and reaped) by the fixture before it returned: SIGTERM first
        assert not psutil.pid_exists(daemon.pid) and not psutil.pid_exists(worker.pid)
        assert daemon.stdout.read() == "SIGTERM\n" and worker.stdout.read() == "SIGTERM\n"
        assert not _exists(pg, db)
        assert unrelated.poll() is None, "a process of another instance was ended"
    finally:
        for p in (unrelated,):
            p.kill()
            p.wait()
