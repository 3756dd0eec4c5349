"""The package's imports are in one order: isort's rules as ruff implements them (``[tool.ruff.lint] select = ["I"]``
in pyproject.toml; ruff is in the ``test`` extra). ``ruff check --fix`` puts a file in that order.

Every module of ``dagster_gpu/`` is checked.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dagster_gpu

PACKAGE = Path(dagster_gpu.__file__).resolve().parent
ROOT = PACKAGE.parent


def _checked() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_ruff_is_installed():
    p = _ruff("--version")
    assert p.returncode == 0 and p.stdout.startswith("ruff "), (
        f"ruff is not installed (pip install 'dagster-gpu[test]'): {p.stderr.strip()[-300:]}")


def test_the_package_imports_are_in_the_sorters_order():
    files = _checked()
    assert len(files) > 90 and PACKAGE / "corpus" / "listing.py" in files
    p = _ruff("check", "--no-cache", "--output-format", "concise", *(str(f.relative_to(ROOT)) for f in files))
    assert p.returncode == 0, ("imports out of order (run `ruff check --fix` on these files):\n"
                               + (p.stdout + p.stderr)[-5000:])


def test_the_sorter_reads_the_projects_configuration(tmp_path):
    """pyproject.toml's section is the one applied: dagster_gpu is first-party (after the third-party block) and
    only the import rules are selected (an unused import is not this check's business)."""
    bad = tmp_path / "probe.py"
    bad.write_text("import os\nfrom dagster_gpu.core import jsonfile\nimport dagster\n")
    config = str(ROOT / "pyproject.toml")
    p = _ruff("check", "--no-cache", "--config", config, "--output-format", "concise", str(bad))
    fixed = _ruff("check", "--no-cache", "--config", config, "--fix", str(bad))
    assert p.returncode == 1 and "I001" in p.stdout and "F401" not in p.stdout, p.stdout
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert bad.read_text() == "import os\n\nimport dagster\n\nfrom dagster_gpu.core import jsonfile\n"
