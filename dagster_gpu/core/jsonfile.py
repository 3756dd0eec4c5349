"""Small JSON files written atomically (temp file in the same directory + rename), read tolerantly."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def write_json(path: Path, doc: Any, mode: int = 0o600) -> None:
    """Write ``doc`` as JSON to ``path`` atomically (temp file in the same dir + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def read_json(path: Path) -> Any | None:
    """The parsed JSON file, or None if absent or unreadable (mid-write files never appear: renames)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
