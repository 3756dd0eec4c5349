"""The output's columns read back with pyarrow, Polars and DuckDB (the readers a retrieval corpus uses).

A real output: embed_partition with the packaged all-MiniLM-L6-v2 on CPU over a JSON Lines corpus with an id
column, a carried title and year, and the text kept.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_gpu.corpus.readers import TextFormat
from dagster_gpu.embedding.model import load_model
from dagster_gpu.embedding.pipeline import embed_partition
from dagster_gpu.embedding.spec import EmbeddingSpec
from dagster_gpu.embedding.writer import read_lineage

DOCS = [
    {"id": "gpl-3", "title": "GNU GPL v3", "year": 2007, "text": "Everyone is permitted to copy and distribute."},
    {"id": "blank", "title": "blank", "year": 2000, "text": " "},
    {"id": "mit", "title": "MIT", "year": None, "text": "Permission is hereby granted, free of charge."},
]
LINEAGE = {"fingerprint": "fp1-00000000000000aa", "model": "all-MiniLM-L6-v2", "model_revision": "sha256:test",
           "prompt": "", "normalize": True}


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    d = tmp_path_factory.mktemp("out")
    src = d / "licenses.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in DOCS))
    out = d / "licenses.parquet"
    model = load_model("all-MiniLM-L6-v2", device="cpu")
    res = embed_partition(str(src), str(out), model, TextFormat(id_column="id", carry_columns=("title", "year")),
                          partition_key="licenses", spec=EmbeddingSpec(include_text=True), lineage=LINEAGE)
    assert (res.rows, res.records, res.skipped_empty_rows, res.records_embedded) == (2, 3, 1, 2)
    return out


def test_pyarrow(output):
    t = pq.read_table(output)
    assert t.column_names == ["doc_id", "record_id", "chunk_index", "char_start", "char_end", "token_count",
                              "text_sha256", "title", "year", "text", "vector"]
    assert t.column("doc_id").to_pylist() == ["gpl-3", "mit"]
    assert t.column("record_id").to_pylist() == [0, 2]
    assert t.column("title").to_pylist() == ["GNU GPL v3", "MIT"] and t.column("year").to_pylist() == [2007, None]
    assert t.column("text").to_pylist() == [DOCS[0]["text"], DOCS[2]["text"]]
    assert t.column("text_sha256").to_pylist() == [hashlib.sha256(d["text"].encode()).hexdigest() for d in (DOCS[0], DOCS[2])]
    assert t.schema.field("vector").type == pa.list_(pa.float32(), 384)
    assert all(n > 2 for n in t.column("token_count").to_pylist())
    lin = read_lineage(str(output))
    assert lin["fingerprint"] == "fp1-00000000000000aa" and lin["model_revision"] == "sha256:test"
    assert lin["lineage"]["partition_key"] == "licenses" and lin["lineage"]["source"].endswith("licenses.jsonl")


def test_polars(output):
    import polars as pl
    df = pl.read_parquet(output)
    assert df["doc_id"].to_list() == ["gpl-3", "mit"]
    assert df.schema["chunk_index"] == pl.Int32 and df.schema["char_end"] == pl.Int64
    assert df.schema["vector"] == pl.Array(pl.Float32, 384)
    vec = df["vector"].to_numpy()
    assert vec.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(vec, axis=1), 1.0, atol=1e-5)
    assert df.filter(pl.col("year").is_null())["title"].to_list() == ["MIT"]


def test_duckdb(output):
    import duckdb
    con = duckdb.connect()
    rows = con.execute(
        "SELECT doc_id, chunk_index, title, len(vector), list_dot_product(vector, vector) "
        f"FROM read_parquet('{output}') ORDER BY doc_id").fetchall()
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [("gpl-3", 0, "GNU GPL v3", 384), ("mit", 0, "MIT", 384)]
    assert all(abs(r[4] - 1.0) < 1e-4 for r in rows)
    (kv,) = con.execute(f"SELECT value FROM parquet_kv_metadata('{output}') WHERE key = 'dagster_gpu.fingerprint'").fetchone()
    assert kv == b"fp1-00000000000000aa"
