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


def test_an_output_bucket_that_does_not_exist_is_an_error_never_created(s3):
    endpoint, client = s3
    opts = {"client_kwargs": {"endpoint_url": endpoint}}
    with pytest.raises(FileNotFoundError, match="output bucket 'no-such-out' does not exist .*s3://no-such-out/e/x.parquet"):
        with AtomicParquetWriter("s3://no-such-out/e/x.parquet", output_schema(2), opts):
            pass
    assert "no-such-out" not in [b["Name"] for b in client.list_buckets()["Buckets"]]


@pytest.fixture(scope="module")
def s3_output(s3):
    """A second S3 endpoint with its own state: moto's server in another process (the threaded servers of one
    process share one backend, so a bucket made on one appears on the other), with bucket ``dgpu-out``."""
    import socket
    import subprocess
    import sys
    import time

    import boto3

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=endpoint)
    deadline = time.monotonic() + 60
    while True:
        try:
            client.create_bucket(Bucket="dgpu-out")
            break
        except Exception:  # noqa: BLE001 - not listening yet
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto server on port {port} did not start (exit {proc.poll()})")
            time.sleep(0.2)
    yield endpoint, client
    proc.terminate()
    proc.wait(timeout=30)


def test_asset_writes_and_checks_outputs_with_the_output_storage_options(s3, s3_output):
    """Corpus on one S3 endpoint, output on another (different endpoint and credentials): the asset writes the
    parquet and its five checks read it with ``output_storage_options``, never the corpus's options (with
    those, s3fs creates ``dgpu-out`` on the corpus's server, writes the output there and the checks pass on it:
    the output store stays empty)."""
    import dagster as dg
    from dagster._core.instance_for_test import instance_for_test

    from dagster_gpu import embedding_asset
    from dagster_gpu.checks import CHECKS

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
