"""``dagster-gpu search`` on a real index of real all-MiniLM-L6-v2 vectors: the nearest doc, --json, and the
refusal of an index holding two fingerprints."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dagster_gpu.commands.main import main
from dagster_gpu.embedding.encoder import Encoder
from dagster_gpu.embedding.model import load_model
from dagster_gpu.definitions.vector_index import load_partition
from dagster_gpu.index.lance import VectorIndex
from dagster_gpu.commands.search import QueryOptions, choose_fingerprint, embed_query, query_options, SearchError
from tests.index_helpers import write_output

DOCS = {
    "pets.txt": ["The kitten chased a ball of yarn across the floor.", "My dog loves long walks in the park."],
    "money.txt": ["The central bank raised interest rates by half a point.", "Stock markets fell sharply on Monday."],
}


@pytest.fixture(scope="module")
def model():
    return load_model("all-MiniLM-L6-v2", device="cpu")


def _index(root: Path, model, fingerprints=("fp1-minilm", "fp1-minilm"), revision=None) -> VectorIndex:
    from dagster_gpu.definitions.assets import output_uri_for

    enc = Encoder(model.model, 8)
    ix = VectorIndex(str(root / "lance"), "emb")
    for (pk, texts), fp in zip(DOCS.items(), fingerprints):
        uri = Path(output_uri_for(str(root / "out"), "emb", pk))
        write_output(uri, len(texts), model.dim, pk=pk, fingerprint=fp, vectors=enc.encode(texts).vectors,
                     model_revision=revision or model.revision)
        load_partition(ix, pk, str(uri))
    return ix


def test_choose_fingerprint_and_query_options():
    found = {"fp1-a": {"rows": 3}, "fp1-b": {"rows": 2}}
    with pytest.raises(SearchError, match=r"2 fingerprints \(fp1-a \(3 rows\), fp1-b \(2 rows\)\).*--fingerprint"):
        choose_fingerprint(found, None, "index x")
    assert choose_fingerprint(found, "fp1-b", "index x") == "fp1-b"
    with pytest.raises(SearchError, match="no rows of fingerprint 'fp1-c'"):
        choose_fingerprint(found, "fp1-c", "index x")
    assert query_options({"model": "m", "truncate_dim": 64, "normalize": False}) == QueryOptions(
        "m", None, None, False, 64, "float32")
    with pytest.raises(SearchError, match="pass --model"):
        query_options({})


def test_search_prints_the_nearest_docs(tmp_path, monkeypatch, capsys, model):
    monkeypatch.setenv("DAGSTER_GPU_INDEX_TEST_DIR", str(tmp_path))
    monkeypatch.delitem(sys.modules, "tests.index_pipeline", raising=False)  # its paths are read at import
    _index(tmp_path, model)
    assert main(["search", "-m", "tests.index_pipeline", "-a", "emb", "a cat playing", "-k", "3", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["doc_id"] for r in rows][:1] == ["pets.txt/0"] and len(rows) == 3
    assert rows[0]["partition_key"] == "pets.txt" and rows[0]["chunk_index"] == 0
    # the query vector is what encode gives the query (the model has no query prompt: prompt "")
    vec, prompt = embed_query("a cat playing", QueryOptions("all-MiniLM-L6-v2", None, None, True, None, "float32"))
    assert prompt == "" and rows[0]["distance"] == pytest.approx(1 - float(vec @ Encoder(model.model, 8).encode(
        [DOCS["pets.txt"][0]]).vectors[0]), abs=1e-4)
    assert main(["search", "-m", "tests.index_pipeline", "-a", "emb_index", "interest rates", "-k", "2"]) == 0
    out = capsys.readouterr().out
    assert "money.txt/0" in out and "money.txt" in out and "distance" in out


def test_search_refuses_two_fingerprints_unless_told(tmp_path, monkeypatch, capsys, model):
    monkeypatch.setenv("DAGSTER_GPU_INDEX_TEST_DIR", str(tmp_path))
    monkeypatch.delitem(sys.modules, "tests.index_pipeline", raising=False)  # its paths are read at import
    _index(tmp_path, model, fingerprints=("fp1-one", "fp1-two"))
    assert main(["search", "-m", "tests.index_pipeline", "-a", "emb_index", "dog", "--json"]) == 2
    assert "holds rows of 2 fingerprints (fp1-one (2 rows), fp1-two (2 rows))" in capsys.readouterr().err
    assert main(["search", "-m", "tests.index_pipeline", "-a", "emb_index", "dog", "--json", "--fingerprint", "fp1-two"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["fingerprint"] for r in rows} == {"fp1-two"} and len(rows) == 2


def test_search_refuses_other_weights_than_the_rows(tmp_path, monkeypatch, capsys, model):
    monkeypatch.setenv("DAGSTER_GPU_INDEX_TEST_DIR", str(tmp_path))
    monkeypatch.delitem(sys.modules, "tests.index_pipeline", raising=False)
    _index(tmp_path, model, revision="sha256:0000000000000000")
    assert main(["search", "-m", "tests.index_pipeline", "-a", "emb_index", "dog"]) == 2
    err = capsys.readouterr().err
    assert f"here is revision {model.revision}, the rows were embedded with sha256:0000000000000000" in err


def test_search_shows_the_text_and_the_carried_columns(tmp_path, monkeypatch, capfd, model):
    """An index of outputs that kept their text (include_text) and carry a column: --json and the table show both,
    and nothing warns (LanceDB's "_distance" deprecation warning included)."""
    import warnings

    import pyarrow as pa

    from dagster_gpu.definitions.assets import output_uri_for

    monkeypatch.setenv("DAGSTER_GPU_INDEX_TEST_DIR", str(tmp_path))
    monkeypatch.delitem(sys.modules, "tests.index_pipeline", raising=False)
    enc = Encoder(model.model, 8)
    ix = VectorIndex(str(tmp_path / "lance"), "emb")
    for pk, texts in DOCS.items():
        uri = Path(output_uri_for(str(tmp_path / "out"), "emb", pk))
        write_output(uri, len(texts), model.dim, pk=pk, fingerprint="fp1-minilm", vectors=enc.encode(texts).vectors,
                     model_revision=model.revision, texts=texts,
                     carried={"author": pa.array([f"{pk}-author-{i}" for i in range(len(texts))])})
        load_partition(ix, pk, str(uri))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["search", "-m", "tests.index_pipeline", "-a", "emb", "a cat playing", "-k", "2", "--json"]) == 0
    captured = capfd.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert rows[0]["doc_id"] == "pets.txt/0"
    assert rows[0]["text"] == DOCS["pets.txt"][0] and rows[0]["author"] == "pets.txt-author-0"
    assert "_distance" not in captured.err  # LanceDB's Rust log goes to fd 2: capfd sees it
    assert main(["search", "-m", "tests.index_pipeline", "-a", "emb_index", "interest rates", "-k", "1"]) == 0
    out = capfd.readouterr().out
    assert "text" in out and "author" in out and "money.txt-author-0" in out
    assert "The central bank raised interest rates" in out
