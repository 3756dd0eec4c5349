"""The last lines of a worker's log file, for the failure messages of the local and Slurm backends (stdlib only)."""

from __future__ import annotations

import os
from pathlib import Path


def log_tail(path: Path, lines: int = 8, max_bytes: int = 4096) -> str:
    """The last ``lines`` lines of the log at ``path`` (at most its last ``max_bytes`` bytes read, decoded as
    UTF-8 with replacement), joined by newlines; ``(log unreadable: <error>)`` when it cannot be read.
    Raises nothing."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError as e:
        return f"(log unreadable: {e})"
