"""Processes that work through a ranged run keep their Dagster storage connections open.

Dagster's PostgreSQL storages open a new connection for every query (SQLAlchemy ``NullPool``, so that idle
processes hold none). A unit writes, per partition, a log line, a materialization and five check evaluations,
each several queries: profiled on this host (2 cores, PostgreSQL over TCP with password auth), one 50-partition
unit opened 1,097 connections, 14.5 s of its 110.8 s (``bench/profile_unit.py``). ``DagsterInstance.
optimize_for_webserver`` is Dagster's own switch to a small pool (``dagster-webserver`` calls it at start):
one connection per storage held open for the unit's life, ``max_overflow`` more under concurrent use.

The run worker of a ranged run does the same: its executor polls the run's events every ``sleep_seconds``
and its settler reads and writes bills, for the whole unit. On the 1,000-partition benchmark
(``bench/ranged_backfill.py``, 2 ranged runs) PostgreSQL saw 9,884 sessions in about 10 minutes before the
run workers were pooled, each a forked backend and a password exchange (see docs/benchmarks.md for after).
"""

from __future__ import annotations

import dagster as dg
import sqlalchemy

#: PostgreSQL ``statement_timeout`` in milliseconds: 0 = none, as Dagster's default (NullPool) engines have.
NO_STATEMENT_TIMEOUT_MS = 0
#: seconds after which a pooled connection is replaced (the webserver's default, ``--db-pool-recycle``).
POOL_RECYCLE_S = 3600


def hold_storage_connections(instance: dg.DagsterInstance, partitions: int, max_overflow: int = 2) -> bool:
    """Pool ``instance``'s storage connections when this process works for more than one partition (a unit
    of a ranged run, or the run worker driving it).

    Returns True when the instance was switched (a no-op on storages without a pool, e.g. SQLite).
    The process holds at most ``1 + max_overflow`` connections per storage (run, event log, schedule)
    until it exits, instead of one per query.
    """
    if partitions <= 1:
        return False
    instance.optimize_for_webserver(NO_STATEMENT_TIMEOUT_MS, POOL_RECYCLE_S, max_overflow)
    for storage in (instance.run_storage, instance.event_log_storage, getattr(instance, "schedule_storage", None)):
        engine = getattr(storage, "_engine", None)
        if isinstance(engine, sqlalchemy.engine.Engine) and not isinstance(engine.pool, sqlalchemy.pool.NullPool):
            sqlalchemy.event.listen(engine, "checkout", _ping_on_checkout)
    return True


def _ping_on_checkout(dbapi_connection, connection_record, connection_proxy) -> None:
    """Pessimistic disconnect handling for a pooled connection (SQLAlchemy's documented recipe, "Disconnect
    Handling - Pessimistic"): a connection the server dropped (PostgreSQL restarted: measured with
    bench/faults.py: 44 of 200 partitions failed within 5 s of a restart, 19 still failed after the step
    retries, before this) fails a ``SELECT 1``
    at checkout, and ``DisconnectionError`` makes the pool replace it (up to 3 attempts) instead of handing
    it to Dagster's query. Dagster's ``optimize_for_webserver`` engines do not set ``pool_pre_ping``."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SELECT 1")
    except Exception as e:  # noqa: BLE001 - any failure means the connection is unusable
        raise sqlalchemy.exc.DisconnectionError(str(e)) from e
    finally:
        try:
            cursor.close()
        except Exception:  # noqa: BLE001, S110 - closing a cursor of a dead connection
            pass
