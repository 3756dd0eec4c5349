"""Importing the user's code location module named on a command line (``-m pipelines.definitions``).

A console script (``.venv/bin/dagster-gpu``) has its own directory as ``sys.path[0]``, not the working
directory, so a module of the project being run from (``pipelines/``) would not import; ``dagster -m``
and ``python -m`` both look in the working directory first, and so does :func:`import_code_module`. A
module that is not there is looked for next in the ``working_directory`` of the workspace file's code
locations (``load_from: - python_module: {module_name, working_directory}``, relative to the file's folder,
as ``dagster`` resolves it), so a command run from another folder imports what the daemon it starts would.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType


def workspace_directories(workspace: str | Path, module: str) -> list[str]:
    """The ``working_directory`` of each code location of ``workspace`` (a workspace.yaml), those whose
    ``module_name`` is ``module`` first, as absolute paths; [] when the file is absent or unreadable (the
    command that needs it says so). Relative directories are taken from the file's folder."""
    import yaml

    path = Path(workspace)
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return []
    mine, other = [], []
    for entry in doc.get("load_from") or [] if isinstance(doc, dict) else []:
        for kind in ("python_module", "python_package", "python_file"):
            target = entry.get(kind) if isinstance(entry, dict) else None
            if not isinstance(target, dict) or not target.get("working_directory"):
                continue
            d = str((path.resolve().parent / str(target["working_directory"])).resolve())
            named = target.get("module_name") or target.get("package_name")
            (mine if named == module else other).append(d)
    return list(dict.fromkeys(mine + other))


def import_code_module(name: str, workspace: str | Path | None = None) -> ModuleType:
    """Import module ``name`` with the working directory first on ``sys.path`` (added once, if absent); when
    it is not found there, with each of :func:`workspace_directories` of ``workspace`` in turn. Raises
    ImportError (ModuleNotFoundError) as ``importlib.import_module`` does, its message naming every
    directory looked in."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is None or not name.startswith(e.name):  # the module itself imports something missing
            raise
        tried = [cwd]
        for d in workspace_directories(workspace, name) if workspace is not None else []:
            if d in sys.path:
                continue
            sys.path.insert(0, d)
            tried.append(d)
            try:
                return importlib.import_module(name)
            except ModuleNotFoundError as again:
                if again.name is None or not name.startswith(again.name):
                    raise
                sys.path.remove(d)
        where = f"the working directory {cwd}" + (
            f" and the workspace file {workspace}'s working_directory {', '.join(tried[1:])}" if len(tried) > 1 else
            f" (workspace file {workspace} names no other working_directory)" if workspace is not None else "")
        raise ModuleNotFoundError(f"{e} (looked in {where}; run from the folder that holds it, or name it as a "
                                  f"code location's working_directory in -w's workspace file)", name=e.name) from None


def add_workspace_argument(ap) -> None:
    """``-w/--workspace PATH`` (default ``workspace.yaml``) on the argparse parser ``ap`` of a command that imports
    ``-m MODULE``: where :func:`import_code_module` looks next when the working directory does not hold it (the
    file need not exist)."""
    ap.add_argument("-w", "--workspace", default="workspace.yaml",
                    help="workspace file whose code locations' working_directory is searched for -m's module when "
                         "the working directory does not hold it (default ./workspace.yaml)")


def load_definitions(module: str, attribute: str, prog: str, workspace: str | Path | None = "workspace.yaml"):
    """``(the imported module, the dagster.Definitions at module.attribute)`` (see :func:`import_code_module`,
    with ``workspace``'s code locations' working directories), or None after printing one line to stderr
    saying why (``prog: cannot import -m …``, naming where it looked, or ``… is not a dagster Definitions``),
    for a command to exit 2."""
    import dagster as dg

    try:
        mod = import_code_module(module, workspace)
    except ImportError as e:
        print(f"{prog}: cannot import -m {module}: {e}", file=sys.stderr)
        return None
    defs = getattr(mod, attribute, None)
    if not isinstance(defs, dg.Definitions):
        print(f"{prog}: {module}.{attribute} is not a dagster Definitions (--attribute)", file=sys.stderr)
        return None
    return mod, defs
