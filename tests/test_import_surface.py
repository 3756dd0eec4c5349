"""One import surface: what a code location writes comes from ``dagster_gpu`` (listed in ``__all__``), and the
module paths 0.1.0 documented (README: ``from dagster_gpu.index.asset import vector_index_asset``,
``dagster_gpu.keys.output_name_for``, ``dagster_gpu.outputs.locate_output``; the homes of its public names)
still give the same objects, with a DeprecationWarning naming the new path."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import dagster_gpu

REPO = Path(__file__).resolve().parents[1]

#: What the demo code locations and the quickstart write (pipelines/definitions.py, pipelines/retrieval.py).
CODE_LOCATION_NAMES = {
    "CorpusSource", "TextFormat", "TokenChunks", "GpuRequest", "embedding_asset", "corpus_source", "gpu_executor",
    "vector_index_asset", "index_automation_sensor", "asset_job", "corpus_sensor", "backfill_missing_schedule",
    "unit_bills_sensor", "RateCard",
}


def test_every_name_of_all_resolves_to_its_module_object():
    assert CODE_LOCATION_NAMES <= set(dagster_gpu.__all__)
    assert dagster_gpu.__all__ == sorted(dagster_gpu._EXPORTS)
    for name in dagster_gpu.__all__:
        module = importlib.import_module(dagster_gpu._EXPORTS[name])
        assert getattr(dagster_gpu, name) is getattr(module, name), name
    with pytest.raises(AttributeError, match="module 'dagster_gpu' has no attribute 'nosuch'"):
        dagster_gpu.nosuch  # noqa: B018


def test_the_code_locations_import_only_from_the_package_root():
    for path in (REPO / "pipelines" / "definitions.py", REPO / "pipelines" / "retrieval.py"):
        tree = ast.parse(path.read_text())
        modules = {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("dagster_gpu")}
        assert modules == {"dagster_gpu"}, f"{path.name} imports from {sorted(modules)}"


# -- the paths of 0.1.0 ------------------------------------------------------------------------------
OLD_PATHS = [  # (old module, name, the new path the warning names)
    ("dagster_gpu.index.asset", "vector_index_asset", "from dagster_gpu import vector_index_asset"),
    ("dagster_gpu.index.asset", "index_automation_sensor", "from dagster_gpu import index_automation_sensor"),
    ("dagster_gpu.index.asset", "load_partition", "from dagster_gpu.definitions.vector_index import load_partition"),
    ("dagster_gpu.keys", "output_name_for", "from dagster_gpu.core.partition_keys import output_name_for"),
    ("dagster_gpu.outputs", "locate_output", "from dagster_gpu.embedding.outputs import locate_output"),
    ("dagster_gpu.assets", "embedding_asset", "from dagster_gpu import embedding_asset"),
    ("dagster_gpu.sensors", "asset_job", "from dagster_gpu import asset_job"),
    ("dagster_gpu.sensors", "corpus_sensor", "from dagster_gpu import corpus_sensor"),
    ("dagster_gpu.bills_sensor", "unit_bills_sensor", "from dagster_gpu import unit_bills_sensor"),
    ("dagster_gpu.source_versions", "corpus_source", "from dagster_gpu import corpus_source"),
    ("dagster_gpu.request", "GpuRequest", "from dagster_gpu import GpuRequest"),
    ("dagster_gpu.instance.settings", "config_field", "from dagster_gpu.settings.schema import config_field"),
    ("dagster_gpu.instance.source_versions", "corpus_source", "from dagster_gpu import corpus_source"),
]


@pytest.mark.parametrize("old, name, new", OLD_PATHS, ids=[f"{o}.{n}" for o, n, _ in OLD_PATHS])
def test_an_old_path_gives_the_same_object_with_a_warning_naming_the_new_path(old, name, new):
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning) as record:
        value = getattr(module, name)
    assert [str(w.message) for w in record] == [
        f"{old} is deprecated and will be removed in dagster-gpu 0.3.0: use `{new}`"]
    assert record[0].filename == __file__  # points at the code that used the old path
    target = importlib.import_module(dagster_gpu._MOVED_MODULES[old])
    assert value is getattr(target, name)
    with pytest.raises(AttributeError):
        getattr(module, "no_such_name")


def test_a_from_import_of_an_old_path_warns_in_a_fresh_interpreter():
    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            "from dagster_gpu.index.asset import vector_index_asset\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines()[-1] == (
        "DeprecationWarning: dagster_gpu.index.asset is deprecated and will be removed in dagster-gpu 0.3.0: "
        "use `from dagster_gpu import vector_index_asset`")


def test_each_moved_module_is_a_real_module_and_no_file_sits_at_an_old_path():
    for old, new in dagster_gpu._MOVED_MODULES.items():
        assert importlib.util.find_spec(new).origin.endswith(".py"), new
        assert not (REPO / (old.replace(".", "/") + ".py")).exists(), f"{old}: a file there would bypass the warning"
    # the new paths never warn: imported afresh in an interpreter of their own (a reload here would give the module
    # new function objects, no longer those dagster_gpu's names hold for the tests after this one)
    p = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c",
                        "import dagster_gpu.definitions.vector_index"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
