"""Merge figures into bench/results/summary.json (one flat JSON object shared by every benchmark).

    python bench/summary.py encoder.cpu_ratio_vs_encode=1.41 encoder.gpu_busy_percent=null

Values are JSON (``null``, numbers, strings in quotes); keys already in the file and not named keep
their values (merge, never overwrite the file as a whole). Keys are sorted on writing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SUMMARY = Path(__file__).resolve().parent / "results" / "summary.json"


def merge(values: dict, path: Path = SUMMARY) -> dict:
    """Read ``path`` (if any), update it with ``values``, write it back atomically; returns the whole object."""
    current = json.loads(path.read_text()) if path.exists() else {}
    if not isinstance(current, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(current).__name__}")
    current.update(values)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return current


def main(argv: list[str]) -> int:
    values = {}
    for arg in argv:
        key, sep, raw = arg.partition("=")
        if not sep or not key:
            raise SystemExit(f"expected KEY=JSON, got {arg!r}")
        values[key] = json.loads(raw)
    print(json.dumps(merge(values), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
