"""The partition ledger: which partitions of an embedding asset exist, which are materialized, failed, in flight
or stale, which file version each read, which partitions a run covers and how many one run may cover, what a
work unit costs, and the run requests that cover a selection."""
