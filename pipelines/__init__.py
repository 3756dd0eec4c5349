"""A ready Dagster code location using dagster-gpu: the fortune-file embedding demo."""
