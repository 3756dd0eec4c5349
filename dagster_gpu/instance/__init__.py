"""The Dagster instance read back for dagster-gpu, below the worker and the definitions: step launches and
outcomes, bills, failures, earlier materializations and preemptions observed; storage connections, asset-check
evaluations, run tags, the step args a worker gets, the backends' settings schema."""
