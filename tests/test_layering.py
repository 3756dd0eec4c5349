"""docs/architecture.md's map of the package, enforced as written.

The map's tables ("The map" in docs/architecture.md) are parsed here, so the doc and this test cannot drift:
every module of ``dagster_gpu/`` has one line and one layer, every import (module level, function level,
``TYPE_CHECKING``, a module named in a string for ``import_module`` or ``python -m``) points from a layer to itself or to a layer it may import, there is no module cycle and
no package cycle, and the layers that import no Dagster do not. An import that breaks a rule today is a
known debt only when the map lists it, and a listed debt must still exist (a fixed one is deleted from the
map). The rules the project states outright are checked against the map itself, so loosening the map
cannot hide them: policy imports nothing above core (billing, request and the other shared values),
worker never imports the executor, and the commands (the CLI) are imported by nothing else.
"""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
import tokenize
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pytest

import dagster_gpu

PACKAGE = Path(dagster_gpu.__file__).resolve().parent
MAP = PACKAGE.parent / "docs" / "architecture.md"


# -- the package as it is ------------------------------------------------------------------------------
def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@lru_cache(maxsize=1)
def _files() -> dict[str, Path]:
    """Every module of the package (dotted name -> file), ``__init__.py`` files as their package."""
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imported(path: Path, module: str, known: set[str] | dict) -> list[tuple[str, int]]:
    """``(module of dagster_gpu, line)`` of every import in ``path`` (module ``module``): at module level, in
    function bodies and under ``if TYPE_CHECKING:`` alike; ``from X import name`` counts ``X.name`` when that
    is a module, else ``X``; relative imports are resolved against ``module``; a string that is exactly a
    module's dotted name (``import_module``, ``python -m``) counts as an import of it."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            # a module named in a string: importlib.import_module("dagster_gpu.x"), python -m dagster_gpu.x
            names = [node.value] if node.value in known and node.value != "dagster_gpu" else []
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[: len(up) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for n in names:
            if n == "dagster_gpu" or n.startswith("dagster_gpu."):
                r = resolve(n)
                if r and r != module:
                    out.append((r, node.lineno))
    return out


def _external(path: Path) -> list[tuple[str, int]]:
    """``(top-level distribution module, line)`` of every import of ``path`` outside the package."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name.split(".")[0], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module.split(".")[0], node.lineno))
    return out


@lru_cache(maxsize=1)
def _graph() -> dict[str, dict[str, int]]:
    """module -> {imported module of the package: first line}."""
    files = _files()
    g: dict[str, dict[str, int]] = {m: {} for m in files}
    for m, p in files.items():
        for d, line in _imported(p, m, files):
            g[m].setdefault(d, line)
    return g


# -- the map as written --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layer:
    name: str
    may_import: frozenset[str]
    dagster_free: bool
    dagster_allowed_in: frozenset[str]  # modules of a Dagster-free layer that may import Dagster


@dataclass(frozen=True)
class Map:
    layers: dict[str, Layer]
    layer_of: dict[str, str]  # dotted module name -> layer
    debts: dict[tuple[str, str], str]  # (importer, imported) -> the line's text
    duplicates: list[str]
    moved: dict[str, str] = field(default_factory=dict)  # old module path (no file) -> the module it forwards to


def _dotted(cell_path: str) -> str:
    """``policy/whatif.py`` -> ``dagster_gpu.policy.whatif``; ``policy/`` -> ``dagster_gpu.policy``;
    ``__init__.py`` -> ``dagster_gpu``."""
    p = cell_path.strip().removesuffix(".py").strip("/")
    parts = [x for x in p.split("/") if x]
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["dagster_gpu", *parts])


def _ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _table(text: str, heading: str) -> list[list[str]]:
    """The body rows (cells) of the first table after the line ``heading``."""
    lines = text.splitlines()
    try:
        start = lines.index(heading)
    except ValueError:
        pytest.fail(f"{MAP}: no {heading!r} section (the map this test enforces)")
    rows, seen_table = [], False
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            seen_table = True
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows.append(cells)
        elif seen_table:
            break
    assert len(rows) >= 2 and set(rows[1][0]) <= set("-: "), f"{MAP}: {heading!r} has no table"
    return rows[2:]


def _parse(text: str) -> Map:
    layers = {}
    for cells in _table(text, "### Layers"):
        name = _ticked(cells[0])[0]
        dagster = cells[2].lower()
        layers[name] = Layer(
            name=name, may_import=frozenset(_ticked(cells[1])), dagster_free=dagster.startswith("no"),
            dagster_allowed_in=frozenset(_dotted(t) for t in _ticked(cells[2])),
        )
    layer_of: dict[str, str] = {}
    duplicates = []
    for heading in ("### Packages", "### Modules"):
        for cells in _table(text, heading):
            module = _dotted(_ticked(cells[0])[0])
            if module in layer_of:
                duplicates.append(module)
            layer_of[module] = _ticked(cells[1])[0]
    debts = {}
    for cells in _table(text, "### Known debts"):
        ticks = _ticked(cells[0])
        assert len(ticks) == 2, f"{MAP}: a known debt names one import `importer` -> `imported`: {cells[0]!r}"
        debts[(_dotted(ticks[0]), _dotted(ticks[1]))] = " | ".join(cells)
    moved = {}
    if "Moved modules:" in text.split("### Layers")[0]:
        section = text[text.index("Moved modules:"):text.index("### Layers")]
        for line in section.splitlines():
            ticks = _ticked(line) if line.startswith("| `") else []
            if len(ticks) >= 2:
                moved[_dotted(ticks[0])] = _dotted(ticks[1])
    return Map(layers, layer_of, debts, duplicates, moved)


@lru_cache(maxsize=1)
def _map() -> Map:
    return _parse(MAP.read_text())


def _rel(module: str) -> str:
    """``dagster_gpu.policy.whatif`` -> ``policy/whatif.py`` as the map writes it."""
    p = _files().get(module)
    return str(p.relative_to(PACKAGE)) if p else module


def _edges_outside_debts() -> dict[str, dict[str, int]]:
    debts = set(_map().debts)
    return {m: {d: ln for d, ln in ds.items() if (m, d) not in debts} for m, ds in _graph().items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
                continue
            if w not in graph:
                continue
            if w not in index:
                index[w] = low[w] = counter
                counter += 1
                stack.append(w)
                on.add(w)
                work.append((w, iter(sorted(graph[w]))))
            elif w in on:
                low[v] = min(low[v], index[w])
    return out


def _package(module: str) -> str:
    """The folder a module is in at the top of the package (``slurm`` for slurm/backend.py); a
    root module is its own."""
    parts = module.split(".")
    return ".".join(parts[:2])


# -- the map is complete and true ------------------------------------------------------------------------
def test_the_map_names_every_module_once_and_nothing_else():
    m = _map()
    actual = set(_files())
    missing = sorted(actual - set(m.layer_of))
    unknown = sorted(set(m.layer_of) - actual)
    assert not missing, f"modules missing from {MAP.name}'s map (one line each, with its layer): {[_rel(x) for x in missing]}"
    assert not unknown, f"{MAP.name}'s map names modules that do not exist: {unknown}"
    assert not m.duplicates, f"modules named twice in the map: {m.duplicates}"
    bad_layer = {x: lay for x, lay in m.layer_of.items() if lay not in m.layers}
    assert not bad_layer, f"modules on a layer the Layers table does not define: {bad_layer}"


def test_the_layers_point_down():
    layers = _map().layers
    undefined = {n: sorted(lay.may_import - set(layers)) for n, lay in layers.items() if lay.may_import - set(layers)}
    assert not undefined, f"layers that may import undefined layers: {undefined}"
    assert not _cycles({n: set(lay.may_import) - {n} for n, lay in layers.items()}), "the layers' may-import relation has a cycle"


def test_every_import_points_down_the_map():
    m = _map()
    wrong = []
    for src, deps in _edges_outside_debts().items():
        ls = m.layer_of.get(src)
        for dst, line in deps.items():
            ld = m.layer_of.get(dst)
            if ls is None or ld is None or ld == ls or ld in m.layers[ls].may_import:
                continue
            wrong.append(f"{_rel(src)}:{line} imports {_rel(dst)}: layer {ls} may not import layer {ld}")
    assert not wrong, "imports against docs/architecture.md's map (fix them, or list them under Known debts):\n" + "\n".join(wrong)


def test_no_module_cycle_outside_the_known_debts():
    g = {m: set(ds) for m, ds in _edges_outside_debts().items()}
    cycles = _cycles(g)
    assert not cycles, "module import cycles (imports anywhere in a file):\n" + "\n".join(
        " <-> ".join(_rel(x) for x in c) for c in cycles)


def test_no_package_cycle_outside_the_known_debts():
    g: dict[str, set[str]] = defaultdict(set)
    why: dict[tuple[str, str], str] = {}
    for src, deps in _edges_outside_debts().items():
        for dst, line in deps.items():
            a, b = _package(src), _package(dst)
            if a != b:
                g[a].add(b)
                why.setdefault((a, b), f"{_rel(src)}:{line} -> {_rel(dst)}")
    cycles = _cycles(dict(g))
    detail = [f"{' <-> '.join(c)}: " + "; ".join(why[(a, b)] for a in c for b in c if (a, b) in why) for c in cycles]
    assert not cycles, "package import cycles:\n" + "\n".join(detail)


def test_each_known_debt_is_still_there():
    g = _graph()
    gone = [line for (src, dst), line in _map().debts.items() if dst not in g.get(src, {})]
    assert not gone, f"known debts that no longer exist (fixed: delete their lines from {MAP.name}):\n" + "\n".join(gone)


def test_dagster_free_layers_import_no_dagster():
    m = _map()
    bad = []
    for module, path in _files().items():
        layer = m.layers[m.layer_of[module]] if module in m.layer_of else None
        if layer is None or not layer.dagster_free or module in layer.dagster_allowed_in:
            continue
        bad += [f"{_rel(module)}:{line}" for name, line in _external(path) if name == "dagster"]
    assert not bad, "modules of a Dagster-free layer importing dagster (dagster_k8s's models are allowed):\n" + "\n".join(bad)


# -- the rules stated outright, checked against the map itself ---------------------------------------------
def test_the_stated_rules_are_the_maps():
    m = _map()
    core = {x for x, lay in m.layer_of.items() if lay == "core"}
    assert {"dagster_gpu.billing", "dagster_gpu.core.request"} <= core, "billing and request are core"
    assert m.layers["core"].may_import == frozenset(), "core imports no other layer"
    assert m.layers["policy"].may_import == frozenset({"core"}), "policy imports nothing above billing/request (core)"
    assert all(m.layer_of[x] == "policy" for x in _files() if x.startswith("dagster_gpu.policy"))
    for layer in ("worker",):
        assert not m.layers[layer].may_import & {"executor", "backends"}, "worker never imports the executor"
    assert all(m.layer_of[x] in ("executor", "backends") for x in _files() if x.startswith("dagster_gpu.executor"))
    assert all(m.layer_of[x] == "worker" for x in _files() if x.startswith("dagster_gpu.worker"))
    assert not any("commands" in lay.may_import for lay in m.layers.values()), "nothing imports the commands"
    assert m.layer_of["dagster_gpu.commands.main"] == "commands" and m.layer_of["dagster_gpu.commands"] == "commands"
    assert all(m.layer_of[x] == "commands" for x in _files() if x.startswith("dagster_gpu.commands"))


def test_the_cross_layer_folders_sit_where_the_map_says():
    """partitions/ is the partition ledger's layer, above the instance read back and below the worker; relay/ holds
    the channel and the relayed worker's instance on ``instance`` and the run worker's pump on ``executor``;
    preemption has one name in every layer."""
    m, files = _map(), _files()
    assert {x for x in files if x.startswith("dagster_gpu.partitions")} >= {
        "dagster_gpu.partitions.status", "dagster_gpu.partitions.run_ranges", "dagster_gpu.partitions.run_requests",
        "dagster_gpu.partitions.source_versions", "dagster_gpu.partitions.stale", "dagster_gpu.partitions.unit_cost"}
    assert all(m.layer_of[x] == "partitions" for x in files if x.startswith("dagster_gpu.partitions"))
    assert m.layers["partitions"].may_import == frozenset({"core", "policy", "data", "instance"})
    above = [n for n, lay in m.layers.items() if "partitions" in lay.may_import]
    assert sorted(above) == ["api", "backends", "commands", "definitions", "executor", "worker"], above
    assert {x: m.layer_of[x] for x in files if x.startswith("dagster_gpu.relay")} == {
        "dagster_gpu.relay": "instance", "dagster_gpu.relay.channel": "instance", "dagster_gpu.relay.parts": "instance",
        "dagster_gpu.relay.objects": "instance", "dagster_gpu.relay.storage": "instance",
        "dagster_gpu.relay.pump": "executor"}
    ledger = ("partition_status", "run_ranges", "source_versions", "stale", "relay_channel", "relay_parts",
              "relay_objects", "relay_storage")
    drawer = [x for x in files if x.startswith("dagster_gpu.instance.") and x.rsplit(".", 1)[1] in ledger]
    assert not drawer, f"partition-ledger or relay modules back in instance/: {drawer}"
    assert not [x for x in files if x.rsplit(".", 1)[-1] in ("preempt", "preemptions")], "preemption's modules are named preemption"


def test_the_settings_framework_sits_below_every_backend_and_instance_stays_small():
    """settings/ (a settings class -> its config schema) imports no other layer, so every backend's settings
    module, the executor and the definitions reach it downwards; instance/ keeps the instance read back alone."""
    m, files = _map(), _files()
    assert {x: m.layer_of[x] for x in files if x.startswith("dagster_gpu.settings")} == {
        "dagster_gpu.settings": "settings", "dagster_gpu.settings.schema": "settings"}
    assert m.layers["settings"].may_import == frozenset()
    assert {"backends", "executor"} <= {n for n, lay in m.layers.items() if "settings" in lay.may_import}
    lines = sum(len(p.read_text().splitlines()) for x, p in files.items() if x.startswith("dagster_gpu.instance"))
    assert lines <= 1400, f"instance/ holds {lines} lines: move what is not the instance read back into its own folder"


def _raw_imports(path: Path) -> list[tuple[str, int]]:
    """``(dotted name, line)`` of every absolute import of ``path``: ``import X`` gives ``X``, ``from X import n``
    gives ``X`` and ``X.n``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out += [(node.module, node.lineno)] + [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
    return out


def test_the_moved_modules_are_the_finders_entries_with_no_file_and_nothing_imports_them():
    """An old module path lives only as an entry of the package root's finder (``_MOVED_MODULES``), never as a shim
    file; the map's table lists exactly those entries; the package itself imports only the new paths."""
    moved, files = _map().moved, _files()
    assert moved == dagster_gpu._MOVED_MODULES, (
        f"{MAP.name}'s 'Moved modules' table and dagster_gpu._MOVED_MODULES differ: "
        f"only in the map {sorted(set(moved.items()) - set(dagster_gpu._MOVED_MODULES.items()))}, "
        f"only in the finder {sorted(set(dagster_gpu._MOVED_MODULES.items()) - set(moved.items()))}")
    for old, new in moved.items():
        assert new in files, f"{old} forwards to {new}, which is not a module of the package"
        assert old not in files, f"{_rel(old)}: a file at a moved module's old path would bypass the finder's warning"
    importers = [f"{_rel(m)}:{ln} imports {name}" for m, p in files.items() for name, ln in _raw_imports(p) if name in moved]
    assert not importers, "the package imports a moved module's old path (import the new one):\n" + "\n".join(importers)


#: At most this many imports of the package inside functions, in the whole package.
MAX_FUNCTION_IMPORTS = 25
#: Files whose function-level imports of the package do not give their reason yet -> how many may lack it (each
#: entry shrinks as they are moved to the top or given their reason, and goes at zero).
FUNCTION_IMPORTS_WITHOUT_REASON: dict[str, int] = {}


def _function_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, text of that line)`` of each import of the package inside a function body of ``path``: an
    ``import``/``from`` statement naming ``dagster_gpu`` (or relative), or ``import_module``/``__import__`` called
    with a literal ``dagster_gpu`` module name."""
    text = path.read_text()
    lines = text.splitlines()
    out = []

    def ours(name: str | None) -> bool:
        return bool(name) and (name == "dagster_gpu" or name.startswith("dagster_gpu."))

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and (
                    (isinstance(child, ast.Import) and any(ours(a.name) for a in child.names))
                    or (isinstance(child, ast.ImportFrom) and (child.level or ours(child.module)))
                    or (isinstance(child, ast.Call) and getattr(child.func, "id", getattr(child.func, "attr", None))
                        in ("import_module", "__import__") and child.args and isinstance(child.args[0], ast.Constant)
                        and ours(str(child.args[0].value)))):
                out.append((child.lineno, lines[child.lineno - 1]))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(text, filename=str(path)), False)
    return out


def _reason(line: str) -> str:
    """The comment of a source line (``# ...``), or ''."""
    try:
        comments = [t.string for t in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline)
                    if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):  # the first line of a parenthesized import
        comments = [line[line.index("#"):]] if "#" in line else []
    return comments[0].lstrip("# ").strip() if comments else ""


def test_imports_of_the_package_inside_functions_are_few_and_say_why():
    """An import of the package belongs at the top of its module, where a reader sees what the module depends on.
    One inside a function stays only with its reason as a comment on its line (a module that must run without the
    package, an optional dependency, a measured start-up cost); there are at most MAX_FUNCTION_IMPORTS."""
    found = {str(p.relative_to(PACKAGE)): _function_imports(p) for p in sorted(PACKAGE.rglob("*.py"))}
    total = sum(len(v) for v in found.values())
    listing = "\n".join(f"{f}:{ln}: {text.strip()}" for f, v in found.items() for ln, text in v)
    assert total <= MAX_FUNCTION_IMPORTS, (
        f"{total} imports of the package inside functions (at most {MAX_FUNCTION_IMPORTS}): move them to the top of "
        f"their modules\n{listing}")
    unexplained = {f: [(ln, t.strip()) for ln, t in v if len(_reason(t).split()) < 3] for f, v in found.items()}
    over = {f: v for f, v in unexplained.items() if len(v) > FUNCTION_IMPORTS_WITHOUT_REASON.get(f, 0)}
    assert not over, ("imports of the package inside functions without their reason (a comment of a few words on "
                      f"the line; or move them to the top): {over}")
    stale = [f for f, n in FUNCTION_IMPORTS_WITHOUT_REASON.items() if len(unexplained.get(f, [])) == 0]
    assert not stale, f"FUNCTION_IMPORTS_WITHOUT_REASON lists files whose function-level imports are all explained: {stale}"


def test_the_function_import_reader_sees_statements_relative_and_by_name_imports(tmp_path):
    f = tmp_path / "x.py"
    f.write_text(
        "import os\nfrom dagster_gpu.core import jsonfile\n"
        "def f():\n    import json\n    from dagster_gpu.slurm.ids import x  # a module run by path\n"
        "    from . import y\n    return import_module('dagster_gpu.k8s.client'), importlib.import_module(name)\n"
        "class C:\n    def g(self):\n        import dagster_gpu.policy as p\n        h = lambda: __import__('dagster_gpu.sim')\n"
    )
    assert [ln for ln, _ in _function_imports(f)] == [5, 6, 7, 10, 11]
    assert _reason("    from dagster_gpu.slurm.ids import x  # a module run by path") == "a module run by path"
    assert _reason("    from dagster_gpu.definitions.partitions import (  # cycle: it imports this module") == (
        "cycle: it imports this module")
    assert _reason("    x = '# not a comment'") == ""


def test_the_root_holds_only_the_public_surface_and_the_contract():
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert root == ["__init__.py", "contracts.py"], (
        f"modules at the package root besides __init__.py and contracts.py (move each into the folder of its layer): {root}")


def _console_scripts() -> dict[str, str]:
    """name -> ``module:function`` of pyproject.toml's ``[project.scripts]``."""
    import tomllib

    return tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"].get("scripts", {})


def test_every_command_lives_in_commands():
    scripts = _console_scripts()
    assert scripts, "pyproject.toml declares the dagster-gpu console script"
    outside = {n: t for n, t in scripts.items() if not t.startswith("dagster_gpu.commands.")}
    assert not outside, f"console scripts outside dagster_gpu/commands/: {outside}"
    mains = []
    for module, path in _files().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.endswith("_main") \
                    and node.col_offset == 0 and not module.startswith("dagster_gpu.commands"):
                mains.append(f"{_rel(module)}:{node.lineno} {node.name}")
    assert not mains, f"command entry points (*_main) outside dagster_gpu/commands/: {mains}"


def test_policy_imports_only_policy_and_core():
    m = _map()
    wrong = [f"{_rel(s)}:{ln} -> {_rel(d)}" for s, ds in _graph().items() if s.startswith("dagster_gpu.policy")
             for d, ln in ds.items() if m.layer_of.get(d) not in ("policy", "core")]
    assert not wrong, wrong


def test_the_cli_is_imported_by_nothing():
    m = _map()
    importers = [f"{_rel(s)}:{ln}" for s, ds in _graph().items() for d, ln in ds.items() if d == "dagster_gpu.commands.main"]
    assert not importers, f"the CLI entry point is imported by {importers}"
    outside = [f"{_rel(s)}:{ln} -> {_rel(d)}" for s, ds in _graph().items() for d, ln in ds.items()
               if m.layer_of.get(d) == "commands" and m.layer_of.get(s) != "commands"]
    assert not outside, f"commands imported from outside the commands: {outside}"


def test_the_import_reader_sees_function_level_type_checking_relative_and_by_name_imports(tmp_path):
    f = tmp_path / "x.py"
    f.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from dagster_gpu.policy.placement import Placement\n"
        "def f():\n    from dagster_gpu.executor.settle import Settler\n    import dagster_gpu.slurm.ids as ids\n"
        "from .core import jsonfile\nfrom .policy import DeviceGroup\nfrom dagster_gpu.k8s import manifests\n"
        "RUN = ['python', '-m', 'dagster_gpu.local.supervise']\nLOG = 'dagster_gpu'\n"
    )
    assert sorted(_imported(f, "dagster_gpu.x", _files())) == sorted([
        ("dagster_gpu.policy.placement", 3), ("dagster_gpu.executor.settle", 5), ("dagster_gpu.slurm.ids", 6),
        ("dagster_gpu.core.jsonfile", 7), ("dagster_gpu.policy", 8), ("dagster_gpu.k8s.manifests", 9),
        ("dagster_gpu.local.supervise", 10)])


def test_the_map_parser_reads_layers_modules_and_debts():
    text = (
        "### Layers\n\n| layer | may import | Dagster | holds |\n|---|---|---|---|\n"
        "| `core` | — | no | values |\n| `top` | `core` | no, except `top/io.py` | the rest |\n\n"
        "### Packages\n\n| package | layer | holds |\n|---|---|---|\n| `top/` | `top` | x |\n\n"
        "### Modules\n\n| module | layer | job |\n|---|---|---|\n| `a.py` | `core` | a |\n| `top/io.py` | `top` | b |\n"
        "| `a.py` | `core` | again |\n\n"
        "### Known debts\n\n| import | breaks | where it goes |\n|---|---|---|\n| `a.py` → `top/io.py` | layer | down |\n"
    )
    m = _parse(text)
    assert m.layers["top"] == Layer("top", frozenset({"core"}), True, frozenset({"dagster_gpu.top.io"}))
    assert m.layers["core"].may_import == frozenset() and m.layers["core"].dagster_free
    assert m.layer_of == {"dagster_gpu.top": "top", "dagster_gpu.a": "core", "dagster_gpu.top.io": "top"}
    assert m.duplicates == ["dagster_gpu.a"]
    assert list(m.debts) == [("dagster_gpu.a", "dagster_gpu.top.io")]
    assert _cycles({"a": {"b"}, "b": {"a", "c"}, "c": set()}) == [["a", "b"]] and _cycles({"a": {"b"}, "b": set()}) == []


# -- every module imports on its own ------------------------------------------------------------------------
#: One interpreter imports the third-party libraries the package uses (none of the package itself), then forks
#: a child per module: each child imports its module with nothing of dagster_gpu loaded before it, as a fresh
#: interpreter would (a fresh ``python -c`` per module took ~1 s each, mostly re-importing torch and dagster).
_IMPORT_EACH = r"""
import importlib, os, sys, traceback
for lib in filter(None, sys.argv[1].split(",")):
    try:
        importlib.import_module(lib)
    except ImportError:
        pass
assert not [m for m in sys.modules if m == "dagster_gpu" or m.startswith("dagster_gpu.")], "a library imported dagster_gpu"
failed = 0
for module in sys.argv[2:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            importlib.import_module(module)
        except BaseException:
            os.write(w, traceback.format_exc()[-2000:].encode())
            code = 1
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        err = f.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        failed += 1
        print(f"=== {module} (exit {os.waitstatus_to_exitcode(status)})\n{err}", flush=True)
sys.exit(1 if failed else 0)
"""
#: What the forking interpreter imports first (argv[1] of :data:`_IMPORT_EACH`); not lancedb, which is not fork-safe.
_PRELOAD = ("dagster", "dagster_k8s", "dagster_postgres", "torch", "sentence_transformers", "pyarrow.parquet", "fsspec",
            "kubernetes.client", "rich", "tenacity", "psycopg2", "yaml", "pynvml")


def test_every_module_imports_in_a_fresh_interpreter():
    modules = sorted(_files())
    assert "dagster_gpu.k8s.manifests" in modules and "dagster_gpu.contracts" in modules
    p = subprocess.run([sys.executable, "-c", _IMPORT_EACH, ",".join(_PRELOAD), *modules], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert p.returncode == 0, "modules that do not import on their own:\n" + p.stdout[-20000:] + p.stderr[-3000:]


def test_a_module_that_needs_another_imported_first_is_found(tmp_path):
    """The import check fails a module that works only when another module was imported before it."""
    pkg = tmp_path / "ordpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import sys\nsys.modules['ordpkg'].shared = 1\n")
    (pkg / "b.py").write_text("import ordpkg\nvalue = ordpkg.shared\n")  # only after ordpkg.a
    p = subprocess.run([sys.executable, "-c", _IMPORT_EACH, "", "ordpkg.a", "ordpkg.b"], capture_output=True, text=True,
                       timeout=900, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert p.returncode == 1 and "=== ordpkg.b (exit 1)" in p.stdout and "=== ordpkg.a" not in p.stdout
    assert "AttributeError" in p.stdout


def test_contracts_import_nothing_of_the_package_at_run_time():
    tree = ast.parse((PACKAGE / "contracts.py").read_text())
    runtime = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [n.module for n in runtime if isinstance(n, ast.ImportFrom)] + [a.name for n in runtime if isinstance(n, ast.Import) for a in n.names]
    assert not [n for n in names if n and n.startswith("dagster_gpu")], names
