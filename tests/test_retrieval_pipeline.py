"""pipelines.make_licenses and pipelines.retrieval: the long-document corpus from Debian's base-files licenses."""

from __future__ import annotations

import json


from pipelines import make_licenses


def test_license_records_are_long_unique_documents():
    recs = make_licenses.license_records()
    ids = [r["id"] for r in recs]
    assert len(ids) == len(set(ids)) >= 10
    assert "GPL-3" in ids and "GPL" not in ids  # GPL is a symbolic link to GPL-3: each text once
    words = sorted(len(r["text"].split()) for r in recs)
    assert words[0] >= 200 and words[-1] >= 5000
    gpl3 = next(r for r in recs if r["id"] == "GPL-3")
    assert gpl3["title"] == "GNU GENERAL PUBLIC LICENSE" and gpl3["source"] == "/usr/share/common-licenses/GPL-3"


def test_corpus_files_and_prompted_model(tmp_path):
    files = make_licenses.write_corpus(tmp_path / "corpus", make_licenses.license_records())
    assert [f.name for f in files] == ["gnu.jsonl", "other.jsonl"]
    rows = [json.loads(line) for f in files for line in f.open()]
    assert {r["id"] for r in rows} == {r["id"] for r in make_licenses.license_records()}
    assert sorted(p.name for p in (tmp_path / "corpus").iterdir()) == ["gnu.jsonl", "other.jsonl"]  # no temp files
    model = make_licenses.make_prompt_model(tmp_path / "model")
    cfg = json.loads((model / "config_sentence_transformers.json").read_text())
    assert cfg["prompts"] == {"query": "query: ", "document": "passage: "} and cfg["default_prompt_name"] == "document"


def test_retrieval_definitions_load(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_GPU_RETRIEVAL_HOME", str(tmp_path))
    import importlib

    import pipelines.retrieval as r

    r = importlib.reload(r)
    asset = r.defs.resolve_assets_def("license_chunks")
    assert asset.code_versions_by_key[asset.key]
    assert r.license_corpus.url == str(tmp_path / "corpus")
