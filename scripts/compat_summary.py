"""Write the ``compat.*`` keys of bench/results/summary.json (standard library only: runs outside any venv).

    python scripts/compat_summary.py --versions 1.13.0 1.13.29 [--base-mb N --full-mb N --base-load-s S]

``compat.dagster_versions_tested``: the dagster releases scripts/compat.sh passed with (a list of strings, like
``slurm.versions_tested``); ``compat.base_install_mb`` / ``compat.full_install_mb``: a fresh venv's size on disk
(MB, ``du -sm``) with the wheel alone / with ``[all]``; ``compat.base_load_s``: seconds to import the demo code
location in the base install. Other keys are kept; the file is replaced atomically (temp file, then rename).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

SUMMARY = Path(__file__).resolve().parents[1] / "bench" / "results" / "summary.json"


def merge(updates: dict, path: Path = SUMMARY) -> dict:
    """``updates`` merged into the JSON object at ``path``, written back with sorted keys; returns it."""
    cur = json.loads(path.read_text()) if path.exists() else {}
    if not isinstance(cur, dict):
        raise ValueError(f"{path}: holds a {type(cur).__name__}, not a JSON object")
    cur.update(updates)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".summary.")
    with os.fdopen(fd, "w") as f:
        json.dump(dict(sorted(cur.items())), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return cur


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", nargs="+", required=True, help="dagster releases that passed")
    ap.add_argument("--base-mb", type=float)
    ap.add_argument("--full-mb", type=float)
    ap.add_argument("--base-load-s", type=float)
    a = ap.parse_args(argv)
    updates: dict = {"compat.dagster_versions_tested": list(a.versions)}
    for key, value in (("compat.base_install_mb", a.base_mb), ("compat.full_install_mb", a.full_mb),
                       ("compat.base_load_s", a.base_load_s)):
        if value is not None:
            updates[key] = value
    merge(updates)
    print("summary.json: " + ", ".join(f"{k}={v}" for k, v in updates.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
