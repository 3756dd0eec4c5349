"""bench/results/summary.json: the headline figures issues name, merged key by key (never overwritten whole)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

SUMMARY = Path(__file__).resolve().parent / "results" / "summary.json"


def update_summary(figures: Mapping[str, Any], path: Path = SUMMARY) -> dict:
    """Merge ``figures`` (dotted keys -> numbers, or None when not measured) into the summary file; returns it."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(figures)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(sorted(data.items())), indent=1) + "\n")
    return data
