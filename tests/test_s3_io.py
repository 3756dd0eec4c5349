"""Corpus reading and atomic output on an S3 endpoint that speaks the protocol (moto's threaded server)."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_gpu.corpus.listing import CorpusSource
from dagster_gpu.corpus.readers import TextFormat
from dagster_gpu.embedding.writer import AtomicParquetWriter, output_schema, output_table
from tests.s3_helpers import moto_s3_process


@pytest.fixture(scope="module", autouse=True)
def _bucket(s3):
    """This module's bucket ``dgpu-test`` on the session's moto endpoint (tests/conftest.py ``s3``)."""
    s3.bucket("dgpu-test")


def _keys(client, prefix):
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket="dgpu-test", Prefix=prefix).get("Contents", []))


def test_embedding_from_and_to_s3(s3):
    from dagster_gpu.embedding.model import load_model
    from dagster_gpu.embedding.pipeline import embed_partition

    endpoint, client = s3
    opts = {"client_kwargs": {"endpoint_url": endpoint}}
    client.put_object(Bucket="dgpu-test", Key="corpus/q.txt", Body=b"alpha beta\n%\n  \n%\ngamma delta\n%\n")
    corpus = CorpusSource(url="s3://dgpu-test/corpus", text_format=TextFormat(format="text", record_separator_line="%"), storage_options=opts)
    (f,) = corpus.list_files()
    assert (f.key, f.uri) == ("q.txt", "s3://dgpu-test/corpus/q.txt")
    model = load_model("all-MiniLM-L6-v2", device="cpu")
    r = embed_partition(f.uri, "s3://dgpu-test/out/e/q.txt.parquet", model, corpus.text_format, storage_options=opts)
    assert (r.rows, r.records, r.skipped_empty_rows) == (2, 3, 1)
    assert _keys(client, "out/") == ["out/e/q.txt.parquet"]  # no temp object left behind
    table = pq.read_table(io.BytesIO(client.get_object(Bucket="dgpu-test", Key="out/e/q.txt.parquet")["Body"].read()))
    assert table.column("record_id").to_pylist() == [0, 2]
    assert table.schema.field("vector").type == pa.list_(pa.float32(), 384)


def test_failed_s3_write_leaves_previous_object_and_no_temp(s3):
    endpoint, client = s3
    opts = {"client_kwargs": {"endpoint_url": endpoint}}
    client.put_object(Bucket="dgpu-test", Key="keep/x.parquet", Body=b"previous")
    schema = output_schema(2)
    with pytest.raises(RuntimeError, match="boom"):
        with AtomicParquetWriter("s3://dgpu-test/keep/x.parquet", schema, opts) as w:
            w.write(output_table(schema, doc_ids=["x/1"], record_ids=[1], chunk_index=[0], char_start=[0], char_end=[1],
                                 token_count=[3], hashes=["h"], vectors=np.array([[1.0, 2.0]], np.float32)))
            raise RuntimeError("boom")
    assert _keys(client, "keep/") == ["keep/x.parquet"]
    assert client.get_object(Bucket="dgpu-test", Key="keep/x.parquet")["Body"].read() == b"previous"


def test_an_output_bucket_that_does_not_exist_is_an_error_never_created(s3):
    endpoint, client = s3
    opts = {"client_kwargs": {"endpoint_url": endpoint}}
    with pytest.raises(FileNotFoundError, match="output bucket 'no-such-out' does not exist .*s3://no-such-out/e/x.parquet"):
        with AtomicParquetWriter("s3://no-such-out/e/x.parquet", output_schema(2), opts):
            pass
    assert "no-such-out" not in [b["Name"] for b in client.list_buckets()["Buckets"]]


@pytest.fixture(scope="module")
def s3_output():
    """A second S3 endpoint with its own state (moto's server in another process: the threaded servers of one
    process share one backend, so a bucket made on one appears on the other), with bucket ``dgpu-out``."""
    with moto_s3_process() as s3:
        s3.bucket("dgpu-out")
        yield s3


def test_asset_writes_and_checks_outputs_with_the_output_storage_options(s3, s3_output):
    """Corpus on one S3 endpoint, output on another (different endpoint and credentials): the asset writes the
    parquet and its five checks read it with ``output_storage_options``, never the corpus's options (with
    those, s3fs creates ``dgpu-out`` on the corpus's server, writes the output there and the checks pass on it:
    the output store stays empty)."""
    import dagster as dg
    from dagster._core.instance_for_test import instance_for_test

    from dagster_gpu import embedding_asset
    from dagster_gpu.instance.checks import CHECKS

    corpus_endpoint, corpus_client = s3
    out_endpoint, out_client = s3_output
    corpus_client.put_object(Bucket="dgpu-test", Key="split/r.txt", Body=b"one fortune\n%\ntwo fortunes\n%\n  \n%\nthree\n%\n")
    corpus = CorpusSource(
        url="s3://dgpu-test/split", text_format=TextFormat(format="text", record_separator_line="%"),
        storage_options={"key": "corpus-reader", "secret": "corpus-secret", "client_kwargs": {"endpoint_url": corpus_endpoint}},
    )
    out_opts = {"key": "output-writer", "secret": "output-secret", "client_kwargs": {"endpoint_url": out_endpoint}}
    asset = embedding_asset(name="split_emb", corpus=corpus, output_url="s3://dgpu-out/vectors", device="cpu",
                            output_storage_options=out_opts)
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("split_emb_files", ["r.txt"])
        r = dg.materialize([asset], instance=instance, partition_key="r.txt", raise_on_error=False)
        assert r.success, [e.message for e in r.all_events if e.is_failure]
        md = r.asset_materializations_for_node("split_emb")[0].metadata
        assert md["embedding/output_uri"].value == "s3://dgpu-out/vectors/split_emb/r.txt.parquet"
        assert md["embedding/rows"].value == 3
        evs = [e.event_specific_data for e in r.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
        assert sorted((e.check_name, e.passed) for e in evs) == sorted((n, True) for n in CHECKS)
    assert [o["Key"] for o in out_client.list_objects_v2(Bucket="dgpu-out").get("Contents", [])] == [
        "vectors/split_emb/r.txt.parquet"]
    table = pq.read_table(io.BytesIO(out_client.get_object(Bucket="dgpu-out", Key="vectors/split_emb/r.txt.parquet")["Body"].read()))
    assert table.column("record_id").to_pylist() == [0, 1, 3]
    assert "dgpu-out" not in [b["Name"] for b in corpus_client.list_buckets()["Buckets"]]
