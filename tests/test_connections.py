"""hold_storage_connections on a real PostgreSQL instance: a process that works through a ranged run (its
unit, or the run worker polling the run's events) opens one connection per storage, not one per query."""

from __future__ import annotations

import dagster as dg
import sqlalchemy

from dagster_gpu.connections import hold_storage_connections


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
