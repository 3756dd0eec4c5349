"""The built wheel: package data travels with it, the demo code location does not, and its requirements are
what its modules import.

The wheel is built once (``pip wheel --no-deps``, from a copy of the sources). One test installs it without
dependencies into a fresh virtual environment whose site-packages reaches this environment's site-packages
(for dagster, pyyaml...) through a ``.pth`` line — not this checkout, not the editable install — and imports
the package from a directory outside the repository. That environment has every dependency, so it cannot
notice a missing one: the static check does. It parses every module of the wheel's ``dagster_gpu`` (imports
at module level, in functions and under ``TYPE_CHECKING`` alike), maps each imported top-level name to the
distributions that provide it here (``importlib.metadata.packages_distributions()``) and requires one of
them among the wheel's ``Requires-Dist``: a hard requirement, or an extra's requirement in the modules that
extra is for (:data:`EXTRA_MODULES`). An import in the body of a ``try`` that catches ``ImportError`` or
``ModuleNotFoundError`` is optional and needs no requirement. The other way round, a hard requirement no
module imports must be one that something loads by name (:data:`LOADED_BY_NAME`).
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import HeaderParser
from functools import lru_cache
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]

#: extra -> the wheel paths (prefixes) whose imports that extra's requirements may cover.
EXTRA_MODULES = {
    "index": ("dagster_gpu/index/",),  # pip install 'dagster-gpu[index]' for lancedb
    # the worker's model and devices, and its GPU telemetry (pynvml: optional where it is imported by the orchestrator)
    "embed": ("dagster_gpu/embedding/", "dagster_gpu/worker/unit.py", "dagster_gpu/telemetry/nvml.py"),
    "report": ("dagster_gpu/commands/report.py", "dagster_gpu/sim/plot.py"),
    "kubernetes": ("dagster_gpu/k8s/pod.py",),  # dagster-k8s reads a pod's container_context
}

#: Hard requirements no module imports, and what imports them by name.
LOADED_BY_NAME = {
    # fsspec's registry (fsspec/registry.py ``known_implementations``: "s3" -> "s3fs.S3FileSystem") imports it
    # for s3:// corpus and output URLs
    "s3fs": "fsspec, for s3:// URLs",
}


def _run(cmd, **kw):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    assert p.returncode == 0, f"{cmd} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"  # build from a copy: setuptools writes build/ and *.egg-info next to the sources
    for d in ("dagster_gpu", "pipelines"):  # pipelines/ is there, and must stay out of the wheel
        shutil.copytree(REPO / d, src / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    dist = tmp / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, src])
    (whl,) = dist.glob("dagster_gpu-*.whl")
    return whl


# -- the static check: imports against Requires-Dist --------------------------------------------------
def _optional_imports(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside the body of a ``try`` whose handlers catch ImportError or
    ModuleNotFoundError (by name, alone or in a tuple)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        caught = set()
        for h in node.handlers:
            types = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
            caught |= {t.id for t in types if isinstance(t, ast.Name)}
        if caught & {"ImportError", "ModuleNotFoundError"}:
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return out


@lru_cache(maxsize=None)
def external_imports(source: str, filename: str) -> tuple[tuple[str, int], ...]:
    """``(top-level name, line)`` of each non-optional absolute import of ``source`` outside the standard
    library and ``dagster_gpu``."""
    tree = ast.parse(source, filename=filename)
    optional = _optional_imports(tree)
    out = []
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            tops = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops = [node.module.split(".")[0]]
        else:
            continue
        out += [(t, node.lineno) for t in tops
                if t not in sys.stdlib_module_names and t not in ("__future__", "dagster_gpu")]
    return tuple(out)


def requirements(requires_dist: list[str], provides_extra: list[str]) -> tuple[set[str], dict[str, set[str]]]:
    """(hard requirement names, extra -> its requirement names), names canonical (PEP 503): a requirement
    whose marker holds without an extra is hard, else it belongs to each extra under which it holds."""
    hard: set[str] = set()
    extras: dict[str, set[str]] = {}
    for line in requires_dist:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            hard.add(name)
            continue
        for e in provides_extra:
            if req.marker.evaluate({"extra": e}):
                extras.setdefault(e, set()).add(name)
    return hard, extras


def uncovered(modules: dict[str, str], requires_dist: list[str], provides_extra: list[str],
              provides: dict[str, list[str]], extra_modules: dict[str, tuple[str, ...]]) -> list[str]:
    """One line per import no requirement covers: ``<wheel path>:<line> imports <name> (<distributions>),
    which is not in Requires-Dist``. ``modules``: wheel path -> source; ``provides``: top-level name ->
    distributions (``packages_distributions()``)."""
    hard, extras = requirements(requires_dist, provides_extra)
    problems = []
    for path, source in sorted(modules.items()):
        allowed = set(hard)
        for extra, prefixes in extra_modules.items():
            if path.startswith(prefixes):
                allowed |= extras.get(extra, set())
        for top, line in external_imports(source, path):
            dists = {canonicalize_name(d) for d in provides.get(top, [])}
            if not dists:
                problems.append(f"{path}:{line} imports {top}, which no installed distribution provides")
            elif not dists & allowed:
                problems.append(f"{path}:{line} imports {top} ({', '.join(sorted(dists))}), which is not in "
                                f"Requires-Dist{' (only in an extra)' if any(dists & e for e in extras.values()) else ''}")
    return problems


def unimported(modules: dict[str, str], requires_dist: list[str], provides: dict[str, list[str]],
               loaded_by_name: dict[str, str]) -> list[str]:
    """The hard requirements that no module imports and :data:`LOADED_BY_NAME` does not explain."""
    hard, _ = requirements(requires_dist, [])
    imported = {canonicalize_name(d) for path, source in modules.items()
                for top, _ in external_imports(source, path) for d in provides.get(top, [])}
    return sorted(hard - imported - {canonicalize_name(n) for n in loaded_by_name})


def _wheel_contents(whl: Path) -> tuple[dict[str, str], list[str], list[str]]:
    """(wheel path -> source of each module of dagster_gpu, Requires-Dist, Provides-Extra) of the wheel."""
    with zipfile.ZipFile(whl) as z:
        modules = {n: z.read(n).decode() for n in z.namelist() if n.startswith("dagster_gpu/") and n.endswith(".py")}
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        headers = HeaderParser().parsestr(z.read(meta).decode())
    return modules, headers.get_all("Requires-Dist") or [], headers.get_all("Provides-Extra") or []


def test_every_import_of_the_wheel_is_a_requirement_and_every_requirement_is_used(wheel):
    modules, requires, extra_names = _wheel_contents(wheel)
    assert len(modules) > 50 and "dagster_gpu/__init__.py" in modules
    provides = importlib.metadata.packages_distributions()
    assert uncovered(modules, requires, extra_names, provides, EXTRA_MODULES) == []
    assert unimported(modules, requires, provides, LOADED_BY_NAME) == []
    hard, extras = requirements(requires, extra_names)
    assert "dagster-postgres" not in hard and "dagster-postgres" in extras["postgres"]
    # the base install is the orchestrator's: no torch, sentence-transformers, lancedb, matplotlib or nvidia-ml-py
    assert {"dagster", "kubernetes", "pyarrow"} <= hard and "dagster-k8s" in extras["kubernetes"]
    assert not hard & {"dagster-k8s", "torch", "sentence-transformers", "huggingface-hub", "nvidia-ml-py", "lancedb", "matplotlib", "s3fs"}
    assert {"torch", "sentence-transformers", "huggingface-hub", "nvidia-ml-py"} <= extras["embed"]
    assert "lancedb" in extras["index"] and "matplotlib" in extras["report"] and "s3fs" in extras["s3"]
    (everything,) = [r for r in map(Requirement, requires) if r.marker and r.marker.evaluate({"extra": "all"})]
    assert everything.name == "dagster-gpu" and everything.extras == {"embed", "kubernetes", "index", "s3", "postgres", "report"}


def test_the_check_names_the_module_and_the_import_no_requirement_covers():
    provides = {"requests": ["requests"], "yaml": ["PyYAML"], "lancedb": ["lancedb"], "gt_x": ["gt-x"]}
    modules = {
        "dagster_gpu/a.py": "import os\nimport yaml\n\ndef f():\n    import requests.adapters\n",
        "dagster_gpu/b.py": "try:\n    import gt_x\nexcept (ValueError, ImportError):\n    gt_x = None\n",
        "dagster_gpu/c.py": "try:\n    import gt_x\nexcept Exception:\n    gt_x = None\n",  # not declared optional
        "dagster_gpu/index/d.py": "from lancedb import connect\n",
        "dagster_gpu/e.py": "from . import a\nfrom dagster_gpu.index import d\nimport lancedb\n",
        "dagster_gpu/f.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import nosuch\n",
    }
    requires = ["PyYAML>=6", "urllib3>=1.26", "s3fs", 'lancedb==0.40.0; extra == "index"']
    assert uncovered(modules, requires, ["index"], provides, {"index": ("dagster_gpu/index/",)}) == [
        "dagster_gpu/a.py:5 imports requests (requests), which is not in Requires-Dist",
        "dagster_gpu/c.py:2 imports gt_x (gt-x), which is not in Requires-Dist",
        "dagster_gpu/e.py:3 imports lancedb (lancedb), which is not in Requires-Dist (only in an extra)",
        "dagster_gpu/f.py:3 imports nosuch, which no installed distribution provides",
    ]
    assert unimported(modules, requires, provides, {"s3fs": "fsspec"}) == ["urllib3"]


# -- the installed wheel -------------------------------------------------------------------------------
def test_wheel_installs_with_its_package_data_and_without_pipelines(wheel, tmp_path):
    names = zipfile.ZipFile(wheel).namelist()
    assert "dagster_gpu/data/ratecard.yaml" in names
    assert "dagster_gpu/data/unit_startup.json" in names  # the simulator's calibration
    assert "dagster_gpu/contracts.py" in names
    assert not [n for n in names if n.split("/", 1)[0] == "pipelines"], [n for n in names if n.startswith("pipelines")]
    # bench/unit_startup.py writes the calibration through this link, so the packaged copy is the one it updates
    assert (REPO / "bench" / "results" / "unit_startup.json").resolve() == REPO / "dagster_gpu" / "data" / "unit_startup.json"

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "-q", wheel])
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "deps-from-test-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    out = _run([py, "-c", (
        "import dagster_gpu, importlib.util\n"
        "from dagster_gpu.billing.ratecard import RateCard, DEFAULT_RATE_CARD\n"
        "from dagster_gpu.sim.calibration import DEFAULT_PATH, load_calibration\n"
        "c = RateCard.load()\n"
        "print(dagster_gpu.__file__)\n"
        "print(c.source)\n"
        "print(c.table('kubernetes')['default'])\n"
        "print(importlib.util.find_spec('pipelines') is None)\n"
        "print(dagster_gpu.__version__)\n"
        "print(DEFAULT_PATH)\n"
        "print(load_calibration().unit_startup_s)\n")], cwd=tmp_path).stdout.splitlines()
    assert out[0].startswith(str(site)), out  # the wheel's copy, not this checkout
    assert out[1] == str(site / "dagster_gpu" / "data" / "ratecard.yaml")
    packaged = yaml.safe_load((REPO / "dagster_gpu" / "data" / "ratecard.yaml").read_text())
    assert float(out[2]) == packaged["backends"]["kubernetes"]["default"]
    assert out[3] == "True"  # no top-level pipelines package installed
    assert out[4] == wheel.name.split("-")[1] == importlib.metadata.version("dagster-gpu")  # from the wheel's METADATA
    assert out[5] == str(site / "dagster_gpu" / "data" / "unit_startup.json")
    assert float(out[6]) == json.loads((REPO / "dagster_gpu" / "data" / "unit_startup.json").read_text())["unit_startup_s"]
