"""Compatibility shim: ``python -m dagster_gpu.worker.supervise`` runs :mod:`dagster_gpu.local.supervise`.

Local workers launched by earlier versions were started with this module path (the local backend's command
line); the supervisor now lives beside the local backend. Kept so that such a command line still runs.
"""

from __future__ import annotations

import sys

from dagster_gpu.local.supervise import describe_exit, main, read_status, write_status

__all__ = ["describe_exit", "main", "read_status", "write_status"]

if __name__ == "__main__":
    sys.exit(main())
