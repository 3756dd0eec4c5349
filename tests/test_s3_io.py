"""Corpus reading and atomic output on an S3 endpoint that speaks the protocol (moto's threaded server)."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_gpu.corpus.listing import CorpusSource
from dagster_gpu.corpus.readers import TextFormat
from dagster_gpu.embedding.writer import AtomicParquetWriter, output_schema


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    import os

    import boto3
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket="dgpu-test")
    yield endpoint, client
    server.stop()


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
            w.write(pa.table({"record_id": [1], "text_sha256": ["h"], "vector": pa.array([[1.0, 2.0]], pa.list_(pa.float32(), 2))}, schema=schema))
            raise RuntimeError("boom")
    assert _keys(client, "keep/") == ["keep/x.parquet"]
    assert client.get_object(Bucket="dgpu-test", Key="keep/x.parquet")["Body"].read() == b"previous"
