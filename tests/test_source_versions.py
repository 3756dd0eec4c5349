"""Source versions: from the corpus listing (local directory; S3 ETag and VersionId on moto's server) onto each
materialization, into Dagster's staleness machinery (dagster 1.13's CachingStaleStatusResolver, what the UI's
stale status runs on), and back to the corpus sensor, which requests changed files and prunes deleted ones
with their outputs and index rows. Real instance, real embedding (CPU, the packaged MiniLM), real LanceDB."""

from __future__ import annotations

import os
import time

import dagster as dg
import pyarrow.parquet as pq
import pytest
from dagster._core.definitions.data_version import StaleStatus
from dagster._utils.test.data_versions import get_stale_status_resolver

from dagster_gpu import CorpusSource, TextFormat, embedding_asset
from dagster_gpu.corpus.listing import CorpusNotFound, source_version
from dagster_gpu.definitions.partitions import partition_staleness
from dagster_gpu.partitions.run_ranges import range_run_tags
from dagster_gpu.definitions.sensors import corpus_sensor
from dagster_gpu.partitions.source_versions import (
    SOURCE_VERSION_KEY, corpus_asset_key, corpus_source, corpus_versions, recorded_versions,
)


def test_source_version_of_listing_entries():
    # s3fs's entries (recorded from moto's ListObjectsV2 / ListObjectVersions answers, s3fs 2025)
    assert source_version({"ETag": '"401b30e3b8b5d629635a5c613cdb7919"', "size": 2}) == "etag:401b30e3b8b5d629635a5c613cdb7919"
    assert source_version({"ETag": '"401b"', "VersionId": "d34d24ad-b172", "size": 2}) == "versionid:d34d24ad-b172"
    assert source_version({"ETag": '"ab-3"', "VersionId": "null"}) == "etag:ab-3"  # unversioned object of a versioned bucket
    assert source_version({"size": 7, "mtime": 1796158166.3018985}) == "size:7,mtime:1796158166.3018985"
    assert source_version({}) == "size:0,mtime:0.0"


def test_local_versions_change_with_the_file(tmp_path):
    (tmp_path / "a.txt").write_text("one\n")
    corpus = CorpusSource(url=str(tmp_path))
    (f,) = corpus.list_files()
    assert f.version == f"size:4,mtime:{os.stat(tmp_path / 'a.txt').st_mtime!r}"
    assert corpus.current_version(f) == f.version == corpus.file_for_key("a.txt").version
    (tmp_path / "a.txt").write_text("two\n")  # same size
    os.utime(tmp_path / "a.txt", (time.time() + 3, time.time() + 3))
    assert corpus.current_version(f) != f.version == f.version
    (tmp_path / "a.txt").unlink()
    with pytest.raises(CorpusNotFound, match=r"partition 'a.txt': file '.*a.txt' is gone"):
        corpus.current_version(f)


def test_s3_etag_and_version_id(s3):
    import s3fs

    endpoint, client = s3
    client.create_bucket(Bucket="plain")
    client.put_object(Bucket="plain", Key="c/a.txt", Body=b"alpha\n")
    corpus = CorpusSource(url="s3://plain/c", storage_options={"client_kwargs": {"endpoint_url": endpoint}})
    (f,) = corpus.list_files()
    etag = client.head_object(Bucket="plain", Key="c/a.txt")["ETag"].strip('"')
    assert f.version == f"etag:{etag}" and corpus.current_version(f) == f.version
    client.put_object(Bucket="plain", Key="c/a.txt", Body=b"alpha\n")  # the same bytes again: same ETag (MD5)
    s3fs.S3FileSystem.clear_instance_cache()
    assert corpus.list_files()[0].version == f.version
    client.put_object(Bucket="plain", Key="c/a.txt", Body=b"gamma\n")
    # read right before the read: not the listing cache of the same filesystem instance, the object now
    gamma = client.head_object(Bucket="plain", Key="c/a.txt")["ETag"].strip('"')
    assert corpus.current_version(f) == f"etag:{gamma}" != f.version
    s3fs.S3FileSystem.clear_instance_cache()
    assert corpus.list_files()[0].version == f"etag:{gamma}"

    client.create_bucket(Bucket="versioned")
    client.put_bucket_versioning(Bucket="versioned", VersioningConfiguration={"Status": "Enabled"})
    put = client.put_object(Bucket="versioned", Key="c/a.txt", Body=b"alpha\n")
    vcorpus = CorpusSource(url="s3://versioned/c",
                           storage_options={"client_kwargs": {"endpoint_url": endpoint}, "version_aware": True})
    (v,) = vcorpus.list_files()
    assert v.version == f"versionid:{put['VersionId']}" and vcorpus.current_version(v) == v.version
    again = client.put_object(Bucket="versioned", Key="c/a.txt", Body=b"alpha\n")  # a new version, same bytes
    s3fs.S3FileSystem.clear_instance_cache()
    assert vcorpus.list_files()[0].version == f"versionid:{again['VersionId']}" != v.version


def _tick(sensor, instance, defs, cursor=None):
    """One tick, its dynamic-partition requests and asset events applied as the daemon applies them."""
    result = sensor(dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs))
    for req in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    for ev in result.asset_events or []:
        instance.report_runless_asset_event(ev)
    return result


def _materialization(instance, key, pk):
    return instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, asset_partitions=[pk]), limit=1).records[0]


def test_versions_reach_the_materialization_dagster_staleness_and_the_sensor(tmp_path, monkeypatch):
    from dagster_gpu.definitions.vector_index import load_partition, vector_index_asset
    from dagster_gpu.index.lance import VectorIndex
    from dagster_gpu.worker import unit

    d = tmp_path / "corpus"
    d.mkdir()
    (d / "a.txt").write_text("first record\nsecond record\n")
    (d / "b.txt").write_text("another file\n")
    corpus = CorpusSource(url=str(d), text_format=TextFormat(format="text"))
    out = tmp_path / "out"
    base = embedding_asset(name="v_emb", corpus=corpus, output_url=str(out), device="cpu")
    spec, asset = corpus_source(base, corpus)
    assert spec.key == corpus_asset_key(asset.key) == dg.AssetKey("v_emb_corpus")
    assert asset.asset_deps[asset.key] == {spec.key} and spec.partitions_def is asset.partitions_def
    index = vector_index_asset(asset, uri=str(tmp_path / "lance"))
    sensor = corpus_sensor(asset, corpus, prune=True)
    defs = dg.Definitions(assets=[spec, asset, index], sensors=[sensor])
    code_version = asset.code_versions_by_key[asset.key]
    graph = defs.resolve_asset_graph().assets_defs  # the corpus spec as Dagster resolves it

    with dg.instance_for_test() as instance:
        first = _tick(sensor, instance, defs)
        assert [r.partition_key_range for r in first.run_requests] == [dg.PartitionKeyRange("a.txt", "b.txt")]
        listed = {f.key: f.version for f in corpus.list_files()}
        assert corpus_versions(instance, spec.key) == listed  # one corpus materialization per file: its data version
        assert [(type(e).__name__, e.partition) for e in first.asset_events] == [
            ("AssetObservation", "a.txt"), ("AssetMaterialization", "a.txt"), ("AssetObservation", "b.txt"), ("AssetMaterialization", "b.txt")]
        assert {e.partition: e.metadata["corpus/size_bytes"].value for e in first.asset_events} == {"a.txt": 27, "b.txt": 13}
        # one ranged run (one unit, one model load) over both, as the sensor asked
        assert dg.materialize([spec, asset], selection=[asset.key], instance=instance,
                              tags=range_run_tags(["a.txt", "b.txt"])).success
        rec = _materialization(instance, asset.key, "a.txt")
        mat = rec.asset_materialization
        assert mat.metadata[SOURCE_VERSION_KEY].value == listed["a.txt"]
        pointer = instance.get_latest_storage_id_by_partition(spec.key, dg.DagsterEventType.ASSET_OBSERVATION, {"a.txt"})["a.txt"]
        assert mat.tags["dagster/code_version"] == code_version
        assert mat.tags["dagster/input_data_version/v_emb_corpus"] == listed["a.txt"]
        assert mat.tags["dagster/input_event_pointer/v_emb_corpus"] == str(pointer)
        assert {k: (r.source_version, r.code_version) for k, r in recorded_versions(instance, asset.key).items()} == {
            k: (v, code_version) for k, v in listed.items()}

        def status(pk):
            return get_stale_status_resolver(instance, graph).get_status(asset.key, pk)

        assert status("a.txt") == status("b.txt") == StaleStatus.FRESH
        idle = _tick(sensor, instance, defs, first.cursor)
        assert not idle.run_requests and not idle.asset_events  # versions unchanged: nothing recorded again

        # a.txt rewritten: the sensor records its new version and requests it; Dagster shows it stale
        (d / "a.txt").write_text("first record, edited\nsecond record\n")
        os.utime(d / "a.txt", (time.time() + 5, time.time() + 5))
        changed = _tick(sensor, instance, defs, idle.cursor)
        assert [r.partition_key for r in changed.run_requests] == ["a.txt"]
        assert [e.partition for e in changed.asset_events] == ["a.txt", "a.txt"]
        causes = get_stale_status_resolver(instance, graph).get_stale_causes(asset.key, "a.txt")
        assert status("a.txt") == StaleStatus.STALE and status("b.txt") == StaleStatus.FRESH
        assert [c.reason for c in causes] == ["has a new dependency data version"]
        found = partition_staleness(instance, asset, corpus)
        new_a = corpus.file_for_key("a.txt").version
        assert [(s.partition_key, s.reasons) for s in found.stale] == [("a.txt", (f"source changed: {listed['a.txt']} → {new_a}",))]
        # the same version is requested once: the run key names it
        assert _tick(sensor, instance, defs, changed.cursor).run_requests[0].run_key == changed.run_requests[0].run_key

        # a.txt rewritten again while its run reads it (right after the unit read its version): the run records
        # the version from before the read, so the next tick finds the file changed and requests it again
        real_prefetcher = unit._prefetcher

        def rewrite_then_read(spec_, source):
            (d / "a.txt").write_text("rewritten during the read\n")
            os.utime(d / "a.txt", (time.time() + 10, time.time() + 10))
            return real_prefetcher(spec_, source)

        monkeypatch.setattr(unit, "_prefetcher", rewrite_then_read)
        assert dg.materialize([spec, asset], selection=[asset.key], instance=instance, partition_key="a.txt").success
        monkeypatch.setattr(unit, "_prefetcher", real_prefetcher)
        assert _materialization(instance, asset.key, "a.txt").asset_materialization.metadata[SOURCE_VERSION_KEY].value == new_a
        assert pq.read_table(out / "v_emb" / "a.txt.parquet").num_rows == 1  # it did read the rewritten file
        again = _tick(sensor, instance, defs, changed.cursor)
        assert [r.partition_key for r in again.run_requests] == ["a.txt"]
        assert again.run_requests[0].run_key != changed.run_requests[0].run_key

        # b.txt deleted: the sensor (prune=True) deletes its partition, output and index rows, nothing else
        ix = VectorIndex(str(tmp_path / "lance"), "v_emb")
        for pk in ("a.txt", "b.txt"):
            load_partition(ix, pk, str(out / "v_emb" / f"{pk}.parquet"))
        assert (ix.partition_rows("a.txt"), ix.partition_rows("b.txt")) == (1, 1)
        (d / "b.txt").unlink()
        _tick(sensor, instance, defs, again.cursor)
        assert instance.get_dynamic_partitions("v_emb_files") == ["a.txt"]
        assert sorted(p.name for p in (out / "v_emb").iterdir()) == ["a.txt.parquet"]
        assert (ix.partition_rows("a.txt"), ix.partition_rows("b.txt")) == (1, 0)


_GQL_DEFS = '''
import dagster as dg
from dagster_gpu import CorpusSource, embedding_asset
from dagster_gpu.partitions.source_versions import corpus_source
corpus = CorpusSource(url={corpus!r})
spec, asset = corpus_source(embedding_asset(name="g_emb", corpus=corpus, output_url={out!r}, device="cpu"), corpus)
defs = dg.Definitions(assets=[spec, asset])
'''


def test_the_ui_graphql_shows_the_partition_whose_file_changed_as_stale(tmp_path):
    """What the UI reads (dagster-graphql 1.13 AssetNode.staleStatusByPartition / staleCausesByPartition, from a
    code server loading the definitions), on materializations tagged as the unit tags them."""
    from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql

    from dagster_gpu.corpus.listing import CorpusFile
    from dagster_gpu.partitions.source_versions import corpus_updates, input_tags

    (tmp_path / "corpus").mkdir()
    defs_file = tmp_path / "gql_defs.py"
    defs_file.write_text(_GQL_DEFS.format(corpus=str(tmp_path / "corpus"), out=str(tmp_path / "out")))
    corpus = CorpusSource(url=str(tmp_path / "corpus"))
    spec, asset = corpus_source(embedding_asset(name="g_emb", corpus=corpus, output_url=str(tmp_path / "out"), device="cpu"), corpus)
    cv = asset.code_versions_by_key[asset.key]
    query = """{ assetNodes { assetKey { path } staleStatusByPartition(partitions: ["a", "b"])
                 staleCausesByPartition(partitions: ["a", "b"]) { reason category key { path } }
                 partitionStats { numMaterialized numPartitions numFailed } } }"""
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("g_emb_files", ["a", "b"])
        for pk in ("a", "b"):
            for ev in corpus_updates(spec.key, [CorpusFile(pk, f"/c/{pk}", pk, 1, 1.0, "etag:1")], {}):
                instance.report_runless_asset_event(ev)
            instance.report_runless_asset_event(dg.AssetMaterialization(asset.key, partition=pk, tags={
                "dagster/code_version": cv, "dagster/data_version": f"dv-{pk}", **input_tags(instance, asset, asset.key, pk, "etag:1")}))
        for ev in corpus_updates(spec.key, [CorpusFile("a", "/c/a", "a", 2, 2.0, "etag:2")], {"a": "etag:1", "b": "etag:1"}):
            instance.report_runless_asset_event(ev)
        with define_out_of_process_context(str(defs_file), "defs", instance) as ctx:
            result = execute_dagster_graphql(ctx, query)
    assert result.errors is None
    nodes = {"/".join(n["assetKey"]["path"]): n for n in result.data["assetNodes"]}
    assert nodes["g_emb"]["staleStatusByPartition"] == ["STALE", "FRESH"]
    # the root cause: the corpus partition's new data version
    assert nodes["g_emb"]["staleCausesByPartition"] == [
        [{"reason": "has a new data version", "category": "DATA", "key": {"path": ["g_emb_corpus"]}}], []]
    assert nodes["g_emb_corpus"]["staleStatusByPartition"] == ["FRESH", "FRESH"]
    # the UI's "% filled" and "Missing (n)" of the corpus node count materializations only: every file recorded
    assert nodes["g_emb_corpus"]["partitionStats"] == {"numMaterialized": 2, "numPartitions": 2, "numFailed": 0}



def test_an_instance_with_corpus_observations_only_gets_each_file_recorded_once_more(tmp_path):
    """Earlier versions recorded the corpus as observations only: the corpus versions read materializations, so
    the next tick records each file once more (both events); the provenance pointer stays an observation's, and
    the same data version again turns nothing stale."""
    from dagster_gpu.corpus.listing import CorpusFile
    from dagster_gpu.partitions.source_versions import corpus_updates, input_tags

    (tmp_path / "corpus").mkdir()
    corpus = CorpusSource(url=str(tmp_path / "corpus"))
    spec, asset = corpus_source(embedding_asset(name="m_emb", corpus=corpus, output_url=str(tmp_path / "out"), device="cpu"), corpus)
    graph = dg.Definitions(assets=[spec, asset]).resolve_asset_graph().assets_defs
    file_a = CorpusFile("a", "/c/a", "a", 1, 1.0, "etag:1")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("m_emb_files", ["a"])
        instance.report_runless_asset_event(dg.AssetObservation(spec.key, partition="a", tags={"dagster/data_version": "etag:1"}))
        instance.report_runless_asset_event(dg.AssetMaterialization(asset.key, partition="a", tags={
            "dagster/code_version": asset.code_versions_by_key[asset.key], "dagster/data_version": "dv-a",
            **input_tags(instance, asset, asset.key, "a", "etag:1")}))
        assert corpus_versions(instance, spec.key) == {}
        for ev in corpus_updates(spec.key, [file_a], corpus_versions(instance, spec.key)):
            instance.report_runless_asset_event(ev)
        assert corpus_versions(instance, spec.key) == {"a": "etag:1"}
        assert corpus_updates(spec.key, [file_a], corpus_versions(instance, spec.key)) == []
        assert get_stale_status_resolver(instance, graph).get_status(asset.key, "a") == StaleStatus.FRESH
