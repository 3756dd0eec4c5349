"""Shards as partitions, end to end on a real Dagster instance (in process, CPU, the packaged MiniLM): a JSON Lines
and a parquet file above ``CorpusSource.shard_bytes`` become several partitions whose outputs, concatenated, are the
unsharded materialization of the same file (ids the file's); a small file keeps its key; a changed file gets new
shards and the sensor prunes the old ones with their outputs and index rows."""

from __future__ import annotations

import json
import os
import time

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_gpu import CorpusSource, corpus_sensor, embedding_asset
from dagster_gpu.corpus.shard_plans import forget_plans
from dagster_gpu.corpus.shards import shard_key
from dagster_gpu.definitions.assets import output_uri_for
from dagster_gpu.partitions.run_ranges import range_run_tags

SHARD_BYTES = 6000
COLUMNS = ["doc_id", "record_id", "chunk_index", "text", "text_sha256"]
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex".split()


def _text(i: int) -> str:
    rng = np.random.default_rng(i)
    return f"record {i}: " + " ".join(WORDS[j] for j in rng.integers(0, len(WORDS), 3 + i % 11))


def _write_jsonl(d, n_jsonl=240, jsonl_offset=0):
    lines = []
    for i in range(n_jsonl):
        lines.append(json.dumps({"text": _text(i + jsonl_offset)}))
        if i % 29 == 0:
            lines.append("")  # a blank line: no record, but the record ids after it count on
        if i % 31 == 0:
            lines.append(json.dumps({"text": "   "}))  # an empty record: a record id, nothing embedded
    (d / "big.jsonl").write_text("\n".join(lines) + "\n")


def _write_corpus(d, n_parquet=300):
    d.mkdir(exist_ok=True)
    _write_jsonl(d)
    pq.write_table(pa.table({"text": [_text(10_000 + i) for i in range(n_parquet)]}), d / "big.parquet",
                   row_group_size=40)
    (d / "small.txt").write_text("a small file\nstays one partition\n")


def _asset(name, corpus, out):
    return embedding_asset(name=name, corpus=corpus, output_url=str(out), device="cpu", include_text=True,
                           read_batch_rows=16, batch_size=8)


def _materialize_all(instance, asset, keys):
    instance.add_dynamic_partitions(asset.partitions_def.name, keys)
    assert dg.materialize([asset], instance=instance, tags=range_run_tags(keys)).success  # one unit over the range


def _md(instance, asset_key, key):
    rec = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[key]),
                                          limit=1).records[0]
    return {k: getattr(v, "value", v) for k, v in rec.asset_materialization.metadata.items()}


@pytest.fixture()
def corpus_dir(tmp_path):
    forget_plans()
    _write_corpus(tmp_path / "corpus")
    return tmp_path


def test_a_large_file_materializes_as_shards_equal_to_the_whole_file(corpus_dir):
    root = corpus_dir
    plans = root / "plans"
    sharded = CorpusSource(url=str(root / "corpus"), shard_bytes=SHARD_BYTES, shard_plan_url=str(plans))
    whole = CorpusSource(url=str(root / "corpus"))
    files = sharded.list_files()
    by_file: dict[str, list] = {}
    for f in files:
        by_file.setdefault(f.file_key or f.key, []).append(f)
    jsonl_size = (root / "corpus" / "big.jsonl").stat().st_size
    assert len(by_file["big.jsonl"]) == -(-jsonl_size // SHARD_BYTES) >= 3  # cuts at the first line end after each multiple
    assert len(by_file["big.parquet"]) >= 2
    # a file not above shard_bytes keeps today's key and is no shard
    assert [(f.key, f.shard) for f in by_file["small.txt"]] == [("small.txt", None)]
    for name, shards in by_file.items():
        if name == "small.txt":
            continue
        assert [f.key for f in shards] == [shard_key(name, shards[0].version, f.shard) for f in shards]
        assert [f.shard.index for f in shards] == list(range(len(shards)))
    assert len(list(plans.iterdir())) == 2  # one plan per large file version, for the workers to read

    out = root / "out"
    s_asset, w_asset = _asset("sharded", sharded, out), _asset("whole", whole, out)
    with dg.instance_for_test() as instance:
        _materialize_all(instance, s_asset, [f.key for f in files])
        _materialize_all(instance, w_asset, [f.key for f in whole.list_files()])
        for name, shards in by_file.items():
            full = pq.read_table(output_uri_for(str(out), "whole", name))
            if name == "small.txt":
                assert pq.read_table(output_uri_for(str(out), "sharded", "small.txt")).select(COLUMNS).equals(full.select(COLUMNS))
                assert "dagster_gpu/shard" not in _md(instance, s_asset.key, "small.txt")
                continue
            parts = [pq.read_table(output_uri_for(str(out), "sharded", f.key)) for f in shards]
            assert all(p.num_rows > 0 for p in parts)
            joined = pa.concat_tables(parts)
            # rows, ids (the whole file's doc_id and record_id), texts and hashes: identical
            assert joined.select(COLUMNS).equals(full.select(COLUMNS))
            assert joined.column("doc_id")[0].as_py() == f"{name}/{joined.column('record_id')[0].as_py()}"
            # vectors: each shard's read batches start at its own first record, so the texts meet the model in other
            # forward batches (other padding lengths, other float32 summation orders on the CPU); unit vectors agree
            # to a few float32 ulps (measured: most vectors bit-identical, the largest difference 1.4e-7), far below
            # any retrieval difference
            a = np.stack(joined.column("vector").to_numpy(zero_copy_only=False))
            b = np.stack(full.column("vector").to_numpy(zero_copy_only=False))
            np.testing.assert_allclose(a, b, rtol=0, atol=2e-6)
            records = 0
            for f in shards:
                md = _md(instance, s_asset.key, f.key)
                assert md["dagster_gpu/shard"] == f"{f.shard.index + 1} of {len(shards)}"
                assert md["dagster_gpu/shard_file"] == name
                assert md["dagster_gpu/shard_first_record"] == f.shard.first_record == records
                assert md["dagster_gpu/shard_records"] == md["embedding/records_read"] == f.shard.records
                assert md["corpus/bytes"] == f.size_bytes and md["corpus/file_bytes"] == f.file_bytes
                unit = "row groups" if name.endswith(".parquet") else "bytes"
                assert md["dagster_gpu/shard_range"] == f"{unit} {f.shard.start}–{f.shard.end}"
                records += f.shard.records
            assert records == _md(instance, w_asset.key, name)["embedding/records_read"]


def test_a_worker_plans_only_the_files_of_its_keys_and_reads_the_stored_plan(corpus_dir):
    root = corpus_dir
    plans = root / "plans"
    corpus = CorpusSource(url=str(root / "corpus"), shard_bytes=SHARD_BYTES, shard_plan_url=str(plans))
    listed = {f.key: f for f in corpus.list_files()}
    parquet_key = next(k for k, f in listed.items() if f.file_key == "big.parquet")
    forget_plans()
    for p in plans.iterdir():
        p.unlink()
    # a unit of one parquet shard: the parquet file is planned (its footer), the large JSON Lines file is not scanned
    assert corpus.files_for_keys([parquet_key, "small.txt"]) == {parquet_key: listed[parquet_key],
                                                                 "small.txt": listed["small.txt"]}
    assert len(list(plans.iterdir())) == 1
    # a stored plan is what a worker uses: the same shards without planning again
    jsonl_key = next(k for k, f in listed.items() if f.file_key == "big.jsonl")
    assert corpus.file_for_key(jsonl_key) == listed[jsonl_key] and len(list(plans.iterdir())) == 2
    forget_plans()
    assert corpus.file_for_key(jsonl_key) == listed[jsonl_key]
    # the whole file's own key is no partition once the file is cut
    with pytest.raises(FileNotFoundError, match="big.jsonl"):
        corpus.file_for_key("big.jsonl")
    # the asset carries shard_bytes: its corpus found from the asset alone (dagster-gpu backfill without the module's
    # CorpusSource) lists the same partitions, and backend: auto sizes a shard's step by the shard's bytes
    from dagster_gpu.core.request import TAG_CORPUS_URL, TAG_SHARD_BYTES
    from dagster_gpu.definitions.partitions import corpus_of
    from dagster_gpu.executor.auto import step_size

    asset = _asset("emb", corpus, root / "out")
    assert asset.op.tags[TAG_SHARD_BYTES] == str(SHARD_BYTES)
    assert [f.key for f in corpus_of(asset).list_files()] == sorted(listed)
    assert step_size(asset.op.tags, [jsonl_key]).bytes == listed[jsonl_key].size_bytes < SHARD_BYTES + 200
    assert asset.op.tags[TAG_CORPUS_URL] == corpus.url


def test_a_changed_file_gets_new_shards_and_the_sensor_prunes_the_old(corpus_dir):
    from dagster_gpu.definitions.vector_index import load_partition, vector_index_asset
    from dagster_gpu.index.lance import VectorIndex

    root = corpus_dir
    corpus = CorpusSource(url=str(root / "corpus"), shard_bytes=SHARD_BYTES, shard_plan_url=str(root / "plans"))
    out = root / "out"
    asset = _asset("emb", corpus, out)
    index = vector_index_asset(asset, uri=str(root / "lance"))
    sensor = corpus_sensor(asset, corpus, prune=True)
    defs = dg.Definitions(assets=[asset, index], sensors=[sensor])
    ix = VectorIndex(str(root / "lance"), "emb")

    def tick(cursor):
        result = sensor(dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs))
        for req in result.dynamic_partitions_requests or []:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        return result

    with dg.instance_for_test() as instance:
        first = tick(None)
        old = [f.key for f in corpus.list_files()]
        assert instance.get_dynamic_partitions("emb_files") == old
        # the sensor puts no two shards of one file in one run (each its own unit); other keys still share runs
        j = [f.key for f in corpus.list_files() if f.file_key == "big.jsonl"]
        p = [f.key for f in corpus.list_files() if f.file_key == "big.parquet"]
        assert (len(j), len(p)) == (3, 2)
        assert [_keys(r, old) for r in first.run_requests] == [[j[0]], [j[1]], [j[2], p[0]], [p[1], "small.txt"]]
        assert dg.materialize([asset], selection=[asset.key], instance=instance, tags=range_run_tags(old)).success
        for k in old:
            load_partition(ix, k, output_uri_for(str(out), "emb", k))
        old_jsonl = [f.key for f in corpus.list_files() if f.file_key == "big.jsonl"]
        assert all(ix.partition_rows(k) > 0 for k in old_jsonl)

        # big.jsonl rewritten (other records): new source version, new shard keys; its old shards are pruned
        _write_jsonl(root / "corpus", n_jsonl=300, jsonl_offset=7)
        later = time.time() + 5
        os.utime(root / "corpus" / "big.jsonl", (later, later))
        new = [f.key for f in corpus.list_files()]
        gone = sorted(set(old) - set(new))
        added = [f.key for f in corpus.list_files() if f.file_key == "big.jsonl"]
        assert gone == sorted(old_jsonl) and not set(added) & set(old)
        changed = tick(first.cursor)
        registered = instance.get_dynamic_partitions("emb_files")
        assert sorted(registered) == sorted(new)
        assert [_keys(r, registered) for r in changed.run_requests] == [[k] for k in added]  # one unit per shard
        left = sorted(str(p) for p in (out / "emb").iterdir() if p.suffix == ".parquet")
        # the old shards' outputs deleted; the parquet shards' and the small file's kept
        assert left == sorted(output_uri_for(str(out), "emb", k) for k in old if k not in old_jsonl)
        assert [ix.partition_rows(k) for k in gone] == [0] * len(gone)
        assert ix.partition_rows("small.txt") == 2 and all(ix.partition_rows(k) > 0 for k in old if k not in gone)


def _keys(request: dg.RunRequest, order: list[str]) -> list[str]:
    if request.partition_key_range is None:
        return [request.partition_key]
    r = request.partition_key_range
    return order[order.index(r.start): order.index(r.end) + 1]


def test_files_that_cannot_be_cut_stay_one_partition_under_their_own_key(tmp_path):
    import gzip

    forget_plans()
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "packed.jsonl.gz").write_bytes(gzip.compress(b"".join(
        json.dumps({"text": f"{i} " + "x" * (i % 50)}).encode() + b"\n" for i in range(2000)), compresslevel=0))
    (d / "broken.parquet").write_bytes(b"not a parquet file " * 1000)  # its read fails naming it, as today
    pq.write_table(pa.table({"text": [_text(i) for i in range(400)]}), d / "one_group.parquet")  # one row group
    corpus = CorpusSource(url=str(d), shard_bytes=1000, shard_plan_url=str(tmp_path / "plans"))
    assert all((d / n).stat().st_size > 1000 for n in ("packed.jsonl.gz", "broken.parquet", "one_group.parquet"))
    assert [(f.key, f.shard) for f in corpus.list_files()] == [
        ("broken.parquet", None), ("one_group.parquet", None), ("packed.jsonl.gz", None)]
    assert corpus.file_for_key("one_group.parquet").shard is None  # what a worker resolves
    with pytest.raises(ValueError, match="shard_bytes must be >= 1"):
        CorpusSource(url=str(d), shard_bytes=0)


def test_dagster_gpu_registration_registers_shards_and_prunes_a_changed_files_old_ones(corpus_dir):
    """The ``dagster-gpu backfill`` path (register_corpus_files, then ``--prune``'s prune_partitions)."""
    from dagster_gpu.definitions.partitions import prune_partitions, register_corpus_files

    root = corpus_dir
    corpus = CorpusSource(url=str(root / "corpus"), shard_bytes=SHARD_BYTES, shard_plan_url=str(root / "plans"))
    asset = _asset("reg", corpus, root / "out")
    with dg.instance_for_test() as instance:
        first = register_corpus_files(instance, asset, corpus)
        assert first == [f.key for f in corpus.list_files()] and "big.jsonl" not in first and "small.txt" in first
        assert register_corpus_files(instance, asset, corpus) == []
        old_jsonl = [f.key for f in corpus.list_files() if f.file_key == "big.jsonl"]
        _write_jsonl(root / "corpus", n_jsonl=100)
        os.utime(root / "corpus" / "big.jsonl", (time.time() + 5, time.time() + 5))
        pruned = prune_partitions(instance, asset, corpus, delete_outputs=True)
        assert sorted(p.partition_key for p in pruned) == sorted(old_jsonl) and all(p.error is None for p in pruned)
        added = register_corpus_files(instance, asset, corpus)
        assert sorted(instance.get_dynamic_partitions("reg_files")) == sorted(f.key for f in corpus.list_files())
        assert added and all(k.startswith("big.jsonl-s") for k in added) and not set(added) & set(old_jsonl)
