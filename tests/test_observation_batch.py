"""store_observations on a real PostgreSQL instance: a unit's bill is one INSERT per asset, and each
partition's observation reads back with its own partition and figures."""

from __future__ import annotations

import dagster as dg
import sqlalchemy

from dagster_gpu.executor.bill_writer import store_observations


def test_a_units_observations_land_as_one_batch_per_asset_with_their_partitions(pg_home):
    a, b = dg.AssetKey("emb"), dg.AssetKey("other")
    obs = [dg.AssetObservation(asset_key=a, partition=f"p{i}", metadata={"billing/gpu_seconds": float(i)}) for i in range(5)]
    obs.append(dg.AssetObservation(asset_key=b, partition="q", metadata={"billing/gpu_seconds": 9.5}))
    with dg.DagsterInstance.get() as instance:
        engine = instance.event_log_storage._engine  # noqa: SLF001
        statements: list[str] = []

        def on_execute(conn, cursor, statement, *_):
            if statement.lstrip().upper().startswith("INSERT INTO EVENT_LOGS"):
                statements.append(statement)

        sqlalchemy.event.listen(engine, "before_cursor_execute", on_execute)
        try:
            store_observations(instance, obs)
        finally:
            sqlalchemy.event.remove(engine, "before_cursor_execute", on_execute)
        assert len(statements) == 2  # one INSERT for emb's 5 partitions, one for other's
        got = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=a), limit=10).records
        by_partition = {r.partition_key: r.asset_observation.metadata["billing/gpu_seconds"].value for r in got}
        assert by_partition == {f"p{i}": float(i) for i in range(5)}
        other = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=b), limit=10).records
        assert [(r.partition_key, r.asset_observation.metadata["billing/gpu_seconds"].value) for r in other] == [("q", 9.5)]
