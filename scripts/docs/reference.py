"""Reference pages of the docs site, generated from the code (pure text out; imports dagster_gpu).

- :func:`settings_page`: every key of gpu_executor's config (``execution: config:``), from its Dagster config
  schema, which ``dagster_gpu.settings.schema`` generates from the backends' settings classes: name, type,
  default, description; nested sections (``slurm.ssh``, ...) become sections of their own, whatever their depth.
- :func:`commands_page`: each ``dagster-gpu`` command's ``--help``, as its argparse parser prints it.
- :func:`metadata_keys_page`: the documented key constants of ``dagster_gpu.billing.keys``, the op and run tags of
  ``dagster_gpu.core.request`` and every other metadata key string the package writes, with the modules naming it.
- :func:`changelog_page`: CHANGELOG.md at the repository root.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[2]
KEY_RE = re.compile(r"""["']((?:embedding|billing|gpu|dagster_gpu|corpus|index|slurm|k8s)/[a-z0-9_]+)["']""")


def _cell(text: Any) -> str:
    """``text`` as one Markdown table cell: reST literals as code spans; outside them, ``<…>`` and ``~`` shown as
    typed (not an HTML tag, not pymdownx's strike-through); no ``|`` or line break ends the cell."""
    parts = str(text).replace("``", "`").replace("\n", " ").split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;").replace("~", "\\~")
    return "`".join(parts).replace("|", "\\|").strip()


def type_name(config_type: Any) -> str:
    """A Dagster config type as the reference shows it: ``Int``, ``String``, ``[String]``, ``Int or null``,
    ``one of a | b``, ``section``, ``mapping``."""
    from dagster._config.config_type import ConfigTypeKind as K

    kind = config_type.kind
    if kind == K.NONEABLE:
        return f"{type_name(config_type.inner_type)} or null"
    if kind == K.ARRAY:
        return f"[{type_name(config_type.inner_type)}]"
    if kind == K.ENUM:
        return "one of " + " | ".join(v.config_value for v in config_type.enum_values)
    if kind == K.SCALAR_UNION:
        return f"{config_type.scalar_type.given_name} (or {{env: VAR}})"
    if kind == K.STRICT_SHAPE:
        return "section"
    if kind == K.PERMISSIVE_SHAPE:
        return "mapping"
    if kind == K.SELECTOR:
        return "one of: " + ", ".join(config_type.fields)
    if kind == K.MAP:
        return "map"
    return config_type.given_name or str(kind.value).lower()


def _default(field: Any) -> str:
    if field.default_provided:
        return "`" + _cell(json.dumps(field.default_value, default=str)) + "`"
    return "required" if field.is_required else "none"


def _sections(shape: Any, path: str) -> Iterator[tuple[str, list[tuple[str, Any]]]]:
    from dagster._config.config_type import ConfigTypeKind as K

    rows = list(shape.fields.items())
    yield path, rows
    for name, field in rows:
        ct = field.config_type
        if ct.kind == K.NONEABLE:
            ct = ct.inner_type
        if ct.kind == K.STRICT_SHAPE or (ct.kind == K.PERMISSIVE_SHAPE and ct.fields):
            yield from _sections(ct, f"{path}.{name}" if path else name)


def settings_rows(config: Any = None) -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, description) of every key of a Dagster config schema (a dict of fields;
    default gpu_executor's), depth first: a section's keys follow it, nested sections by their dotted path."""
    from dagster._config.field_utils import convert_potential_field
    from dagster_gpu.executor.executor import GPU_EXECUTOR_CONFIG

    rows = []
    schema = GPU_EXECUTOR_CONFIG if config is None else config
    for path, fields in _sections(convert_potential_field(schema).config_type, ""):
        for name, field in fields:
            key = f"{path}.{name}" if path else name
            rows.append((key, type_name(field.config_type), _default(field), field.description or ""))
    return rows


def settings_page() -> str:
    from dagster._config.field_utils import convert_potential_field
    from dagster_gpu.executor.executor import GPU_EXECUTOR_CONFIG

    out = ["# Executor configuration", "",
           "Every key of `gpu_executor`'s config (`execution: config:` of a run, or "
           "`gpu_executor.configured({...})`), generated from the settings classes at build time "
           "(`dagster_gpu/settings/schema.py` turns each backend's settings class into its section of the "
           "config schema). A key not set takes its default; *none* means optional with no default.", ""]
    for path, fields in _sections(convert_potential_field(GPU_EXECUTOR_CONFIG).config_type, ""):
        out += [f"## `{path}`" if path else "## Top level", "",
                "| key | type | default | description |", "|---|---|---|---|"]
        for name, field in fields:
            key = f"{path}.{name}" if path else name
            out.append(f"| `{key}` | {_cell(type_name(field.config_type))} | {_default(field)} | "
                       f"{_cell(field.description or '')} |")
        out.append("")
    return "\n".join(out)


def command_names() -> list[str]:
    """The ``dagster-gpu`` commands, as the command's own usage text (its module docstring) lists them."""
    from dagster_gpu.commands import main

    return list(dict.fromkeys(re.findall(r"^\s+dagster-gpu (\w[\w-]*)", main.__doc__ or "", re.M)))


def command_help(name: str | None) -> str:
    """What ``dagster-gpu [name] --help`` prints (the overview for ``name=None``), 100 columns wide."""
    from dagster_gpu.commands.main import main

    argv = ["--help"] if name is None else [name, "--help"]
    buf = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            try:
                main(argv)
            except SystemExit:
                pass
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return buf.getvalue().rstrip()


def commands_page() -> str:
    out = ["# The `dagster-gpu` commands", "",
           "Generated at build time from the commands' argument parsers (`dagster-gpu <command> --help`). "
           "Every command reads the Dagster instance of `$DAGSTER_HOME`.", "",
           "## Overview", "", "```text", command_help(None), "```", ""]
    for name in command_names():
        out += [f"## `dagster-gpu {name}`", "", "```text", command_help(name), "```", ""]
    return "\n".join(out)


def documented_keys(path: Path) -> list[tuple[str, str, str]]:
    """(constant, key, its ``#:`` comment) of each metadata key constant of a keys module."""
    lines = path.read_text().splitlines()
    out = []
    for node in ast.parse("\n".join(lines)).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str) \
                and "/" in node.value.value and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            doc, i = [], node.lineno - 2
            while i >= 0 and lines[i].lstrip().startswith("#:"):
                doc.insert(0, lines[i].lstrip()[2:].strip())
                i -= 1
            out.append((node.targets[0].id, node.value.value, " ".join(doc)))
    return out


def keys_in_code() -> dict[str, list[str]]:
    """Every metadata key string (``embedding/…``, ``billing/…``, ``gpu/…``, ``dagster_gpu/…``, ``corpus/…``,
    ``index/…``, ``slurm/…``, ``k8s/…``) in the package's source -> the modules naming it."""
    found: dict[str, set[str]] = {}
    for py in sorted((ROOT / "dagster_gpu").rglob("*.py")):
        for key in KEY_RE.findall(py.read_text()):
            found.setdefault(key, set()).add(py.relative_to(ROOT).as_posix())
    return {k: sorted(v) for k, v in sorted(found.items())}


def request_tags() -> list[tuple[str, str, str]]:
    """(tag, constant, meaning) of each ``TAG_*`` constant of ``dagster_gpu.core.request``: the meaning from the
    module docstring's table of tags, else from the ``#:`` comment above the constant (or above the group of
    constants it starts)."""
    from dagster_gpu.core import request

    table: dict[str, list[str]] = {}
    current = None
    for line in (request.__doc__ or "").splitlines():
        m = re.match(r"^``(dagster-gpu/[a-z-]+)``\s+(.*)$", line)
        if m:
            current = m.group(1)
            table[current] = [m.group(2).strip()]
        elif current and line.startswith(" ") and line.strip() and not line.strip().startswith("="):
            table[current].append(line.strip())
        else:
            current = None
    comments = {key: doc for _, key, doc in documented_keys(Path(request.__file__))}
    out, last_doc = [], ""
    source = Path(request.__file__).read_text().splitlines()
    for name in [n for n in vars(request) if n.startswith("TAG_") and n != "TAG_PREFIX"]:
        value = getattr(request, name)
        line = next((i for i, s in enumerate(source) if s.startswith(f"{name} =")), None)
        doc = " ".join(table.get(value, []))
        if not doc and line is not None:
            above = source[line - 1].strip() if line else ""
            if above.startswith("#:") or above.startswith("#"):
                last_doc = _comment_above(source, line)
            elif not above:
                last_doc = ""
            doc = last_doc
        out.append((value, name, doc or comments.get(value, "")))
    return out


def _comment_above(source: list[str], line: int) -> str:
    doc, i = [], line - 1
    while i >= 0 and source[i].lstrip().startswith("#"):
        doc.insert(0, source[i].lstrip().lstrip("#:").strip())
        i -= 1
    return " ".join(doc)


def metadata_keys_page() -> str:
    keys_module = ROOT / "dagster_gpu" / "billing" / "keys.py"
    out = ["# Metadata keys and tags", "",
           "Generated at build time from the code. What the keys mean, grouped as the UI shows them: "
           "[Metadata on each materialization](metadata.md).", "",
           "## Bills (`dagster_gpu/billing/keys.py`)", "",
           "| key | constant | meaning |", "|---|---|---|"]
    documented = documented_keys(keys_module)
    for const, key, doc in documented:
        out.append(f"| `{key}` | `{const}` | {_cell(doc)} |")
    out += ["", "## Op and run tags (`dagster_gpu/core/request.py`)", "",
            "Read from the asset's op tags; a run tag of the same name overrides the op tag.", "",
            "| tag | constant | meaning |", "|---|---|---|"]
    for tag, const, doc in request_tags():
        out.append(f"| `{tag}` | `{const}` | {_cell(doc)} |")
    out += ["", "## Every key the package names", "",
            "Each metadata key string in `dagster_gpu/` and the modules that name it.", "",
            "| key | modules |", "|---|---|"]
    for key, mods in keys_in_code().items():
        out.append(f"| `{key}` | {', '.join(f'`{m}`' for m in mods)} |")
    return "\n".join(out) + "\n"


def changelog_page() -> str:
    path = ROOT / "CHANGELOG.md"
    if not path.exists():
        return "# Changelog\n\nNo CHANGELOG.md at the repository root yet.\n"
    return path.read_text()


PAGES = {
    "reference/configuration.md": settings_page,
    "reference/commands.md": commands_page,
    "reference/metadata-keys.md": metadata_keys_page,
    "changelog.md": changelog_page,
}
