"""The index on an S3 endpoint that speaks the protocol (moto's threaded server, as tests/test_s3_io.py):
LanceDB's object store commits each partition's replacement, reads back the rows and searches."""

from __future__ import annotations

import pytest

from dagster_gpu.index.lance import VectorIndex
from dagster_gpu.index.rows import index_rows, partition_filter
from tests.index_helpers import output_rows


@pytest.fixture(scope="module")
def s3_endpoint(s3):
    """The session's moto endpoint (tests/conftest.py ``s3``) with this module's bucket ``dgpu-index``."""
    s3.bucket("dgpu-index")
    return s3.endpoint


def test_index_on_s3_replaces_partitions_in_one_commit(s3_endpoint):
    # LanceDB object-store options (lancedb.connect(storage_options=...)), not fsspec's
    opts = {"aws_endpoint": s3_endpoint, "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
            "region": "us-east-1", "allow_http": "true"}
    ix = VectorIndex("s3://dgpu-index/lance", "emb", opts)
    for pk, n in (("a.txt", 5), ("b.txt", 3)):
        ix.replace_partition(pk, index_rows(output_rows(n, 8, pk=pk, fingerprint="fp1-a")[0], pk, "fp1-a"))
    t, _ = output_rows(2, 8, pk="a.txt", fingerprint="fp1-b", seed=4)
    r = ix.replace_partition("a.txt", index_rows(t, "a.txt", "fp1-b"))
    assert (r.updated, r.inserted, r.deleted) == (2, 0, 3)
    assert [ix.partition_rows(k) for k in ("a.txt", "b.txt")] == [2, 3]
    hit = ix.search(t.column("vector")[1].as_py(), 1, exact=True)
    assert hit.column("doc_id").to_pylist() == ["a.txt/1"] and hit.column("_distance")[0].as_py() < 1e-5
    old = VectorIndex("s3://dgpu-index/lance", "emb", opts).open()
    old.checkout(r.version - 1)
    assert old.count_rows(partition_filter("a.txt")) == 5
