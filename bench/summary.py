"""Merge headline figures into ``bench/results/summary.json`` (issue 8): flat keys such as
``sim.ascending_cost_ratio`` -> numbers (no units in the values), or null for a figure not measured here
(e.g. a GPU figure on a machine without one). Keys already there and not given are
kept; the file is replaced atomically (temp file, then rename).

    from summary import merge_summary            # with bench/ on sys.path
    merge_summary({"sim.ascending_cost_ratio": 1.0})

    python bench/summary.py encoder.cpu_ratio_vs_encode=1.41 encoder.gpu_busy_percent=null   # from a shell
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path

SUMMARY = Path(__file__).resolve().parent / "results" / "summary.json"


def merge_summary(updates: dict[str, float | int | bool | None], path: str | Path = SUMMARY) -> dict:
    """Merge ``updates`` into the JSON object at ``path`` (created if missing); returns the merged object.

    Raises:
        ValueError: a value is not a finite number (bool and None allowed), or the file holds something other than
            a JSON object (the message names the file and key).
    """
    p = Path(path)
    for k, v in updates.items():
        if v is None:
            continue
        if not isinstance(v, (bool, int, float)) or (isinstance(v, float) and not math.isfinite(v)):
            raise ValueError(f"{p}: {k!r} must be a finite number, got {v!r}")
    cur = {}
    if p.exists():
        try:
            cur = json.loads(p.read_text() or "{}")
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}: not JSON ({e}); fix or remove it") from e
        if not isinstance(cur, dict):
            raise ValueError(f"{p}: holds a {type(cur).__name__}, not a JSON object")
    cur.update(updates)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".summary-", dir=p.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(dict(sorted(cur.items())), f, indent=2)
        f.write("\n")
    os.replace(tmp, p)
    return cur


def main(argv: list[str]) -> int:
    """``KEY=JSON`` arguments merged into the summary; prints the whole object."""
    values = {}
    for arg in argv:
        key, sep, raw = arg.partition("=")
        if not sep or not key:
            raise SystemExit(f"expected KEY=JSON, got {arg!r}")
        values[key] = json.loads(raw)
    print(json.dumps(merge_summary(values), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
