"""The ``local`` backend: each step's worker a subprocess of the orchestrating process's host
(:mod:`~dagster_gpu.local.backend`)."""
