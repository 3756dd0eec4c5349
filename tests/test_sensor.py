"""The corpus sensor on a directory and on an S3 endpoint (moto server), and the missing-partitions schedule."""

from __future__ import annotations

import json
import os
import re
import time

import dagster as dg
import pytest

from dagster_gpu import CorpusSource, TextFormat, asset_job, backfill_missing_schedule, corpus_sensor, embedding_asset
from dagster_gpu.definitions.partitions import prune_deleted_files
from dagster_gpu.partitions.run_ranges import range_run_tags
from dagster_gpu.partitions.status import partition_status, partitions_to_rerun


def _defs(corpus: CorpusSource, output_url: str):
    asset = embedding_asset(name="s_embeddings", corpus=corpus, output_url=output_url, device="cpu")
    job = asset_job(asset)
    sensor = corpus_sensor(asset, corpus, job=job)
    schedule = backfill_missing_schedule(asset, job=job)
    return asset, sensor, schedule, dg.Definitions(assets=[asset], jobs=[job], sensors=[sensor], schedules=[schedule])


class _Log:
    """Stands in for a tick's ``context.log``: keeps each line."""

    def __init__(self):
        self.lines: list[str] = []

    def info(self, msg, *args, **kwargs):
        self.lines.append(str(msg))

    warning = info


def _tick(sensor, instance, defs, cursor, log: _Log | None = None):
    """Evaluate one tick and apply its dynamic-partition requests as the daemon does (the daemon then
    resolves the run requests against the partitions as updated by those requests); ``log`` collects the
    tick's log lines."""
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs)
    if log is not None:
        ctx._logger = log
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


def _scheduled_asset(tmp_path, max_partitions_per_run: int):
    """An embedding asset over an empty corpus directory, its missing-partitions schedule and its job."""
    d = tmp_path / "corpus"
    d.mkdir()
    corpus = CorpusSource(url=str(d))
    asset = embedding_asset(name="s_embeddings", corpus=corpus, output_url=str(tmp_path / "out"), device="cpu",
                            max_partitions_per_run=max_partitions_per_run)
    job = asset_job(asset)
    schedule = backfill_missing_schedule(asset, job=job)
    defs = dg.Definitions(assets=[asset], jobs=[job], schedules=[schedule])
    return asset, schedule, defs.resolve_job_def("s_embeddings_job")


def test_schedule_requests_missing_and_failed_partitions_in_ranges(tmp_path):
    asset, schedule, job_def = _scheduled_asset(tmp_path, max_partitions_per_run=2)
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


def test_schedule_leaves_out_partitions_of_runs_in_flight_that_the_status_cache_misses(tmp_path, monkeypatch):
    """A rerun over a failed range, queued or running, must not be requested again. Dagster's status cache
    counts a partition in progress from a per-partition planned event; with planned events that carry the
    run's partition subset (DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS, dagster/_core/storage/event_log/
    base.py) it sees none, and the schedule requested the range again (the fault campaign's duplicates were the
    same symptom: a partition materialized twice by a rerun and the schedule's next tick)."""
    monkeypatch.setenv("DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS", "1")
    asset, schedule, job_def = _scheduled_asset(tmp_path, max_partitions_per_run=4)
    keys = ["f0", "f1", "f2", "f3", "f4", "f5"]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("s_embeddings_files", keys)
        # the whole asset job's run (no asset selection, as a schedule launches it) over f1..f3, queued
        queued = instance.create_run_for_job(job_def, tags=range_run_tags(["f1", "f2", "f3"]))
        assert queued.asset_selection is None
        single = instance.create_run_for_job(job_def, tags={"dagster/partition": "f5"})
        _finish(instance, single, dg.DagsterRunStatus.STARTED)
        from dagster._core.storage.partition_status_cache import get_and_update_asset_status_cache_value
        from dagster_gpu.partitions.status import dynamic_partitions_def, partitions_in_flight

        cache = get_and_update_asset_status_cache_value(instance, asset.key, dynamic_partitions_def(asset))
        assert cache is None or not cache.serialized_in_progress_partition_subset or \
            not cache.deserialize_in_progress_partition_subsets(dynamic_partitions_def(asset)).get_partition_keys()
        assert partitions_in_flight(instance, asset) == {"f1", "f2", "f3", "f5"}
        assert partition_status(instance, asset)[2] == {"f1", "f2", "f3", "f5"}
        assert partitions_to_rerun(instance, asset) == ["f0", "f4"]
        reqs = schedule(dg.build_schedule_context(instance=instance))
        assert [(r.partition_key, r.run_key) for r in reqs] == [("f0", "f0..f0"), ("f4", "f4..f4")]
        # once the runs end, their partitions count again (the ranged run failed, the single one succeeded)
        _finish(instance, queued, dg.DagsterRunStatus.FAILURE)
        instance.report_runless_asset_event(dg.AssetMaterialization(asset.key, partition="f5"))
        _finish(instance, single, dg.DagsterRunStatus.SUCCESS)
        assert partitions_in_flight(instance, asset) == set()
        assert partitions_to_rerun(instance, asset) == ["f0", "f1", "f2", "f3", "f4"]


def _materialized(instance, asset, pk, version, code_version=None):
    """A materialization of ``pk`` as the unit records it: the source version it read, its code version."""
    tags = {"dagster/code_version": code_version} if code_version else None
    instance.report_runless_asset_event(dg.AssetMaterialization(
        asset.key, partition=pk, metadata={"corpus/source_version": version}, tags=tags))


def test_changed_files_are_requested_once_per_version_and_not_while_in_progress(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    for name in ("a.txt", "b.txt", "c.txt", "d.txt"):
        (d / name).write_text(f"{name}\n")
    corpus = CorpusSource(url=str(d), text_format=TextFormat(format="text"))
    asset, sensor, _, defs = _defs(corpus, str(tmp_path / "out"))
    job_def = defs.resolve_job_def("s_embeddings_job")
    with dg.instance_for_test() as instance:
        first = _tick(sensor, instance, defs, None)
        for f in corpus.list_files():
            _materialized(instance, asset, f.key, f.version)
        assert _tick(sensor, instance, defs, first.cursor).run_requests == []
        later = time.time() + 5
        for name in ("a.txt", "b.txt", "d.txt"):
            (d / name).write_text(f"{name} edited\n")
            os.utime(d / name, (later, later))
        # d.txt's run is in progress: left alone; a.txt..b.txt are consecutive: one ranged run
        running = instance.create_run_for_job(job_def, tags={"dagster/partition": "d.txt"}, asset_selection=frozenset({asset.key}))
        _finish(instance, running, dg.DagsterRunStatus.STARTED)
        changed = _tick(sensor, instance, defs, first.cursor)
        assert [r.partition_key_range for r in changed.run_requests] == [dg.PartitionKeyRange("a.txt", "b.txt")]
        assert not changed.dynamic_partitions_requests
        assert _tick(sensor, instance, defs, first.cursor).run_requests[0].run_key == changed.run_requests[0].run_key
        _finish(instance, running, dg.DagsterRunStatus.SUCCESS)
        # c.txt between them is materialized and current, and redoing it costs less than a second unit's
        # start-up: one run over a.txt..d.txt (without bridging: a.txt..b.txt and d.txt)
        after = _tick(sensor, instance, defs, first.cursor)
        assert [r.run_key.split(":", 1)[1] for r in after.run_requests] == ["a.txt..d.txt"]
        unbridged = corpus_sensor(asset, corpus, bridge=False, name="unbridged")
        assert [r.run_key.split(":", 1)[1] for r in unbridged(dg.build_sensor_context(instance=instance, definitions=defs)).run_requests] == [
            "a.txt..b.txt", "d.txt..d.txt"]
        # a.txt re-embedded at its new version: only b.txt and d.txt remain, c.txt bridged between them
        _materialized(instance, asset, "a.txt", corpus.file_for_key("a.txt").version)
        assert [r.run_key.split(":", 1)[1] for r in _tick(sensor, instance, defs, first.cursor).run_requests] == [
            "b.txt..d.txt"]
        # changed=False: new files only
        only_new = corpus_sensor(asset, corpus, changed=False, name="only_new")
        assert only_new(dg.build_sensor_context(instance=instance, definitions=defs)).run_requests == []


def test_schedule_with_stale_also_requests_changed_and_refingerprinted_partitions(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    for name in ("fresh.txt", "edited.txt", "never.txt", "old_fp.txt"):
        (d / name).write_text("x\n")
    corpus = CorpusSource(url=str(d), text_format=TextFormat(format="text"))
    asset = embedding_asset(name="s_embeddings", corpus=corpus, output_url=str(tmp_path / "out"), device="cpu")
    cv = asset.code_versions_by_key[asset.key]
    plain = backfill_missing_schedule(asset)
    with_stale = backfill_missing_schedule(asset, stale=True, corpus=corpus, name="with_stale")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("s_embeddings_files", ["fresh.txt", "edited.txt", "never.txt", "old_fp.txt"])
        v = {f.key: f.version for f in corpus.list_files()}
        _materialized(instance, asset, "fresh.txt", v["fresh.txt"], cv)
        _materialized(instance, asset, "edited.txt", "size:1,mtime:1.0", cv)
        _materialized(instance, asset, "old_fp.txt", v["old_fp.txt"], "cfg1-0000000000000000")
        assert [r.partition_key for r in plain(dg.build_schedule_context(instance=instance))] == ["never.txt"]
        reqs = with_stale(dg.build_schedule_context(instance=instance))
        assert [(r.partition_key, r.partition_key_range) for r in reqs] == [
            (None, dg.PartitionKeyRange("edited.txt", "old_fp.txt"))]


def _failed_attempt(instance, asset, job_def, keys, materialized=(), read=None):
    """A run over ``keys`` (range tags: Dagster writes a planned event per key) that materialized
    ``materialized`` and failed the others, recording their failed checks as the unit does (``read``: key ->
    the source version the attempt read), then failed."""
    from dagster_gpu.instance.checks import partition_failed_evaluations

    run = instance.create_run_for_job(job_def, tags=range_run_tags(keys), asset_selection=frozenset({asset.key}))
    _finish(instance, run, dg.DagsterRunStatus.STARTED)
    for k in keys:
        if k in materialized:
            _materialized(instance, asset, k, (read or {}).get(k))
        elif read is not None:
            for ev in partition_failed_evaluations(asset.key, k, f"partition {k!r}: not UTF-8", source_version=read.get(k)):
                instance.report_runless_asset_event(ev)
    _finish(instance, run, dg.DagsterRunStatus.FAILURE)
    return run


def test_a_failed_read_is_timed_by_its_event_not_by_the_whole_second_sqlite_stores():
    """SQLite stores a check execution row's create_timestamp as CURRENT_TIMESTAMP (whole seconds): a file written
    earlier in the second of its failure looked modified after it, and the sensor requested it again."""
    from dagster._core.definitions.asset_checks.asset_check_spec import AssetCheckKey

    from dagster_gpu.instance.checks import OUTPUT_READABLE, partition_failed_evaluations
    from dagster_gpu.partitions.source_versions import failed_reads

    key = dg.AssetKey("s_embeddings")
    with dg.instance_for_test() as instance:
        for ev in partition_failed_evaluations(key, "lost.txt", "partition 'lost.txt': worker lost"):
            instance.report_runless_asset_event(ev)
        (row,) = instance.event_log_storage.get_asset_check_execution_history(AssetCheckKey(key, OUTPUT_READABLE), limit=1)
        assert row.create_timestamp == int(row.create_timestamp)  # what SQLite keeps: whole seconds
        fr = failed_reads(instance, key, ["lost.txt"])["lost.txt"]
    assert (fr.timestamp, fr.source_version) == (row.event.timestamp, None)


def _text_corpus(tmp_path, files: dict[str, bytes]):
    """A plain-text corpus directory holding ``files`` (name -> bytes), with the sensor's asset over it:
    (directory, corpus, asset, sensor, defs, the asset's job)."""
    d = tmp_path / "corpus"
    d.mkdir()
    for name, data in files.items():
        (d / name).write_bytes(data)
    corpus = CorpusSource(url=str(d), text_format=TextFormat(format="text"))
    asset, sensor, _, defs = _defs(corpus, str(tmp_path / "out"))
    return d, corpus, asset, sensor, defs, defs.resolve_job_def("s_embeddings_job")


def test_a_tick_logs_its_new_and_its_changed_or_fixed_files(tmp_path):
    d, corpus, asset, sensor, defs, job_def = _text_corpus(
        tmp_path, {"bad.txt": "caf\xe9\n".encode("latin-1"), "good.txt": b"fine\n"})
    with dg.instance_for_test() as instance:
        log = _Log()
        first = _tick(sensor, instance, defs, None, log)  # new files only: logged too
        assert log.lines == [f"requesting 2 new and 0 changed or fixed file(s) under {d}: new: bad.txt, good.txt"]
        v = {f.key: f.version for f in corpus.list_files()}
        _failed_attempt(instance, asset, job_def, ["bad.txt", "good.txt"], materialized={"good.txt"}, read=v)
        later = time.time() + 5
        (d / "bad.txt").write_text("café\n")
        os.utime(d / "bad.txt", (later, later))
        (d / "geology.txt").write_text("rocks\n")
        log = _Log()
        tick = _tick(sensor, instance, defs, first.cursor, log)
        assert tick.run_requests and [list(r.partition_keys) for r in tick.dynamic_partitions_requests] == [["geology.txt"]]
        assert log.lines == [f"requesting 1 new and 1 changed or fixed file(s) under {d}: new: geology.txt; "
                             f"changed or fixed: bad.txt"]


def test_a_fixed_broken_file_is_requested_again_and_an_unchanged_one_is_not(tmp_path):
    d, corpus, asset, sensor, defs, job_def = _text_corpus(tmp_path, {
        "good.txt": b"fine\n", "bad.txt": "caf\xe9\n".encode("latin-1"), "lost.txt": b"its unit died before reading it\n"})
    with dg.instance_for_test() as instance:
        first = _tick(sensor, instance, defs, None)
        v = {f.key: f.version for f in corpus.list_files()}
        # bad.txt failed reading v["bad.txt"]; lost.txt failed with no read recorded (its worker was lost)
        _failed_attempt(instance, asset, job_def, ["bad.txt", "good.txt", "lost.txt"], materialized={"good.txt"},
                        read={"good.txt": v["good.txt"], "bad.txt": v["bad.txt"]})
        assert partition_status(instance, asset)[1] == {"bad.txt", "lost.txt"}
        idle = _tick(sensor, instance, defs, first.cursor)
        assert idle.run_requests == [] and "no new or changed files" in idle.skip_reason.skip_message
        # bad.txt fixed (UTF-8 now): requested at the next tick, alone; lost.txt unchanged: not
        later = time.time() + 5
        (d / "bad.txt").write_text("café\n")
        os.utime(d / "bad.txt", (later, later))
        fixed = _tick(sensor, instance, defs, first.cursor)
        assert [(r.partition_key, r.run_key.split(":", 1)[1]) for r in fixed.run_requests] == [("bad.txt", "bad.txt..bad.txt")]
        # lost.txt rewritten after its failure: requested too
        (d / "lost.txt").write_text("rewritten\n")
        os.utime(d / "lost.txt", (later, later))
        both = _tick(sensor, instance, defs, first.cursor)
        assert [r.partition_key_range for r in both.run_requests] == [dg.PartitionKeyRange("bad.txt", "lost.txt")]
        # that run is lost before reading anything (no failed checks): the same files are due at the same versions
        # (good.txt, failed now, is no longer bridged); tick after tick the same run keys, which Dagster does not
        # run twice (the schedule retries them, a bounded number of times)
        _failed_attempt(instance, asset, job_def, ["bad.txt", "good.txt", "lost.txt"])
        again = _tick(sensor, instance, defs, first.cursor)
        assert [r.partition_key for r in again.run_requests] == ["bad.txt", "lost.txt"]
        assert [r.run_key for r in _tick(sensor, instance, defs, first.cursor).run_requests] == [r.run_key for r in again.run_requests]
        # good.txt (bridged above, failed now without a read) changes: due as changed since its materialization
        (d / "good.txt").write_text("fine, and more\n")
        os.utime(d / "good.txt", (later + 1, later + 1))
        changed = _tick(sensor, instance, defs, first.cursor)
        assert [r.partition_key_range for r in changed.run_requests] == [dg.PartitionKeyRange("bad.txt", "lost.txt")]
        assert changed.run_requests[0].run_key != both.run_requests[0].run_key


def test_schedule_retries_a_failed_partition_a_bounded_number_of_times_per_file_version(tmp_path):
    asset, schedule, job_def = _scheduled_asset(tmp_path, max_partitions_per_run=4)
    d = tmp_path / "corpus"
    (d / "x.txt").write_text("x\n")
    past = time.time() - 60
    os.utime(d / "x.txt", (past, past))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("s_embeddings_files", ["x.txt"])
        for attempt in range(3):
            ctx, log = dg.build_schedule_context(instance=instance), _Log()
            ctx._logger = log
            reqs = schedule(ctx)
            assert [r.partition_key for r in reqs] == ["x.txt"], attempt
            # the tick says what it requests, and which try a retried failed partition is
            assert log.lines[-1] == ("requesting 1 partition(s): 1 missing: x.txt" if attempt == 0 else
                                     f"requesting 1 partition(s): 1 failed, retried: x.txt (try {attempt + 1} of 3 "
                                     f"on this file version)"), log.lines
            _failed_attempt(instance, asset, job_def, ["x.txt"])
        left = schedule(dg.build_schedule_context(instance=instance))
        assert isinstance(left, dg.SkipReason)
        assert "1 failed partition(s) left until their file changes (failed 3 time(s))" in left.skip_message
        unbounded = backfill_missing_schedule(asset, max_failed_attempts=None, name="unbounded")
        assert [r.partition_key for r in unbounded(dg.build_schedule_context(instance=instance))] == ["x.txt"]
        # the file changes: its attempts count from zero again
        later = time.time() + 5
        os.utime(d / "x.txt", (later, later))
        assert [r.partition_key for r in schedule(dg.build_schedule_context(instance=instance))] == ["x.txt"]


class _Clock:
    def __init__(self, t: float):
        self.t = t

    def time(self) -> float:
        return self.t


def test_sensor_holds_files_until_max_delay_and_the_cursor_keeps_since_when(tmp_path, monkeypatch):
    import dagster_gpu.definitions.sensors as sensors_mod

    d = tmp_path / "corpus"
    d.mkdir()
    corpus = CorpusSource(url=str(d), text_format=TextFormat(format="text"))
    asset = embedding_asset(name="s_embeddings", corpus=corpus, output_url=str(tmp_path / "out"), device="cpu")
    sensor = corpus_sensor(asset, corpus, max_delay_seconds=60, target_useful_fraction=0.5)
    defs = dg.Definitions(assets=[asset], sensors=[sensor])
    clock = _Clock(1_000_000.0)
    monkeypatch.setattr(sensors_mod, "time", clock)
    with dg.instance_for_test() as instance:
        (d / "a.txt").write_text("first\n")
        t1 = _tick(sensor, instance, defs, None)
        assert not t1.run_requests and not t1.dynamic_partitions_requests
        assert t1.skip_reason.skip_message == "held 1 file, 0.0 kB: a unit now would be 6 % useful (target 50 %); oldest waited 0 s of 60"
        assert json.loads(t1.cursor)["held"]["a.txt"][2] == 1_000_000.0
        clock.t += 30
        (d / "b.txt").write_text("second\n")
        t2 = _tick(sensor, instance, defs, t1.cursor)
        assert t2.skip_reason.skip_message.startswith("held 2 files, 0.0 kB: ") and t2.skip_reason.skip_message.endswith(
            "oldest waited 30 s of 60")
        assert json.loads(t2.cursor)["held"]["b.txt"][2] == 1_000_030.0
        # a restart re-evaluates from the stored cursor: a.txt has waited since the first tick
        clock.t += 31
        t3 = _tick(sensor, instance, defs, t2.cursor)
        assert [(r.partition_key_range, r.run_key.split(":", 1)[1]) for r in t3.run_requests] == [
            (dg.PartitionKeyRange("a.txt", "b.txt"), "a.txt..b.txt")]
        assert [list(r.partition_keys) for r in t3.dynamic_partitions_requests] == [["a.txt", "b.txt"]]
        assert "held" not in json.loads(t3.cursor)
        # the files are partitions now, requested by that run: the next tick finds nothing due
        t4 = _tick(sensor, instance, defs, t3.cursor)
        assert t4.run_requests == [] and "no new or changed files" in t4.skip_reason.skip_message
        with pytest.raises(ValueError):
            corpus_sensor(asset, corpus, max_delay_seconds=60, target_useful_fraction=0.0)


def test_sensor_releases_whole_units_and_holds_the_remainder_on(tmp_path, monkeypatch):
    import dagster_gpu.definitions.sensors as sensors_mod

    d = tmp_path / "corpus"
    d.mkdir()
    corpus = CorpusSource(url=str(d), text_format=TextFormat(format="text"))
    asset = embedding_asset(name="s_embeddings", corpus=corpus, output_url=str(tmp_path / "out"), device="cpu",
                            max_partitions_per_run=2)
    sensor = corpus_sensor(asset, corpus, max_delay_seconds=60, target_useful_fraction=0.5)
    defs = dg.Definitions(assets=[asset], sensors=[sensor])
    clock = _Clock(1_000_000.0)
    monkeypatch.setattr(sensors_mod, "time", clock)
    with dg.instance_for_test() as instance:
        cursor = None
        for name, at in (("a.txt", 0), ("b.txt", 10), ("c.txt", 30)):
            clock.t = 1_000_000.0 + at
            (d / name).write_text(f"{name}\n")
            tick = _tick(sensor, instance, defs, cursor)
            assert not tick.run_requests
            cursor = tick.cursor
        # a.txt has waited 61 s: the unit of a.txt and b.txt (the run size) goes; c.txt (31 s) is held on
        clock.t = 1_000_061.0
        log = _Log()
        t = _tick(sensor, instance, defs, cursor, log)
        assert [r.partition_key_range for r in t.run_requests] == [dg.PartitionKeyRange("a.txt", "b.txt")]
        assert [list(r.partition_keys) for r in t.dynamic_partitions_requests] == [["a.txt", "b.txt"]]
        assert json.loads(t.cursor)["held"] == {"c.txt": [json.loads(cursor)["held"]["c.txt"][0], 6, 1_000_030.0]}
        assert log.lines[0].startswith("requested 2 files, 0.0 kB in 1 unit (max delay reached): ")
        assert "; held on 1 file, 0.0 kB: " in log.lines[0] and log.lines[0].endswith("oldest waited 31 s of 60")
        # c.txt alone once it has waited out the delay
        clock.t = 1_000_090.0
        last = _tick(sensor, instance, defs, t.cursor)
        assert [r.partition_key for r in last.run_requests] == ["c.txt"]
        assert "held" not in json.loads(last.cursor)


def test_the_freshness_knob_prices_each_unit_it_requests_with_reuse_as_reuse(tmp_path, monkeypatch):
    import dagster_gpu.definitions.sensors as sensors_mod
    from dagster_gpu.partitions.unit_cost import unit_cost

    d = tmp_path / "corpus"
    d.mkdir()
    for name in ("a.txt", "b.txt"):
        (d / name).write_text("line of text\n" * 500_000)  # 6.5 MB each
    # whole files (no shards of the 4 MiB default): the knob prices files, shards are test_shard_default's
    corpus = CorpusSource(url=str(d), text_format=TextFormat(format="text"), shard_bytes=None)
    asset = embedding_asset(name="s_embeddings", corpus=corpus, output_url=str(tmp_path / "out"), device="cpu")
    sensor = corpus_sensor(asset, corpus, max_delay_seconds=60, target_useful_fraction=0.5, bridge=False)
    defs = dg.Definitions(assets=[asset], sensors=[sensor])
    clock = _Clock(time.time())
    monkeypatch.setattr(sensors_mod, "time", clock)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(asset.partitions_def.name, ["a.txt", "b.txt"])
        for f in corpus.list_files():  # embedded at these versions, 6.5 MB read each
            instance.report_runless_asset_event(dg.AssetMaterialization(
                asset.key, partition=f.key, metadata={"corpus/source_version": f.version, "corpus/bytes": f.size_bytes}))
        # a.txt grows by one line (its 6.5 MB are reused); a new file n.txt of 6.5 MB: a.txt and n.txt are not
        # consecutive keys (b.txt between them), so they would run as two units
        clock.t += 10
        (d / "a.txt").write_text("line of text\n" * 500_001)
        os.utime(d / "a.txt", (clock.t, clock.t))
        (d / "n.txt").write_text("line of text\n" * 500_000)
        cost = unit_cost(instance, asset)
        n_uf = cost.useful_fraction([6_500_000])
        a_uf = cost.useful_fraction([6_500_013], reused_bytes=6_500_000)
        assert a_uf < 0.5 <= n_uf <= cost.useful_fraction([6_500_000, 6_500_013])  # priced together, both would go
        log = _Log()
        t = _tick(sensor, instance, defs, None, log)
        # n.txt's unit is requested, priced alone; a.txt's (mostly reuse) is held on
        assert [r.partition_key for r in t.run_requests] == ["n.txt"]
        assert list(json.loads(t.cursor)["held"]) == ["a.txt"]
        assert log.lines[0] == (
            f"requested 1 file, 6.5 MB in 1 unit: {n_uf * 100:.0f} % useful (target 50 %); oldest waited 0 s of 60; "
            f"held on 1 file, 6.5 MB: a unit now would be {a_uf * 100:.0f} % useful (target 50 %, 6.5 MB of it reused); "
            "oldest waited 0 s of 60")
        # a.txt alone once it has waited out the delay, with the figure of its own unit
        clock.t += 61
        log = _Log()
        late = _tick(sensor, instance, defs, t.cursor, log)
        assert [r.partition_key for r in late.run_requests] == ["a.txt"]
        assert log.lines[0].startswith(f"requested 1 file, 6.5 MB in 1 unit (max delay reached): {a_uf * 100:.0f} % useful "
                                       "(target 50 %, 6.5 MB of it reused); oldest waited 61 s of 60")
