"""File groups as partitions, end to end on a real Dagster instance (in process, CPU, the packaged MiniLM): 30 small
JSON Lines files in 4 buckets; every file's rows under its own ids; one file changed and one deleted: the affected
buckets are stale, their re-materialization embeds only the changed file's new texts (the rest reused), the
deleted file's rows leave the output and the index, and the metadata says which files changed; a bad file fails
its bucket, naming the file, and leaves the bucket's earlier output and the other buckets alone."""

from __future__ import annotations

import json
import os

import dagster as dg
import pyarrow.parquet as pq
import pytest

from dagster_gpu import CorpusSource, corpus_sensor, embedding_asset
from dagster_gpu.definitions.assets import output_uri_for
from dagster_gpu.embedding.writer import recorded_files
from dagster_gpu.partitions.run_ranges import range_run_tags

N_FILES, BUCKETS = 30, 4


def _texts(i: int) -> list[str]:
    return [f"document {i} paragraph {j}: notes on topic {i * 7 + j}" for j in range(1 + i % 3)]


def _write(d, i: int, texts: list[str]) -> None:
    (d / f"doc-{i:03d}.json").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def _asset(corpus, out):
    return embedding_asset(name="emb", corpus=corpus, output_url=str(out), device="cpu", include_text=True,
                           read_batch_rows=8, batch_size=8)


def _md(instance, asset_key, key):
    rec = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[key]),
                                          limit=1).records[0]
    return {k: getattr(v, "value", getattr(v, "text", v)) for k, v in rec.asset_materialization.metadata.items()}


def _run(instance, asset, keys, ok=True):
    """One unit over ``keys`` (consecutive in the partitions definition) or over one key."""
    how = {"partition_key": keys[0]} if len(keys) == 1 else {"tags": range_run_tags(keys)}
    result = dg.materialize([asset], instance=instance, raise_on_error=False, **how)
    assert result.success is ok
    return result


def _keys(request: dg.RunRequest, order: list[str]) -> list[str]:
    if request.partition_key_range is None:
        return [request.partition_key]
    r = request.partition_key_range
    return order[order.index(r.start): order.index(r.end) + 1]


@pytest.fixture()
def corpus_dir(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(N_FILES):
        _write(d, i, _texts(i))
    return tmp_path


def test_a_grouped_corpus_materializes_and_re_embeds_only_what_changed(corpus_dir):
    from dagster_gpu.definitions.vector_index import load_partition
    from dagster_gpu.index.lance import VectorIndex

    root = corpus_dir
    corpus = CorpusSource(url=str(root / "corpus"), group_buckets=BUCKETS)
    groups = corpus.list_files()
    assert len(groups) == BUCKETS and sum(len(g.members) for g in groups) == N_FILES
    out = root / "out"
    asset = _asset(corpus, out)
    ix = VectorIndex(str(root / "lance"), "emb")
    keys = [g.key for g in groups]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("emb_files", keys)
        _run(instance, asset, keys)  # one unit over the 4 buckets
        for g in groups:
            t = pq.read_table(output_uri_for(str(out), "emb", g.key))
            expected = [(f"{m.key}/{j}", j, text) for m in g.members
                        for j, text in enumerate(_texts(int(m.key[4:7])))]
            # every file's rows, in file order, under the file's own ids (doc_id and record_id)
            assert list(zip(t.column("doc_id").to_pylist(), t.column("record_id").to_pylist(),
                            t.column("text").to_pylist())) == expected
            md = _md(instance, asset.key, g.key)
            assert md["dagster_gpu/group"] == f"{g.group.index + 1} of {BUCKETS}"
            assert md["corpus/files"] == len(g.members) and md["corpus/files_changed"] == len(g.members)
            assert md["corpus/files_changed_list"] == f"first materialization: {len(g.members)} file(s)"
            assert md["embedding/rows"] == len(expected) and md["embedding/reused_rows"] == 0
            assert md["corpus/source_version"] == g.version and md["corpus/bytes"] == g.size_bytes
            assert recorded_files(output_uri_for(str(out), "emb", g.key)) == g.member_versions
            assert load_partition(ix, g.key, output_uri_for(str(out), "emb", g.key))["index_rows"] == len(expected)
        checks = instance.event_log_storage.get_asset_check_execution_history  # the five checks passed per bucket
        from dagster._core.definitions.asset_checks.asset_check_spec import AssetCheckKey
        from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

        for name in ("rows_match_records", "hash_per_record_id"):
            recs = checks(AssetCheckKey(asset.key, name), limit=10)
            assert len(recs) == BUCKETS and {r.status for r in recs} == {AssetCheckExecutionRecordStatus.SUCCEEDED}

        # one file changed (one paragraph rewritten, one added), another deleted
        home = {m.key: g for g in groups for m in g.members}
        changed, deleted = "doc-004.json", "doc-011.json"
        new_texts = [_texts(4)[0], "document 4, a rewritten paragraph", "document 4, a new paragraph"]
        _write(root / "corpus", 4, new_texts)
        later = os.path.getmtime(root / "corpus" / changed) + 5
        os.utime(root / "corpus" / changed, (later, later))
        (root / "corpus" / deleted).unlink()
        after = {g.key: g for g in corpus.list_files()}
        stale = sorted(k for k, g in after.items() if g.version != {x.key: x for x in groups}[k].version)
        assert stale == sorted({home[changed].key, home[deleted].key})
        # the corpus sensor requests exactly those buckets
        sensor = corpus_sensor(asset, corpus, bridge=False)
        tick = sensor(dg.build_sensor_context(instance=instance, definitions=dg.Definitions(assets=[asset], sensors=[sensor])))
        assert sorted(k for r in tick.run_requests for k in _keys(r, keys)) == stale
        for k in stale:
            _run(instance, asset, [k])
        new_texts_embedded = len([t for t in new_texts if t not in _texts(4)])  # 2
        for k in stale:
            g = after[k]
            t = pq.read_table(output_uri_for(str(out), "emb", k))
            md = _md(instance, asset.key, k)
            doc_ids = t.column("doc_id").to_pylist()
            assert not [x for x in doc_ids if x.startswith(deleted)]  # the deleted file's rows are gone
            assert md["embedding/rows"] == t.num_rows == sum(len(_texts(int(m.key[4:7])) if m.key != changed
                                                                 else new_texts) for m in g.members)
            embedded = new_texts_embedded if k == home[changed].key else 0
            assert md["embedding/reused_rows"] == t.num_rows - embedded  # a one-file change costs its new texts
            expected_list = "; ".join(
                ([f"changed: {changed}"] if k == home[changed].key else [])
                + ([f"removed: {deleted}"] if k == home[deleted].key else []))
            assert md["corpus/files_changed_list"] == expected_list
            assert md["corpus/files_changed"] == expected_list.count(".json")
            assert md["corpus/files_removed"] == (1 if k == home[deleted].key else 0)
            assert md["corpus/files"] == len(g.members) and md["corpus/source_version"] == g.version
            if k == home[changed].key:
                assert [x for x in t.column("text").to_pylist() if x.startswith("document 4")] == new_texts
            facts = load_partition(ix, k, output_uri_for(str(out), "emb", k))
            assert facts["index_rows"] == t.num_rows
        gone_rows = ix.open().count_rows(f"doc_id LIKE '{deleted}/%'")
        assert gone_rows == 0 and ix.open().count_rows(f"doc_id LIKE '{changed}/%'") == len(new_texts)


def test_a_bad_file_fails_its_bucket_naming_the_file_and_keeps_the_rest(corpus_dir):
    root = corpus_dir
    corpus = CorpusSource(url=str(root / "corpus"), group_buckets=BUCKETS)
    groups = corpus.list_files()
    out = root / "out"
    asset = _asset(corpus, out)
    keys = [g.key for g in groups]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("emb_files", keys)
        _run(instance, asset, keys)
        bad_group = groups[1]
        bad = bad_group.members[0].key
        first = pq.read_table(output_uri_for(str(out), "emb", bad_group.key))
        (root / "corpus" / bad).write_text('{"text": "fine"}\n{"text": broken\n')
        result = _run(instance, asset, keys, ok=False)
        failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
        message = failure.step_failure_data.error.message
        assert f"partition '{bad_group.key}'" in message and f"{bad}: line 2" in message
        assert "1 of 4 partition(s) failed (3 materialized)" in message
        # the failed bucket's earlier output is kept as it was; the others were materialized again
        assert pq.read_table(output_uri_for(str(out), "emb", bad_group.key)).equals(first)
        for g in groups:
            n = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=asset.key, asset_partitions=[g.key]),
                                                limit=5).records
            assert len(n) == (1 if g.key == bad_group.key else 2)


def test_a_stopped_bucket_continues_after_its_checkpoint_parts_into_the_clean_output(tmp_path):
    """The batches refilled across files are cut the same way on every read: a bucket stopped after 3 read batches
    continues after its committed parts, and its output is the uninterrupted run's file, byte for byte."""
    import threading

    from dagster_gpu.corpus.group_reads import GroupPrefetcher
    from dagster_gpu.embedding.pipeline import CheckpointPolicy, Preempted, embed_partition
    from dagster_gpu.embedding.spec import EmbeddingSpec
    from tests.checkpoint_child import LINEAGE, load_test_model, write_corpus

    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(12):
        write_corpus(d / f"part-{i:02d}.txt", 5 + i, seed=i, max_words=20)
    corpus = CorpusSource(url=str(d), group_buckets=1)
    (group,) = corpus.list_files()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_GPU_CPU_SHARE", "0")
        model = load_test_model()

    def embed(out, stop=None, on_batch=None, checkpoint=True):
        reader = GroupPrefetcher(group, corpus.text_format, read_batch_rows=8)
        return embed_partition(reader, str(out), model, spec=EmbeddingSpec(batch_size=8), partition_key=group.key, lineage=dict(LINEAGE),
                               checkpoint=CheckpointPolicy(group.version, 1) if checkpoint else None, stop=stop,
                               on_batch=on_batch)

    clean = embed(tmp_path / "clean.parquet", checkpoint=False)
    stop = threading.Event()
    out = tmp_path / "out.parquet"
    with pytest.raises(Preempted) as info:
        embed(out, stop=stop, on_batch=lambda done: stop.set() if done >= 24 else None)
    assert (info.value.records, info.value.parts_committed) == (24, 3) and not out.exists()
    again = embed(out)
    assert again.resumed_rows == 24 and (again.rows, again.records) == (clean.rows, clean.records)
    assert out.read_bytes() == (tmp_path / "clean.parquet").read_bytes()
    doc_ids = pq.read_table(out).column("doc_id").to_pylist()
    assert doc_ids[0] == "part-00.txt/0" and len({x.split("/")[0] for x in doc_ids}) == 12


def test_a_bucket_whose_files_are_all_gone_is_pruned_with_its_output_and_index_rows(corpus_dir):
    from dagster_gpu.definitions.vector_index import load_partition, vector_index_asset
    from dagster_gpu.index.lance import VectorIndex

    root = corpus_dir
    corpus = CorpusSource(url=str(root / "corpus"), group_buckets=BUCKETS)
    groups = corpus.list_files()
    out = root / "out"
    asset = _asset(corpus, out)
    index = vector_index_asset(asset, uri=str(root / "lance"))
    sensor = corpus_sensor(asset, corpus, prune=True)
    defs = dg.Definitions(assets=[asset, index], sensors=[sensor])
    ix = VectorIndex(str(root / "lance"), "emb")
    keys = [g.key for g in groups]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("emb_files", keys)
        _run(instance, asset, keys)
        for k in keys:
            load_partition(ix, k, output_uri_for(str(out), "emb", k))
        emptied = groups[2]
        assert ix.partition_rows(emptied.key) > 0
        for m in emptied.members:
            (root / "corpus" / m.key).unlink()
        assert [g.key for g in corpus.list_files()] == [k for k in keys if k != emptied.key]
        tick = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
        assert not tick.run_requests  # nothing else changed
        assert instance.get_dynamic_partitions("emb_files") == [k for k in keys if k != emptied.key]
        assert not os.path.exists(output_uri_for(str(out), "emb", emptied.key))
        assert ix.partition_rows(emptied.key) == 0
        assert all(ix.partition_rows(k) > 0 for k in keys if k != emptied.key)
