"""Dagster glue below the worker and the definitions: what the Dagster instance, its run tags and its event log
hold for dagster-gpu (run ranges, storage connections, source versions and staleness, asset checks, bills,
failures and history read back, the step args a worker gets, the backends' settings schema)."""
