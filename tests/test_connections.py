"""hold_storage_connections on a real PostgreSQL instance: a process that works through a ranged run (its
unit, or the run worker polling the run's events) opens one connection per storage, not one per query."""

from __future__ import annotations

import dagster as dg
import sqlalchemy

from dagster_gpu.instance.connections import hold_storage_connections


def _connections_opened(instance: dg.DagsterInstance, queries: int) -> int:
    """New DBAPI connections the event log storage opens for ``queries`` reads of a run's events."""
    engine = instance.event_log_storage._engine  # noqa: SLF001 - the storage's own engine
    opened = []

    def on_connect(*_):
        opened.append(1)

    sqlalchemy.event.listen(engine, "connect", on_connect)
    try:
        for _ in range(queries):
            instance.get_records_for_run("no-such-run")
    finally:
        sqlalchemy.event.remove(engine, "connect", on_connect)
    return len(opened)


def test_one_partition_keeps_dagsters_null_pool_a_range_holds_one_connection(pg_home):
    with dg.DagsterInstance.get() as instance:
        assert hold_storage_connections(instance, 1) is False
        assert _connections_opened(instance, 10) == 10  # Dagster's default: a new connection per query
        assert hold_storage_connections(instance, 2) is True
        assert _connections_opened(instance, 10) == 1  # pooled: opened once, reused
        assert instance.get_records_for_run("no-such-run").records == []


def test_a_pooled_connection_the_server_dropped_is_replaced_not_handed_to_dagster(pg_home, pg):
    """PostgreSQL restarting (or an admin terminating backends) drops the pooled connections; the next query
    gets a fresh one (bench/faults.py saw ranged runs fail on the dead ones)."""
    import psycopg2

    with dg.DagsterInstance.get() as instance:
        assert hold_storage_connections(instance, 2) is True
        assert instance.get_records_for_run("no-such-run").records == []  # the pool now holds a connection
        assert instance.get_runs_count() == 0
        db = instance.event_log_storage._engine.url.database  # noqa: SLF001
        admin = psycopg2.connect(host=pg["DAGSTER_PG_HOST"], port=pg["DAGSTER_PG_PORT"], user=pg["DAGSTER_PG_USER"],
                                 password=pg["DAGSTER_PG_PASSWORD"], dbname=pg["DAGSTER_PG_DB"])
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s AND usename = current_user"
                        " AND pid <> pg_backend_pid()", (db,))
            assert cur.fetchone()[0] >= 1  # the pooled connections were there, and are gone now
        admin.close()
        assert instance.get_records_for_run("no-such-run").records == []
        assert instance.get_runs_count() == 0
