"""EmbeddingSpec's JSON round trip, and embedding_asset's grouped form (spec=, output=, compute=) against the flat
keywords of earlier releases: the same asset (code version, op tags, metadata, backfill policy), the same vectors
(real packaged all-MiniLM-L6-v2 on CPU, in process), and one DeprecationWarning naming the grouped form."""

from __future__ import annotations

import dataclasses
import json
import warnings

import dagster as dg
import numpy as np
import pyarrow.parquet as pq
import pytest

from dagster_gpu import CorpusSource, GpuRequest, TextFormat, TokenChunks, embedding_asset
from dagster_gpu.core.request import TAG_CHECKPOINT_RECORDS
from dagster_gpu.definitions.asset_options import FLAT_KEYWORDS, ComputeSpec, OutputSpec
from dagster_gpu.definitions.assets import CONFIG_METADATA_KEY
from dagster_gpu.embedding.spec import EmbeddingSpec

FULL = EmbeddingSpec(model="/models/e5-small", revision="abc123", cache_folder="/hf", trust_remote_code=True,
                     max_seq_length=128, dtype="float16", batch_size=32, prompt_name="document",
                     chunking=TokenChunks(max_tokens=96, overlap=16, boundary="paragraph"), normalize=False,
                     truncate_dim=64, output_dtype="float16", id_column="id", carry_columns=["title", "year"],
                     include_text=True)


@pytest.mark.parametrize("spec", [EmbeddingSpec(), FULL, EmbeddingSpec(prompt="query: ", carry_columns=())])
def test_the_spec_round_trips_through_json(spec):
    text = spec.to_json()
    assert EmbeddingSpec.from_json(text) == spec
    assert EmbeddingSpec.from_json(text).to_json() == text
    assert json.loads(text)["carry_columns"] == (None if spec.carry_columns is None else list(spec.carry_columns))


def test_the_full_spec_json_names_every_field():
    data = json.loads(FULL.to_json())
    assert sorted(data) == sorted(f.name for f in dataclasses.fields(EmbeddingSpec))
    assert data["chunking"] == {"max_tokens": 96, "overlap": 16, "boundary": "paragraph"}
    assert data["carry_columns"] == ["title", "year"] and FULL.carry_columns == ("title", "year")
    assert data["truncate_dim"] == 64 and data["output_dtype"] == "float16"


def test_bad_json_and_bad_fields_are_named():
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['vector_name'\]"):
        EmbeddingSpec.from_json(json.dumps({"model": "m", "vector_name": "v"}))
    with pytest.raises(ValueError, match="expected a JSON object, got list"):
        EmbeddingSpec.from_json("[]")
    with pytest.raises(ValueError, match="truncate_dim must be >= 1, got 0"):
        EmbeddingSpec(truncate_dim=0)
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        EmbeddingSpec(batch_size=0)
    with pytest.raises(ValueError, match="float64"):
        EmbeddingSpec(output_dtype="float64")


def test_every_flat_keyword_has_one_group_field():
    # the 25 flat keywords of embedding_asset besides corpus, name, partitions_def, group_name, key_prefix,
    # retry_policy: each is a field of the group it names
    assert len(FLAT_KEYWORDS) == 25
    classes = {"spec": EmbeddingSpec, "output": OutputSpec, "compute": ComputeSpec}
    for key, (group, name) in FLAT_KEYWORDS.items():
        assert name in {f.name for f in dataclasses.fields(classes[group])}, key


# -- the grouped and the flat form ---------------------------------------------------------------------------------
def _corpus(root) -> CorpusSource:
    return CorpusSource(url=str(root / "corpus"), text_format=TextFormat())


FLAT = dict(model="all-MiniLM-L6-v2", batch_size=8, truncate_dim=16, chunking=TokenChunks(max_tokens=32, overlap=8),
            id_column="id", carry_columns=["title"], include_text=True, output_dtype="float16", device="cpu",
            read_batch_rows=2, gpu=GpuRequest(count=1, memory_gib=2), max_partitions_per_run=3,
            checkpoint_every_batches=2)


def _flat(root, out: str = "out"):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asset = embedding_asset(name="emb", corpus=_corpus(root), output_url=str(root / out), **FLAT)
    return asset, [w for w in caught if issubclass(w.category, DeprecationWarning)]


def _grouped(root, out: str = "out"):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asset = embedding_asset(
            "emb", corpus=_corpus(root), output=OutputSpec(url=str(root / out)),
            spec=EmbeddingSpec(model="all-MiniLM-L6-v2", batch_size=8, truncate_dim=16,
                               chunking=TokenChunks(max_tokens=32, overlap=8), id_column="id",
                               carry_columns=("title",), include_text=True, output_dtype="float16"),
            compute=ComputeSpec(device="cpu", read_batch_rows=2, gpu=GpuRequest(count=1, memory_gib=2),
                                max_partitions_per_run=3, checkpoint_every_batches=2))
    return asset, [w for w in caught if issubclass(w.category, DeprecationWarning)]


def test_the_flat_form_warns_once_naming_the_grouped_form(tmp_path):
    _, warned = _flat(tmp_path)
    assert len(warned) == 1
    assert str(warned[0].message) == (
        "embedding_asset(output_url=…, model=…, batch_size=…, truncate_dim=…, chunking=…, id_column=…, "
        "carry_columns=…, include_text=…, output_dtype=…, device=…, read_batch_rows=…, gpu=…, "
        "max_partitions_per_run=…, checkpoint_every_batches=…) is deprecated: pass output=OutputSpec(url=…), "
        "spec=EmbeddingSpec(model=…, batch_size=…, truncate_dim=…, chunking=…, id_column=…, carry_columns=…, "
        "include_text=…, output_dtype=…), compute=ComputeSpec(device=…, read_batch_rows=…, gpu=…, "
        "max_partitions_per_run=…, checkpoint_every_batches=…)")
    assert warned[0].filename == __file__  # stacklevel: the caller's line, not the library's
    _, none = _grouped(tmp_path)
    assert none == []


def test_flat_keyword_errors_name_the_keyword(tmp_path):
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['modle'\]"):
        embedding_asset(corpus=_corpus(tmp_path), output=str(tmp_path), modle="x")
    with pytest.raises(TypeError, match=r"truncate_dim= and spec= both given; pass truncate_dim in spec=EmbeddingSpec"):
        embedding_asset(corpus=_corpus(tmp_path), output=str(tmp_path), spec=EmbeddingSpec(), truncate_dim=8)
    with pytest.raises(ValueError, match=r"embedding_asset 'bad': EmbeddingSpec.truncate_dim must be >= 1, got 0"):
        embedding_asset(name="bad", corpus=_corpus(tmp_path), output_url=str(tmp_path), truncate_dim=0)
    with pytest.raises(TypeError, match="output= is required"):
        embedding_asset(corpus=_corpus(tmp_path))


def _definition(asset: dg.AssetsDefinition) -> dict:
    return {"code_version": asset.code_versions_by_key[asset.key], "op_tags": dict(asset.op.tags),
            "config": asset.metadata_by_key[asset.key][CONFIG_METADATA_KEY].value,
            "metadata": {k: str(v) for k, v in asset.metadata_by_key[asset.key].items()},
            "per_run": asset.backfill_policy.max_partitions_per_run, "partitions": asset.partitions_def.name,
            "description": asset.descriptions_by_key[asset.key], "checks": sorted(c.name for c in asset.check_specs)}


def test_the_grouped_and_the_flat_form_build_the_same_asset_and_vectors(tmp_path):
    (tmp_path / "corpus").mkdir()
    docs = [{"id": f"d{i}", "title": f"T{i}", "text": " ".join(["permission is hereby granted"] * (3 + 5 * i))}
            for i in range(4)]
    (tmp_path / "corpus" / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    flat, _ = _flat(tmp_path, "out_a")
    grouped, _ = _grouped(tmp_path, "out_b")
    a, b = _definition(flat), _definition(grouped)
    assert a["metadata"].pop("dagster_gpu/output_url") != b["metadata"].pop("dagster_gpu/output_url")
    assert a.pop("description").replace("out_a", "out_b") == b.pop("description")
    assert a == b
    assert a["op_tags"][TAG_CHECKPOINT_RECORDS] == "4" and a["per_run"] == 3
    assert a["config"]["truncate_dim"] == 16 and a["config"]["chunking"]["max_tokens"] == 32

    tables = []
    for asset in (flat, grouped):
        with dg.instance_for_test() as instance:
            instance.add_dynamic_partitions("emb_files", ["docs.jsonl"])
            assert dg.materialize([asset], instance=instance, partition_key="docs.jsonl").success
        tables.append(pq.read_table(next((tmp_path / ("out_a" if asset is flat else "out_b")).rglob("*.parquet"))))
    f, g = tables
    assert f.num_rows == g.num_rows > len(docs)  # chunked: the longer documents are several rows
    assert f.schema.field("vector").type.list_size == 16
    assert np.array_equal(np.stack(f.column("vector").to_numpy(zero_copy_only=False)),
                          np.stack(g.column("vector").to_numpy(zero_copy_only=False)))
    assert f.drop_columns(["vector"]).equals(g.drop_columns(["vector"]))
    assert f.column("doc_id").to_pylist()[0] == "d0" and set(f.column("title").to_pylist()) == {"T0", "T1", "T2", "T3"}
