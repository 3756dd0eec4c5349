"""The Dagster instance's ``dagster.yaml``, written once for the demo, the benchmarks and the tests.

On PostgreSQL (what Slurm array tasks and pods need: their events reach the run worker's instance) the
password is always an env var reference (``{env: DAGSTER_PG_PASSWORD}``), never written out; the user, host
and port are env var references too unless the caller names them. Runs go through Dagster's
QueuedRunCoordinator (``max_runs`` at once, dequeued every second); telemetry is off.
"""

from __future__ import annotations

from dagster_gpu.instance.run_queue import QUEUED_RUN_COORDINATOR, RUN_COORDINATOR

NOOP_COMPUTE_LOGS = """compute_logs:
  module: dagster._core.storage.noop_compute_log_manager
  class: NoOpComputeLogManager
"""


def dagster_yaml(db: str | None, *, max_runs: int, user: str = "{env: DAGSTER_PG_USER}",
                 host: str = "{env: DAGSTER_PG_HOST}", port: str | int = "{env: DAGSTER_PG_PORT}",
                 noop_compute_logs: bool = False, extra: str = "") -> str:
    """dagster.yaml text: PostgreSQL database ``db`` (None: Dagster's default SQLite under DAGSTER_HOME), a run
    queue of ``max_runs``, compute logs off when ``noop_compute_logs``, ``extra`` (whole top-level sections,
    e.g. ``run_monitoring:``) appended."""
    storage = "" if db is None else f"""storage:
  postgres:
    postgres_db:
      username: {user}
      password: {{env: DAGSTER_PG_PASSWORD}}
      hostname: {host}
      port: {port}
      db_name: {db}
      scheme: postgresql+psycopg2
"""
    return f"""{storage}run_coordinator:
  module: {RUN_COORDINATOR}
  class: {QUEUED_RUN_COORDINATOR}
  config:
    max_concurrent_runs: {max_runs}
    dequeue_interval_seconds: 1
{NOOP_COMPUTE_LOGS if noop_compute_logs else ""}telemetry:
  enabled: false
{extra}"""
