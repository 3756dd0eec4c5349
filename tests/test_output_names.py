"""Output file names (dagster_gpu.core.partition_keys.output_name_for) and finding an output whichever rule wrote it
(dagster_gpu.embedding.outputs.locate_output), on a real file system and a real S3 server (moto)."""

from __future__ import annotations

import itertools
import random
import string

import pytest

from dagster_gpu.definitions.assets import output_uri_for
from dagster_gpu.corpus.listing import CorpusSource
from dagster_gpu.core.partition_keys import (
    PartitionKeyError,
    legacy_output_name_for,
    output_name_for,
    partition_key_for,
    partition_key_of_output,
)
from dagster_gpu.embedding.outputs import locate_output, output_uri_candidates


@pytest.mark.parametrize(
    "key, name",
    [
        ("computers", "computers.parquet"),  # the usual key keeps the name it always had
        ("a.txt", "a.txt.parquet"),
        ("my_file.txt-bd031735", "my_file.txt-bd031735.parquet"),
        ("A.txt", "A.txt~c1.parquet"),  # bit 0: the A
        ("README", "README~c3f.parquet"),
        ("long.parquet", "long~p.parquet"),  # not long.parquet.parquet
        ("Long.Parquet", "Long~p~c21.parquet"),  # bits 0 and 5
        ("2024__01__part-0001.parquet", "2024__01__part-0001~p.parquet"),
    ],
)
def test_output_names(key, name):
    assert output_name_for(key) == name
    assert partition_key_of_output(name) == key
    assert not name.lower().endswith(".parquet.parquet")


def test_file_names_from_one_corpus_give_outputs_distinct_under_case_folding(tmp_path):
    """``A.txt`` and ``a.txt`` (and ``long.parquet`` next to ``long``): distinct keys, distinct outputs even on a
    case-insensitive file system or object store, the usual names unchanged."""
    names = ["A.txt", "a.txt", "long.parquet", "long", "LONG", "Long.Parquet", "x.parquet.parquet", "x.parquet"]
    for n in names:
        (tmp_path / n).write_text("x\n")
    keys = sorted(f.key for f in CorpusSource(str(tmp_path)).list_files())
    assert keys == sorted(names)  # all safe names: the keys are the names
    outs = [output_uri_for("/out", "emb", k) for k in keys]
    assert len({o.casefold() for o in outs}) == len(keys)
    assert "/out/emb/a.txt.parquet" in outs and "/out/emb/long.parquet" in outs
    assert "/out/emb/long.parquet.parquet" not in outs
    assert not any(o.lower().endswith(".parquet.parquet") for o in outs)


def test_output_names_are_one_to_one_under_case_folding_on_many_keys():
    rng = random.Random(7)
    alphabet = "aAbB.-_0"
    keys = {"".join(p) for p in itertools.product("aAbB", repeat=4)}  # every case of 'aabb'-like keys
    keys |= {"".join(p) + ".parquet" for p in itertools.product("aA", repeat=3)}
    keys |= {"".join(p) + ".PARQUET" for p in itertools.product("aA", repeat=3)}
    for _ in range(3000):
        k = rng.choice(string.ascii_letters) + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        k = k.rstrip(".-_") or "k"
        keys.add(k + rng.choice(["", ".parquet", ".Parquet", ".txt"]))
    names = {k: output_name_for(k) for k in keys}
    assert len({n.casefold() for n in names.values()}) == len(keys)
    assert all(partition_key_of_output(n) == k for k, n in names.items())
    # a marked name never equals another key's plain name: '~' is not a key character
    assert all(k.casefold() + ".parquet" != n.casefold() for k in keys for n in [names[k]] if "~" in n)


@pytest.mark.parametrize("bad", ["x", "x.parquet.tmp", "a b.parquet", "A.txt.parquet", "a.txt~c1.parquet", "A~c3.parquet", "~p.parquet"])
def test_names_that_are_no_output_are_refused(bad):
    with pytest.raises(PartitionKeyError):
        partition_key_of_output(bad)


def test_unsafe_keys_are_refused():
    with pytest.raises(PartitionKeyError):
        output_name_for("../etc/passwd")
    assert output_name_for(partition_key_for("../etc/passwd")).startswith("etc__passwd-")


def test_locate_output_reads_the_current_name_then_the_earlier_one(tmp_path):
    d = tmp_path / "emb"
    d.mkdir()
    assert locate_output(str(tmp_path), "emb", "A.txt") is None
    (d / "A.txt.parquet").write_bytes(b"written before the rule")  # earlier rule: <key>.parquet
    assert locate_output(str(tmp_path), "emb", "A.txt") == f"{tmp_path}/emb/A.txt.parquet"
    (d / "A.txt~c1.parquet").write_bytes(b"current")
    assert locate_output(str(tmp_path), "emb", "A.txt") == f"{tmp_path}/emb/A.txt~c1.parquet"
    assert locate_output(str(tmp_path), "emb", "a.txt") is None  # A.txt's earlier file is not a.txt's
    (d / "a.txt.parquet").write_bytes(b"lower")
    assert locate_output(str(tmp_path), "emb", "a.txt") == f"{tmp_path}/emb/a.txt.parquet"
    assert output_uri_candidates("/o/", "emb", "computers") == ["/o/emb/computers.parquet"]
    assert output_uri_candidates("/o", "emb", "long.parquet") == ["/o/emb/long~p.parquet", "/o/emb/long.parquet.parquet"]
    assert legacy_output_name_for("long.parquet") == "long.parquet.parquet"


@pytest.fixture
def moto_s3(monkeypatch):
    """moto's S3 server on a free port (a real HTTP S3 endpoint), with one bucket."""
    import boto3
    from moto.server import ThreadedMotoServer

    for k, v in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(k, v)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket="dgpu-names")
    yield {"client": client, "bucket": "dgpu-names", "storage_options": {"client_kwargs": {"endpoint_url": endpoint}}}
    server.stop()


def test_locate_output_on_s3(moto_s3):
    opts, client = moto_s3["storage_options"], moto_s3["client"]
    client.put_object(Bucket=moto_s3["bucket"], Key="out/emb/long.parquet.parquet", Body=b"earlier")
    url = f"s3://{moto_s3['bucket']}/out"
    assert locate_output(url, "emb", "long.parquet", opts) == f"{url}/emb/long.parquet.parquet"
    client.put_object(Bucket=moto_s3["bucket"], Key="out/emb/long~p.parquet", Body=b"current")
    assert locate_output(url, "emb", "long.parquet", opts) == f"{url}/emb/long~p.parquet"
    assert locate_output(url, "emb", "other", opts) is None
