"""The one atomic file writer (temp file in the same directory + rename), and small JSON files read tolerantly."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any


def write_atomic(path: Path, data: str | bytes, mode: int = 0o600) -> Path:
    """Replace ``path``'s content with ``data`` atomically: a new temp file in the same directory, created
    O_EXCL under an unpredictable name with ``mode`` (less the umask), written, then renamed over ``path``.
    Readers see the old content or the new one, never a part. On any error the temp file is removed, ``path``
    is left as it was, and the error is raised (OSError from the file system). Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json(path: Path, doc: Any, mode: int = 0o600, sort_keys: bool = False) -> None:
    """Write ``doc`` as JSON to ``path`` atomically (:func:`write_atomic`). Raises TypeError/ValueError for a
    ``doc`` JSON cannot hold, before any file is touched."""
    write_atomic(path, json.dumps(doc, sort_keys=sort_keys), mode)


def read_json(path: Path) -> Any | None:
    """The parsed JSON file, or None if absent or unreadable (mid-write files never appear: renames)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
