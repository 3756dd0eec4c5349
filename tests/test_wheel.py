"""The built wheel: package data travels with it, the demo code location does not.

Builds the wheel (``pip wheel --no-deps``), installs it without dependencies into a fresh virtual
environment whose site-packages reaches this environment's site-packages (for dagster, pyyaml...) through
a ``.pth`` line — not this checkout, not the editable install — and imports the package from a directory
outside the repository.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def _run(cmd, **kw):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    assert p.returncode == 0, f"{cmd} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def test_wheel_installs_with_its_rate_card_and_without_pipelines(tmp_path):
    src = tmp_path / "src"  # build from a copy: setuptools writes build/ and *.egg-info next to the sources
    for d in ("dagster_gpu", "pipelines"):  # pipelines/ is there, and must stay out of the wheel
        shutil.copytree(REPO / d, src / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, src])
    (wheel,) = dist.glob("dagster_gpu-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "dagster_gpu/data/ratecard.yaml" in names
    assert "dagster_gpu/contracts.py" in names
    assert not [n for n in names if n.split("/", 1)[0] == "pipelines"], [n for n in names if n.startswith("pipelines")]

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "-q", wheel])
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "deps-from-test-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    out = _run([py, "-c", (
        "import dagster_gpu, importlib.util\n"
        "from dagster_gpu.billing.ratecard import RateCard, DEFAULT_RATE_CARD\n"
        "c = RateCard.load()\n"
        "print(dagster_gpu.__file__)\n"
        "print(c.source)\n"
        "print(c.table('kubernetes')['default'])\n"
        "print(importlib.util.find_spec('pipelines') is None)\n")], cwd=tmp_path).stdout.splitlines()
    assert out[0].startswith(str(site)), out  # the wheel's copy, not this checkout
    assert out[1] == str(site / "dagster_gpu" / "data" / "ratecard.yaml")
    packaged = yaml.safe_load((REPO / "dagster_gpu" / "data" / "ratecard.yaml").read_text())
    assert float(out[2]) == packaged["backends"]["kubernetes"]["default"]
    assert out[3] == "True"  # no top-level pipelines package installed
