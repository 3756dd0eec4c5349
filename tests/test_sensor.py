"""The corpus sensor on a directory and on an S3 endpoint (moto server), and the missing-partitions schedule."""

from __future__ import annotations

import json
import os
import re
import time

import dagster as dg
import pytest

from dagster_gpu import CorpusSource, TextFormat, asset_job, backfill_missing_schedule, corpus_sensor, embedding_asset
from dagster_gpu.partitions import prune_deleted_files
from dagster_gpu.ranges import range_run_tags
from dagster_gpu.sensors import partition_status, partitions_to_rerun


def _defs(corpus: CorpusSource, output_url: str):
    asset = embedding_asset(name="s_embeddings", corpus=corpus, output_url=output_url, device="cpu")
    job = asset_job(asset)
    sensor = corpus_sensor(asset, corpus, job=job)
    schedule = backfill_missing_schedule(asset, job=job)
    return asset, sensor, schedule, dg.Definitions(assets=[asset], jobs=[job], sensors=[sensor], schedules=[schedule])


def _tick(sensor, instance, defs, cursor):
    """Evaluate one tick and apply its dynamic-partition requests as the daemon does (the daemon then
    resolves the run requests against the partitions as updated by those requests)."""
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs)
    result = sensor(ctx)
    for req in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    return result


def _assert_two_ticks(corpus: CorpusSource, add_file, output_url: str):
    asset, sensor, _, defs = _defs(corpus, output_url)
    with dg.instance_for_test() as instance:
        first = _tick(sensor, instance, defs, None)
        # two new files: one ranged run over both (the asset's max_partitions_per_run is 50)
        assert [(r.partition_key, r.partition_key_range, r.run_key.split(":", 1)[1]) for r in first.run_requests] == [
            (None, dg.PartitionKeyRange("a.txt", "b.txt"), "a.txt..b.txt")]
        assert re.fullmatch(r"[0-9a-f]{12}:a\.txt\.\.b\.txt", first.run_requests[0].run_key)  # the files' versions
        assert instance.get_dynamic_partitions("s_embeddings_files") == ["a.txt", "b.txt"]
        assert json.loads(first.cursor)["files"] == 2
        idle = _tick(sensor, instance, defs, first.cursor)
        assert not idle.run_requests and not idle.dynamic_partitions_requests
        assert isinstance(idle.skip_reason, dg.SkipReason)
        add_file("c d.txt", b"new record\n")
        second = _tick(sensor, instance, defs, idle.cursor)
        new_key = [r.partition_key for r in second.run_requests]
        assert len(new_key) == 1 and new_key[0].startswith("c_d.txt-")
        assert [list(r.partition_keys) for r in second.dynamic_partitions_requests] == [new_key]
        assert sorted(instance.get_dynamic_partitions("s_embeddings_files")) == sorted(["a.txt", "b.txt", *new_key])
        assert second.run_requests[0].run_key.endswith(f":{new_key[0]}..{new_key[0]}")
        assert json.loads(second.cursor)["files"] == 3


def test_a_file_pruned_and_added_again_gets_a_new_run(tmp_path):
    """Found by a new-user run: the re-added file's run key was the one Dagster had already run, so the
    daemon skipped it and the old output (of the old content) stayed."""
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "s1.txt").write_text("one\n")
    corpus = CorpusSource(url=str(d), text_format=TextFormat(format="text"))
    asset, sensor, _, defs = _defs(corpus, str(tmp_path / "out"))
    with dg.instance_for_test() as instance:
        first = _tick(sensor, instance, defs, None)
        (d / "s1.txt").unlink()
        assert prune_deleted_files(instance, asset, corpus) == ["s1.txt"]
        (d / "s1.txt").write_text("one\ntwo\n")
        os.utime(d / "s1.txt", (time.time() + 5, time.time() + 5))
        again = _tick(sensor, instance, defs, first.cursor)
        assert [r.partition_key for r in again.run_requests] == ["s1.txt"]
        assert again.run_requests[0].run_key != first.run_requests[0].run_key
        assert again.run_requests[0].run_key.endswith(":s1.txt..s1.txt")


def test_sensor_on_directory(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "a.txt").write_text("x\n")
    (d / "b.txt").write_text("y\n")
    (d / ".partial.tmp").write_text("ignored\n")
    corpus = CorpusSource(url=str(d), text_format=TextFormat(format="text"))
    _assert_two_ticks(corpus, lambda name, data: (d / name).write_bytes(data), str(tmp_path / "out"))


@pytest.fixture(scope="module")
def s3_endpoint():
    """A real S3 protocol endpoint: moto's threaded HTTP server (as s3fs's own tests use moto_server)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def test_sensor_on_s3(s3_endpoint, tmp_path, monkeypatch):
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket="corpus")
    s3.put_object(Bucket="corpus", Key="docs/a.txt", Body=b"x\n")
    s3.put_object(Bucket="corpus", Key="docs/b.txt", Body=b"y\n")
    s3.put_object(Bucket="corpus", Key="other/z.txt", Body=b"not in the prefix\n")
    corpus = CorpusSource(
        url="s3://corpus/docs",
        text_format=TextFormat(format="text"),
        storage_options={"client_kwargs": {"endpoint_url": s3_endpoint}},
    )
    files = corpus.list_files()
    assert [(f.key, f.uri, f.size_bytes) for f in files] == [("a.txt", "s3://corpus/docs/a.txt", 2), ("b.txt", "s3://corpus/docs/b.txt", 2)]

    def add(name, data):
        s3.put_object(Bucket="corpus", Key=f"docs/{name}", Body=data)
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()

    _assert_two_ticks(corpus, add, "s3://corpus/out")


def _finish(instance, run, status):
    instance.run_storage.handle_run_event(
        run.run_id,
        dg.DagsterEvent(
            event_type_value={
                dg.DagsterRunStatus.FAILURE: "PIPELINE_FAILURE",
                dg.DagsterRunStatus.STARTED: "PIPELINE_START",
                dg.DagsterRunStatus.SUCCESS: "PIPELINE_SUCCESS",
            }[status],
            job_name=run.job_name,
        ),
    )


def test_schedule_requests_missing_and_failed_partitions_in_ranges(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    corpus = CorpusSource(url=str(d))
    asset = embedding_asset(name="s_embeddings", corpus=corpus, output_url=str(tmp_path / "out"), device="cpu",
                            max_partitions_per_run=2)
    job = asset_job(asset)
    schedule = backfill_missing_schedule(asset, job=job)
    defs = dg.Definitions(assets=[asset], jobs=[job], schedules=[schedule])
    job_def = defs.resolve_job_def("s_embeddings_job")
    keys = ["done", "bad", "ok2", "never1", "never2", "never3", "running", "after"]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("s_embeddings_files", keys)
        # a ranged run over done..ok2 that materialized two of its three partitions, then failed
        ranged = instance.create_run_for_job(job_def, tags=range_run_tags(["done", "bad", "ok2"]), asset_selection=frozenset({asset.key}))
        for pk in ("done", "ok2"):
            instance.report_runless_asset_event(dg.AssetMaterialization(asset.key, partition=pk))
        _finish(instance, ranged, dg.DagsterRunStatus.FAILURE)
        running = instance.create_run_for_job(job_def, tags={"dagster/partition": "running"}, asset_selection=frozenset({asset.key}))
        _finish(instance, running, dg.DagsterRunStatus.STARTED)
        instance.report_runless_asset_event(dg.AssetMaterialization(asset.key, partition="after"))

        materialized, failed, in_progress = partition_status(instance, asset)
        assert materialized == {"done", "ok2", "after"} and failed == {"bad"} and in_progress == {"running"}
        assert partitions_to_rerun(instance, asset) == ["bad", "never1", "never2", "never3"]
        reqs = schedule(dg.build_schedule_context(instance=instance))
        # consecutive keys share runs of at most 2; "ok2" (materialized) ends the first range
        assert [(r.partition_key, r.partition_key_range, r.run_key) for r in reqs] == [
            ("bad", None, "bad..bad"),
            (None, dg.PartitionKeyRange("never1", "never2"), "never1..never2"),
            ("never3", None, "never3..never3"),
        ]
