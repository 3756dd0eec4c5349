"""Layering of the package: every module imports on its own, and the scheduler clients stay below the executor.

``dagster_gpu.slurm`` (Slurm client and parsers) and ``dagster_gpu.k8s`` (Kubernetes manifests and client)
use the contract values of ``dagster_gpu.contracts``; code that reads or writes Dagster's event log lives
in ``dagster_gpu.executor.backends``.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import dagster_gpu

PACKAGE = Path(dagster_gpu.__file__).resolve().parent


def _modules() -> list[str]:
    out = []
    for p in sorted(PACKAGE.rglob("*.py")):
        rel = p.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append(".".join(parts))
    return out


def _import_alone(module: str) -> tuple[str, int, str]:
    """Import ``module`` in a fresh interpreter (nothing else of the package imported first)."""
    p = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    return module, p.returncode, p.stderr[-2000:]


def test_every_module_imports_in_a_fresh_interpreter():
    modules = _modules()
    assert "dagster_gpu.k8s.manifests" in modules and "dagster_gpu.contracts" in modules
    with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as pool:
        results = list(pool.map(_import_alone, modules))
    failed = {m: err for m, rc, err in results if rc != 0}
    assert not failed, "modules that do not import on their own:\n" + "\n".join(f"{m}:\n{e}" for m, e in failed.items())


def _imports(path: Path) -> list[str]:
    """Every module an ``import``/``from … import`` statement of ``path`` names (function bodies included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]
    return names


def _forbidden(name: str) -> bool:
    # the executor, and Dagster itself (its event log, instance, events); dagster_k8s's models are allowed
    return name == "dagster_gpu.executor" or name.startswith("dagster_gpu.executor.") or name == "dagster" \
        or name.startswith("dagster.") or name.startswith("dagster._")


@pytest.mark.parametrize("sub", ["slurm", "k8s"])
def test_scheduler_clients_import_neither_the_executor_nor_dagsters_event_log(sub):
    files = sorted((PACKAGE / sub).rglob("*.py"))
    assert files
    bad = {str(f.relative_to(PACKAGE.parent)): [n for n in _imports(f) if _forbidden(n)] for f in files}
    assert not {k: v for k, v in bad.items() if v}, bad


def test_contracts_import_nothing_of_the_package_at_run_time():
    tree = ast.parse((PACKAGE / "contracts.py").read_text())
    runtime = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [n.module for n in runtime if isinstance(n, ast.ImportFrom)] + [a.name for n in runtime if isinstance(n, ast.Import) for a in n.names]
    assert not [n for n in names if n and n.startswith("dagster_gpu")], names


def test_the_forbidden_check_sees_a_function_level_import(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from dagster_gpu.executor.backends.base import WorkerStatus\n    import dagster as dg\n")
    assert [n for n in _imports(f) if _forbidden(n)] == [
        "dagster_gpu.executor.backends.base", "dagster_gpu.executor.backends.base.WorkerStatus", "dagster"]
