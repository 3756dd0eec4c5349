"""``dagster_gpu``'s public names: the ``TYPE_CHECKING`` imports (what type checkers and IDEs read) and the
lazy table (what runs) name the same objects, each resolves, importing the package imports no Dagster, and
``__version__`` is the installed distribution's."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import subprocess
import sys

import dagster_gpu


def _type_checking_imports() -> dict[str, str]:
    """public name -> module, from the ``if TYPE_CHECKING:`` block of dagster_gpu/__init__.py."""
    tree = ast.parse(open(dagster_gpu.__file__).read())
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING"]
    out = {}
    for stmt in block.body:
        if isinstance(stmt, ast.ImportFrom):
            for a in stmt.names:
                assert a.asname == a.name, f"{a.name} imported as {a.asname}: re-export it under its own name"
                out[a.name] = stmt.module
    return out


def test_type_checking_block_and_lazy_table_agree_and_resolve():
    declared = _type_checking_imports()
    assert declared == dagster_gpu._EXPORTS
    assert sorted(declared) == dagster_gpu.__all__
    for name, module in declared.items():
        assert getattr(dagster_gpu, name) is getattr(importlib.import_module(module), name), name
    assert set(dagster_gpu.__all__) <= set(dir(dagster_gpu))


def test_version_is_the_distributions():
    assert dagster_gpu.__version__ == importlib.metadata.version("dagster-gpu") == "0.2.0"
    assert "__version__" in dir(dagster_gpu)


def test_importing_the_package_and_a_name_that_is_not_there():
    code = ("import sys, dagster_gpu\n"
            "assert 'dagster' not in sys.modules, 'import dagster_gpu imported dagster'\n"
            "try:\n    dagster_gpu.gpu_exector\nexcept AttributeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "module 'dagster_gpu' has no attribute 'gpu_exector'"
