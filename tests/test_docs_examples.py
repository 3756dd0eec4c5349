"""Every code block of README.md and docs/ runs or validates, and every internal link resolves.

- A ``python`` block is executed on its own and must build Dagster definitions: its ``defs`` (a
  ``dagster.Definitions``), else the assets, jobs, sensors and schedules it made; ``Definitions.validate_loadable``
  then resolves them as a code location load would.
- A ``yaml`` block is gpu_executor's config (``execution: config:`` or the config itself, or one backend's section
  indented as under ``execution: config:``) and must validate against ``GPU_EXECUTOR_CONFIG`` with no deprecated
  key; a block titled with another file (```` ```yaml title="workspace.yaml" ````) must only parse.
- Blocks of shell commands or output are marked ``bash``, ``sh`` or ``text``; a block with another or no
  language fails; a ``json`` block must parse.
- A repository path or a ``dagster_gpu.`` name the pages give in backticks must exist.
- A relative link of README.md must name a file of the repository (and a heading of it after ``#``); a link of a
  docs page must name a page of the site (the generated ones included) or a heading of it.
"""

from __future__ import annotations

import re
import textwrap
import warnings
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
                   re.M | re.S)
LINK = re.compile(r"(?<!\!)\[[^\]\n]*\]\(([^)\s]+)\)")
SHELL_OR_OUTPUT = {"bash", "sh", "text"}
CHECKED = {"python", "yaml", "json"}
#: Pages whose unmarked blocks are their owner's to mark (each is a layout or output block); the other checks apply.
UNMARKED_ALLOWED = {"docs/architecture.md"}


def doc_files() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def blocks(path: Path) -> list[tuple[int, str, str]]:
    """(line, info string, dedented body) of each fenced block of a Markdown file."""
    text = path.read_text()
    return [(text.count("\n", 0, m.start()) + 1, m["info"].strip(), textwrap.dedent(m["body"]))
            for m in FENCE.finditer(text)]


def _blocks_of(lang: str) -> list:
    return [pytest.param(path, line, info, body, id=f"{path.relative_to(ROOT)}:{line}")
            for path in doc_files() for line, info, body in blocks(path) if (info.split() or [""])[0] == lang]


def test_every_block_is_marked_with_a_known_language():
    unmarked = [f"{p.relative_to(ROOT)}:{line} ({info or 'no language'})" for p in doc_files()
                for line, info, _ in blocks(p) if (info.split() or [""])[0] not in SHELL_OR_OUTPUT | CHECKED
                and p.relative_to(ROOT).as_posix() not in UNMARKED_ALLOWED]
    assert unmarked == [], "mark each block python, yaml (checked) or bash/sh/text (shell or output): " + ", ".join(unmarked)


def test_the_docs_have_blocks_of_each_kind():
    assert len(_blocks_of("python")) >= 5 and len(_blocks_of("yaml")) >= 8


@pytest.mark.parametrize("path,line,info,body", _blocks_of("python"))
def test_python_block_builds_its_definitions(path, line, info, body, tmp_path):
    import dagster as dg

    # a block that is a file of the reader's project (``definitions.py``) may place things beside itself
    ns: dict = {"__name__": f"docs_block_{line}", "__file__": str(tmp_path / "definitions.py")}
    with warnings.catch_warnings():  # a documented example uses no deprecated form (embedding_asset's flat keywords…)
        warnings.simplefilter("error", DeprecationWarning)
        exec(compile(body, f"{path.relative_to(ROOT)}:{line}", "exec"), ns)
    defs = ns.get("defs")
    if not isinstance(defs, dg.Definitions):
        kinds = (dg.AssetsDefinition, dg.SensorDefinition, dg.ScheduleDefinition, dg.JobDefinition,
                 dg.AssetSpec)
        made = [v for k, v in ns.items() if not k.startswith("__") and isinstance(v, kinds)]
        assert made, f"{path.relative_to(ROOT)}:{line}: the block builds no Dagster definitions"
        defs = dg.Definitions(
            assets=[v for v in made if isinstance(v, (dg.AssetsDefinition, dg.AssetSpec))],
            sensors=[v for v in made if isinstance(v, dg.SensorDefinition)],
            schedules=[v for v in made if isinstance(v, dg.ScheduleDefinition)],
            jobs=[v for v in made if isinstance(v, dg.JobDefinition)])
    dg.Definitions.validate_loadable(defs)


@pytest.mark.parametrize("path,line,info,body", _blocks_of("json"))
def test_json_block_parses(path, line, info, body):
    import json

    assert json.loads(body) is not None


def executor_config(doc):
    """The gpu_executor config a YAML block holds, or None when it holds none."""
    from dagster_gpu.executor.executor import GPU_EXECUTOR_CONFIG

    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("execution"), dict) and "config" in doc["execution"]:
        return doc["execution"]["config"]
    return doc if doc and set(doc) <= set(GPU_EXECUTOR_CONFIG) else None


def deprecated_keys(config_type, value, path="") -> list[str]:
    """Keys of ``value`` whose schema field is described as deprecated (a renamed setting's old name)."""
    found = []
    fields = getattr(config_type, "fields", None)
    if not isinstance(value, dict) or not fields:
        return found
    for key, v in value.items():
        field = fields.get(key)
        if field is None:
            continue
        if (field.description or "").startswith("Deprecated"):
            found.append(path + key)
        inner = field.config_type
        inner = getattr(inner, "inner_type", inner) if inner.kind.name == "NONEABLE" else inner
        found += deprecated_keys(inner, v, f"{path}{key}.")
    return found


@pytest.mark.parametrize("path,line,info,body", _blocks_of("yaml"))
def test_yaml_block_is_valid_executor_config(path, line, info, body):
    from dagster._config import validate_config
    from dagster._config.field_utils import convert_potential_field
    from dagster_gpu.executor.executor import GPU_EXECUTOR_CONFIG

    where = f"{path.relative_to(ROOT)}:{line}"
    doc = yaml.safe_load(body)
    if "title=" in info:
        assert doc is not None, f"{where}: empty YAML"
        return
    config = executor_config(doc)
    assert config is not None, (f"{where}: not gpu_executor's config (top-level keys {sorted(doc or {})}); give a "
                                f"block of another file a title=\"<file>\"")
    config_type = convert_potential_field(GPU_EXECUTOR_CONFIG).config_type
    result = validate_config(config_type, config)
    assert result.success, f"{where}: " + "; ".join(e.message for e in result.errors)
    assert deprecated_keys(config_type, config) == [], f"{where}: deprecated keys"


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc gives a heading (lower case, punctuation dropped, spaces to '-')."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
    text = re.sub(r"[^\w\s-]", "", text.strip().lower())
    return re.sub(r"[\s-]+", "-", text).strip("-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} +(.+?) *#*$", text, re.M)}


def _links(path: Path) -> list[str]:
    return [t for t in LINK.findall(FENCE.sub("", path.read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("<")]


def test_readme_links_resolve():
    bad = []
    for target in _links(ROOT / "README.md"):
        file, _, anchor = target.partition("#")
        dest = (ROOT / file) if file else ROOT / "README.md"
        if not dest.exists():
            bad.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(target)
    assert bad == [], f"README.md: dead links {bad}"


def test_docs_links_resolve():
    from scripts.docs.reference import PAGES

    docs = ROOT / "docs"
    generated = {docs / p for p in PAGES}
    bad = []
    for page in sorted(docs.rglob("*.md")):
        for target in _links(page):
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not (dest.exists() or dest in generated) or docs not in dest.parents:
                bad.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and dest.exists() and anchor not in anchors(dest):
                bad.append(f"{page.relative_to(ROOT)}: {target}")
    assert bad == [], f"dead links: {bad}"


def test_metadata_keys_named_in_the_docs_exist_in_the_code():
    """A metadata key the docs name in backticks (``embedding/rows``) is one the code writes: a renamed key fails."""
    from scripts.docs.reference import KEY_RE, keys_in_code

    known = set(keys_in_code())
    named = {}
    for path in doc_files():
        for key in re.findall(r"`((?:embedding|billing|gpu|corpus|index|slurm|k8s)/[a-z0-9_]+)`", path.read_text()):
            named.setdefault(key, path.relative_to(ROOT).as_posix())
    assert KEY_RE.pattern and named, "no key named in the docs"
    unknown = {k: p for k, p in named.items() if k not in known}
    assert unknown == {}, f"keys the docs name that no module of dagster_gpu writes: {unknown}"


#: a repository path: a file (with an extension) or a folder (ending in /); ``dagster_gpu/placement`` is a metadata key
PATH_RE = re.compile(r"`((?:dagster_gpu|bench|tests|resources|scripts|pipelines|docker|docs)/(?:[A-Za-z0-9_./-]*\.[A-Za-z0-9]+|[A-Za-z0-9_./-]*/))`")
DOTTED_RE = re.compile(r"`(dagster_gpu(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`")


def _named(pattern: re.Pattern) -> dict[str, str]:
    named: dict[str, str] = {}
    for path in doc_files():
        if path.relative_to(ROOT).as_posix() in UNMARKED_ALLOWED:
            continue
        for name in pattern.findall(path.read_text()):
            named.setdefault(name, path.relative_to(ROOT).as_posix())
    return named


def test_files_the_docs_name_exist():
    """A repository path the docs name in backticks (``dagster_gpu/slurm/window.py``, ``bench/preempt.py``) exists:
    a moved or renamed file fails here."""
    from scripts.docs.reference import PAGES

    generated = {f"docs/{p}" for p in PAGES}
    named = _named(PATH_RE)
    assert len(named) > 40
    gone = {p: page for p, page in named.items() if not (ROOT / p).exists() and p not in generated}
    assert gone == {}, f"paths the docs name that do not exist: {gone}"


def test_python_names_the_docs_give_resolve():
    """A dotted name the docs give (``dagster_gpu.embedding.writer.read_lineage``) is a module of the package, an
    attribute of one, or a key string the package writes."""
    import importlib

    source = "".join(p.read_text() for p in (ROOT / "dagster_gpu").rglob("*.py"))
    bad = {}
    for name, page in _named(DOTTED_RE).items():
        if f'"{name}"' in source:  # a key the package writes (parquet key-value metadata: dagster_gpu.fingerprint)
            continue
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            try:
                for attr in parts[i:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                bad[name] = page
            break
        else:
            bad[name] = page
    assert bad == {}, f"names the docs give that do not resolve: {bad}"
