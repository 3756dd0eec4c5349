"""Importing the user's code location module named on a command line (``-m pipelines.definitions``).

A console script (``.venv/bin/dagster-gpu``) has its own directory as ``sys.path[0]``, not the working
directory, so a module of the project being run from (``pipelines/``) would not import; ``dagster -m``
and ``python -m`` both look in the working directory first, and so does :func:`import_code_module`.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType


def import_code_module(name: str) -> ModuleType:
    """Import module ``name`` with the working directory first on ``sys.path`` (added once, if absent).
    Raises ImportError (ModuleNotFoundError) as ``importlib.import_module`` does."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    return importlib.import_module(name)


def load_definitions(module: str, attribute: str, prog: str):
    """``(the imported module, the dagster.Definitions at module.attribute)`` (see :func:`import_code_module`), or None after
    printing one line to stderr saying why (``prog: cannot import -m …`` or ``… is not a dagster Definitions``),
    for a command to exit 2."""
    import dagster as dg

    try:
        mod = import_code_module(module)
    except ImportError as e:
        print(f"{prog}: cannot import -m {module}: {e}", file=sys.stderr)
        return None
    defs = getattr(mod, attribute, None)
    if not isinstance(defs, dg.Definitions):
        print(f"{prog}: {module}.{attribute} is not a dagster Definitions (--attribute)", file=sys.stderr)
        return None
    return mod, defs
