"""AtomicParquetWriter: schema, atomic appearance, and no trace on failure."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_gpu.embedding.writer import (
    AtomicParquetWriter, lineage_metadata, output_schema, output_table, read_lineage, vector_type,
)


def table(ids, dim, schema, seed=0):
    rng = np.random.default_rng(seed)
    vec = rng.standard_normal((len(ids), dim)).astype(np.float32)
    n = len(ids)
    return output_table(
        schema, doc_ids=[f"p/{i}" for i in ids], record_ids=ids, chunk_index=[0] * n, char_start=[0] * n,
        char_end=[5] * n, token_count=[7] * n, hashes=[f"{i:064x}" for i in ids], vectors=vec,
    ), vec


def test_output_schema():
    s = output_schema(384)
    assert s.names == ["doc_id", "record_id", "chunk_index", "char_start", "char_end", "token_count", "text_sha256",
                       "vector"]
    assert [str(f.type) for f in s][:7] == ["string", "int64", "int32", "int64", "int64", "int32", "string"]
    assert s.field("vector").type == pa.list_(pa.float32(), 384)
    assert pa.types.is_fixed_size_list(s.field("vector").type)
    assert s.field("vector").type.list_size == 384
    assert not any(f.nullable for f in s)


def test_output_schema_with_carried_columns_text_and_float16():
    s = output_schema(8, carried=[pa.field("title", pa.string()), pa.field("at", pa.timestamp("ms"))],
                      include_text=True, output_dtype="float16")
    assert s.names[6:] == ["text_sha256", "title", "at", "text", "vector"]
    assert s.field("at").type == pa.timestamp("ms") and s.field("at").nullable
    assert s.field("vector").type == pa.list_(pa.float16(), 8)
    with pytest.raises(ValueError, match=r"output_dtype 'bfloat16': expected one of \['float16', 'float32'\]"):
        vector_type("bfloat16")


def test_lineage_is_in_the_parquet_key_value_metadata(tmp_path):
    out = tmp_path / "p.parquet"
    kv = lineage_metadata(fingerprint="fp1-0123456789abcdef", model="org/name", model_revision="abc123",
                          lineage={"prompt": "passage: ", "truncate_dim": 128, "chunking": {"max_tokens": 64}})
    schema = output_schema(4, metadata=kv)
    t, _ = table([0, 1], 4, schema)
    with AtomicParquetWriter(str(out), schema) as w:
        w.write(t)
    assert pq.ParquetFile(out).schema_arrow.metadata[b"dagster_gpu.fingerprint"] == b"fp1-0123456789abcdef"
    assert read_lineage(str(out)) == {
        "fingerprint": "fp1-0123456789abcdef", "model": "org/name", "model_revision": "abc123",
        "lineage": {"prompt": "passage: ", "truncate_dim": 128, "chunking": {"max_tokens": 64}},
    }


def test_file_appears_only_on_exit(tmp_path):
    out = tmp_path / "nested" / "part.parquet"
    schema = output_schema(4)
    t1, v1 = table([0, 1, 2], 4, schema, seed=1)
    t2, v2 = table([5, 7], 4, schema, seed=2)
    with AtomicParquetWriter(str(out), schema) as w:
        w.write(t1)
        assert not out.exists()
        w.write(t2)
        assert not out.exists()
        tmp_files = [p.name for p in out.parent.iterdir()]
        assert len(tmp_files) == 1 and tmp_files[0].startswith(".part.parquet.tmp-")
    assert w.rows == 5
    assert [p.name for p in out.parent.iterdir()] == ["part.parquet"]
    got = pq.read_table(out)
    assert got.schema.equals(schema)
    assert got.column("record_id").to_pylist() == [0, 1, 2, 5, 7]
    vec = np.asarray(got.column("vector").combine_chunks().flatten().to_numpy(), dtype=np.float32).reshape(-1, 4)
    np.testing.assert_array_equal(vec, np.vstack([v1, v2]))


def test_empty_output_is_a_valid_parquet_file(tmp_path):
    out = tmp_path / "empty.parquet"
    with AtomicParquetWriter(str(out), output_schema(8)) as w:
        pass
    assert w.rows == 0
    got = pq.read_table(out)
    assert got.num_rows == 0 and got.schema.equals(output_schema(8))


def test_error_keeps_previous_output_and_removes_temp(tmp_path):
    out = tmp_path / "part.parquet"
    schema = output_schema(4)
    t_old, _ = table([0, 1], 4, schema, seed=3)
    with AtomicParquetWriter(str(out), schema) as w:
        w.write(t_old)
    before = out.read_bytes()

    t_new, _ = table([10, 11, 12], 4, schema, seed=4)
    with pytest.raises(RuntimeError, match="boom"):
        with AtomicParquetWriter(str(out), schema) as w:
            w.write(t_new)
            raise RuntimeError("boom")
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["part.parquet"]
    assert pq.read_table(out).column("record_id").to_pylist() == [0, 1]


def test_error_before_any_output_leaves_nothing(tmp_path):
    out = tmp_path / "part.parquet"
    with pytest.raises(KeyboardInterrupt):
        with AtomicParquetWriter(str(out), output_schema(4)):
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_schema_mismatch_fails_and_leaves_nothing(tmp_path):
    out = tmp_path / "part.parquet"
    wrong, _ = table([0], 3, output_schema(3))
    with pytest.raises((ValueError, pa.ArrowException)):
        with AtomicParquetWriter(str(out), output_schema(4)) as w:
            w.write(wrong)
    assert list(tmp_path.iterdir()) == []
