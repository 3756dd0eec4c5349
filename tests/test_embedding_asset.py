"""embedding_asset end to end on a real Dagster instance (in process, CPU): a prompted model made from the packaged
MiniLM, a chunked JSON Lines corpus of long documents with ids and titles carried, the lineage on the output and
the materialization, and Dagster's staleness after a configuration change."""

from __future__ import annotations

import json

import dagster as dg
import numpy as np
import pyarrow.parquet as pq
import pytest
from dagster import instance_for_test
from dagster._core.definitions.data_version import StaleStatus
from dagster._utils.test.data_versions import get_stale_status_resolver  # what the UI's stale status runs on

from dagster_gpu import CorpusSource, TextFormat, TokenChunks, embedding_asset
from dagster_gpu.instance.checks import CHECKS
from dagster_gpu.embedding.writer import read_lineage
from prompt_models import make_prompt_model

WORDS = "permission is hereby granted to any person obtaining a copy of this software".split()


def long_doc(n_words: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), n_words))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("asset")
    model = make_prompt_model(root / "model")
    corpus = root / "corpus"
    corpus.mkdir()
    docs = [{"id": "long", "title": "A long one", "text": long_doc(700, 1)},
            {"id": "short", "title": "Short", "text": "Permission is granted."},
            {"id": "blank", "title": "Blank", "text": ""}]
    (corpus / "licenses.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    return root, model, docs


def make(root, model, **kw):
    return embedding_asset(
        name="emb", corpus=CorpusSource(url=str(root / "corpus"), text_format=TextFormat()),
        output_url=str(root / "out"), model=str(model), device="cpu", id_column="id", carry_columns=["title"],
        include_text=True, **kw)


def test_chunked_prompted_asset_with_ids_lineage_and_staleness(setup):
    root, model, docs = setup
    chunks = TokenChunks(max_tokens=128, overlap=16)
    asset = make(root, model, chunking=chunks)
    assert asset.code_versions_by_key[asset.key] == make(root, model, chunking=chunks).code_versions_by_key[asset.key]
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("emb_files", ["licenses.jsonl"])
        r = dg.materialize([asset], instance=instance, partition_key="licenses.jsonl")
        assert r.success
        evs = [e.event_specific_data for e in r.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
        assert sorted((e.check_name, e.passed) for e in evs) == sorted((n, True) for n in CHECKS)

        t = pq.read_table(root / "out" / "emb" / "licenses.jsonl.parquet")
        ids = t.column("doc_id").to_pylist()
        n_long = ids.count("long")
        assert n_long >= 6 and ids == ["long"] * n_long + ["short"]  # 700 words at <= 128 tokens a window
        assert t.column("chunk_index").to_pylist() == list(range(n_long)) + [0]
        assert set(t.column("title").to_pylist()) == {"A long one", "Short"}
        assert max(t.column("token_count").to_pylist()) <= 128
        text = docs[0]["text"]
        spans = list(zip(t.column("char_start").to_pylist()[:n_long], t.column("char_end").to_pylist()[:n_long]))
        assert spans[0][0] == 0 and spans[-1][1] == len(text)
        assert all(b[0] < a[1] for a, b in zip(spans, spans[1:]))  # 16 tokens of overlap: windows overlap
        assert t.column("text").to_pylist()[:n_long] == [text[a:b] for a, b in spans]

        mat = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset.key, asset_partitions=["licenses.jsonl"]), limit=1).records[0]
        md = {k: getattr(v, "value", v) for k, v in mat.asset_materialization.metadata.items()}
        assert md["embedding/chunks"] == n_long + 1 and md["embedding/records_embedded"] == 2
        assert md["embedding/token_coverage"] == pytest.approx(1.0)
        assert md["embedding/prompt"] == "document"  # the model's default_prompt_name
        assert md["embedding/normalize"] is True and md["embedding/output_dtype"] == "float32"
        assert md["embedding/chunking"] == chunks.describe()
        lin = read_lineage(str(root / "out" / "emb" / "licenses.jsonl.parquet"))
        assert lin["fingerprint"] == md["embedding/fingerprint"] and lin["fingerprint"].startswith("fp1-")
        assert lin["lineage"]["prompt"] == "passage: " and lin["lineage"]["chunking"] == chunks.describe()
        tags = mat.asset_materialization.tags
        assert tags["dagster/code_version"] == asset.code_versions_by_key[asset.key]

        # Dagster 1.13: the partition is fresh under the same configuration, stale under another prompt
        def status(a):
            return get_stale_status_resolver(instance, [a]).get_status(a.key, "licenses.jsonl")

        assert status(asset) == StaleStatus.FRESH
        assert status(make(root, model, chunking=chunks, prompt_name="query")) == StaleStatus.STALE


def test_a_chunk_window_without_room_for_the_prompt_fails_the_partition_naming_the_file(setup):
    root, model, _ = setup
    asset = make(root, model, chunking=TokenChunks(max_tokens=3))  # [CLS] passage : [SEP] = 4 tokens
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("emb_files", ["licenses.jsonl"])
        r = dg.materialize([asset], instance=instance, partition_key="licenses.jsonl", raise_on_error=False)
        assert not r.success
        (failure,) = [e for e in r.all_events if e.event_type_value == "STEP_FAILURE"]
        msg = failure.event_specific_data.error.message
        assert "licenses.jsonl" in msg and "max_tokens=3" in msg
