"""The demo code location end to end, in process: the real embedding asset embeds two small fortune files,
fortune_embeddings_index loads them (check passes), ``dagster-gpu search`` finds a record by its own text."""

from __future__ import annotations

import io
import json
import sys

import dagster as dg
import pytest

from rich.console import Console

from dagster_gpu.commands.backfill import summarize_partitions
from dagster_gpu.commands.main import main
from dagster_gpu.commands.progress import summary_table
from dagster_gpu.index.lance import VectorIndex
from tests.conftest import fortune_records

@pytest.mark.e2e
def test_demo_embeddings_index_and_search(tmp_path, monkeypatch, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    records = {}
    for name in ("cookie", "computers"):
        recs = fortune_records(name, 25)
        (corpus / name).write_text("\n%\n".join(recs) + "\n%\n")
        records[name] = recs
    for var, sub in (("DAGSTER_GPU_CORPUS_URL", "corpus"), ("DAGSTER_GPU_OUTPUT_URL", "out"), ("DAGSTER_GPU_INDEX_URI", "lance")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.setenv("DAGSTER_GPU_DEVICE", "cpu")
    monkeypatch.delitem(sys.modules, "pipelines.definitions", raising=False)
    import pipelines.definitions as d

    with dg.instance_for_test() as inst:
        keys = [f.key for f in d.fortune_corpus.list_files()]
        assert keys == ["computers", "cookie"]
        inst.add_dynamic_partitions(d.fortune_embeddings.partitions_def.name, keys)
        for k in keys:
            assert dg.materialize([d.fortune_embeddings], instance=inst, partition_key=k).success
            res = dg.materialize([d.fortune_index], instance=inst, partition_key=k)
            assert [e.passed for e in res.get_asset_check_evaluations()] == [True]
        # loading a partition again replaces its rows in one commit (the same rows: none removed)
        assert dg.materialize([d.fortune_index], instance=inst, partition_key="cookie").success
        # the index's own summary (not the embedding columns): rows, how each was written, its load's seconds
        rows = summarize_partitions(inst, d.fortune_index.key, keys)
        assert [(r.partition_key, r.rows, r.index.mode, r.index.deleted) for r in rows] == [
            ("computers", 25, "append", 0), ("cookie", 25, "replace", 0)]
        assert all(r.seconds > 0 and r.texts_per_second == pytest.approx(25 / r.seconds) for r in rows)
        assert rows[1].index.version > rows[0].index.version
        console = Console(file=io.StringIO(), width=200, record=True)
        console.print(summary_table(rows, title="index"))
        table = console.export_text()
        assert "write" in table and "replace" in table and "texts/s" not in table and "measured GPU-s" not in table
    ix = VectorIndex(str(tmp_path / "lance"), "fortune_embeddings")
    assert [ix.partition_rows(k) for k in keys] == [25, 25]
    [(fp, info)] = ix.fingerprints().items()
    assert fp.startswith("fp1-") and info["lineage"]["model"] == "all-MiniLM-L6-v2"
    text = records["computers"][7]
    assert main(["search", "-m", "pipelines.definitions", "-a", "fortune_embeddings", text, "-k", "3", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[0]["doc_id"] == "computers/7" and rows[0]["distance"] < 1e-3
    assert rows[0]["fingerprint"] == fp and len(rows) == 3
