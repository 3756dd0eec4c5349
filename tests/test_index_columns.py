"""The vector index through a change of its embeddings' output columns, on real parquet outputs, a real LanceDB
table, the index asset run by Dagster, and the CLI (``search``, ``stale``, ``index --rebuild``) against the same
instance: every partition stays searchable with no manual step, a partition that cannot load says why, and the
table's size is recorded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow as pa
import pytest

from dagster_gpu.commands.main import main
from dagster_gpu.definitions.assets import output_uri_for
from dagster_gpu.embedding.model import load_model
from dagster_gpu.index.lance import VectorIndex
from tests.index_helpers import write_output

KEYS = ["a.jsonl", "b.jsonl", "c.jsonl"]


@pytest.fixture(scope="module")
def model():
    return load_model("all-MiniLM-L6-v2", device="cpu")


def _write(root: Path, pk: str, model, *, dim: int | None = None, package: bool = False, seed: int = 0) -> None:
    n, dim = 3, dim or model.dim
    write_output(Path(output_uri_for(str(root / "out"), "emb", pk)), n, dim, pk=pk, fingerprint="fp1-minilm",
                 vectors=np.random.default_rng(seed).standard_normal((n, dim)), model_revision=model.revision,
                 carried={"package": pa.array([f"{pk}-pkg"] * n)} if package else None)


def _embedded(instance, emb_key, *keys):
    for pk in keys:
        instance.report_runless_asset_event(dg.AssetMaterialization(emb_key, partition=pk))


def test_the_index_follows_a_column_change_says_why_a_load_failed_and_rebuilds(tmp_path, monkeypatch, capsys, model):
    monkeypatch.setenv("DAGSTER_GPU_INDEX_TEST_DIR", str(tmp_path))
    monkeypatch.delitem(sys.modules, "tests.index_pipeline", raising=False)  # its paths are read at import
    import importlib

    location = importlib.import_module("tests.index_pipeline")

    emb, idx = location.emb, location.emb_index
    ix = VectorIndex(str(tmp_path / "lance"), "emb")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(emb.partitions_def.name, KEYS)
        for i, pk in enumerate(KEYS):  # first written with a carried column
            _write(tmp_path, pk, model, package=True, seed=i)
        _embedded(instance, emb.key, *KEYS)
        for pk in KEYS:
            assert dg.materialize([idx], instance=instance, partition_key=pk).success
        # the outputs lose their carried column (the asset's carry_columns removed); two are embedded again
        for i, pk in enumerate(KEYS[:2]):
            _write(tmp_path, pk, model, seed=10 + i)
        _embedded(instance, emb.key, *KEYS[:2])
        for pk in KEYS[:2]:  # once: IndexSchemaError "column 'package' missing", for every partition after the first
            res = dg.materialize([idx], instance=instance, partition_key=pk)
            assert res.success
        assert ix.partition_keys() == set(KEYS) and ix.count_rows() == 9
        # the run's last partition carries the table's footprint
        md = res.asset_materializations_for_node(idx.op.name)[-1].metadata
        assert md["index/disk_bytes"].value > 0 and md["index/versions"].value >= 1
        assert md["index/fragments"].value >= 1
        capsys.readouterr()
        assert main(["search", "-m", "tests.index_pipeline", "-a", "emb_index", "a package", "-k", "9", "--json"]) == 0
        out = capsys.readouterr()
        got = [json.loads(line) for line in out.out.splitlines()]
        assert {r["partition_key"] for r in got} == set(KEYS) and "warning" not in out.err
        assert {r["partition_key"]: r["package"] for r in got if r["package"]} == {"c.jsonl": "c.jsonl-pkg"}

        # a partition whose output cannot go in (another vector dimension) fails alone, and says so
        instance.add_dynamic_partitions(emb.partitions_def.name, ["d.jsonl"])
        _write(tmp_path, "d.jsonl", model, dim=4)
        _embedded(instance, emb.key, "d.jsonl")
        assert not dg.materialize([idx], instance=instance, partition_key="d.jsonl", raise_on_error=False).success
        assert main(["stale", "-m", "tests.index_pipeline", "-a", "emb_index", "--json"]) == 0
        stale = json.loads(capsys.readouterr().out)["stale"]
        assert [s["partition_key"] for s in stale] == ["d.jsonl"]
        assert stale[0]["reasons"][0].startswith("load failed: IndexSchemaError: partition 'd.jsonl' does not fit "
                                                 "index table 'emb'")
        assert main(["search", "-m", "tests.index_pipeline", "-a", "emb_index", "a package", "--json"]) == 0
        err = capsys.readouterr().err
        assert ("warning: the index lacks 1 of the 4 materialized partitions of emb (d.jsonl): these results leave "
                "them out. Why: dagster-gpu stale -m tests.index_pipeline -a emb_index; load them: dagster-gpu "
                "backfill -m tests.index_pipeline -a emb_index --stale (or rebuild the table: dagster-gpu index -m "
                "tests.index_pipeline -a emb_index --rebuild)") in err

        # the rebuild names what it could not load; once the output fits, it loads every partition
        assert main(["index", "-m", "tests.index_pipeline", "-a", "emb_index", "--rebuild"]) == 1
        assert "1 partition(s) not loaded: d.jsonl: IndexSchemaError" in capsys.readouterr().err
        _write(tmp_path, "d.jsonl", model, seed=20)
        assert main(["index", "-m", "tests.index_pipeline", "-a", "emb", "--rebuild"]) == 0
        assert "rebuilt emb_index: 4 partition(s), 12 rows, ANN index flat" in capsys.readouterr().out
        assert ix.partition_keys() == {*KEYS, "d.jsonl"}
        assert main(["stale", "-m", "tests.index_pipeline", "-a", "emb_index", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["stale"] == []
        last = instance.get_latest_materialization_event(idx.key).asset_materialization.metadata
        assert last["index/rebuilt"].value is True and last["index/disk_bytes"].value > 0


def test_a_partition_loaded_with_no_rows_counts_as_indexed(tmp_path, monkeypatch, capsys, model):
    """An empty file's output (0 rows) puts nothing in the table; once the index asset loaded it after its latest
    embeddings materialization, ``search`` does not count it as lacking (nor suggest a rebuild). Embedded again and
    not loaded since, it is lacking again."""
    monkeypatch.setenv("DAGSTER_GPU_INDEX_TEST_DIR", str(tmp_path))
    monkeypatch.delitem(sys.modules, "tests.index_pipeline", raising=False)  # its paths are read at import
    import importlib

    location = importlib.import_module("tests.index_pipeline")
    emb, idx = location.emb, location.emb_index
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(emb.partitions_def.name, ["a.jsonl", "empty.txt"])
        _write(tmp_path, "a.jsonl", model)
        write_output(Path(output_uri_for(str(tmp_path / "out"), "emb", "empty.txt")), 0, model.dim, pk="empty.txt",
                     fingerprint="fp1-minilm", model_revision=model.revision)
        _embedded(instance, emb.key, "a.jsonl", "empty.txt")
        for pk in ("a.jsonl", "empty.txt"):
            res = dg.materialize([idx], instance=instance, partition_key=pk)
        assert res.asset_materializations_for_node(idx.op.name)[-1].metadata["index/rows"].value == 0
        assert VectorIndex(str(tmp_path / "lance"), "emb").partition_keys() == {"a.jsonl"}
        capsys.readouterr()
        assert main(["search", "-m", "tests.index_pipeline", "-a", "emb_index", "a package", "--json"]) == 0
        err = capsys.readouterr().err
        assert "warning" not in err and "--rebuild" not in err, err
        _embedded(instance, emb.key, "empty.txt")  # embedded again, not loaded since
        assert main(["search", "-m", "tests.index_pipeline", "-a", "emb_index", "a package", "--json"]) == 0
        assert "warning: the index lacks 1 of the 2 materialized partitions of emb (empty.txt)" in capsys.readouterr().err
