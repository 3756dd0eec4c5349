"""Checkpoints inside a partition (dagster_gpu.embedding.checkpoint) with the real packaged model on CPU: a stopped
embed_partition commits its parts, the next call continues after them, and the output is the clean run's file."""

from __future__ import annotations

import io
import os
import threading

import pyarrow.parquet as pq
import pytest

from dagster_gpu.embedding.checkpoint import CheckpointKey, Checkpoints, staging_dir
from dagster_gpu.embedding.pipeline import Preempted
from tests.checkpoint_child import (LINEAGE, PARTITION_KEY, READ_BATCH_ROWS, SOURCE_VERSION, embed, load_test_model,
                                    write_corpus)

RECORDS = 150  # 139 kept records: 9 read batches of 16


@pytest.fixture(scope="module")
def model():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_GPU_CPU_SHARE", "0")  # torch keeps one thread: the same bits in every process
        yield load_test_model()


@pytest.fixture(scope="module")
def clean(model, tmp_path_factory):
    """(corpus file, the uninterrupted run's output bytes, its result)."""
    d = tmp_path_factory.mktemp("clean")
    src = write_corpus(d / "corpus.txt", RECORDS)
    out = d / "clean.parquet"
    result = embed(str(src), str(out), model, checkpoint=False)
    return src, out.read_bytes(), result


def _stop_after(batches: int):
    """(stop event, on_batch callback that sets it once ``batches`` read batches were encoded)."""
    stop = threading.Event()

    def on_batch(done: int) -> None:
        if done >= batches * READ_BATCH_ROWS:
            stop.set()

    return stop, on_batch


def _key(version=SOURCE_VERSION, fingerprint=LINEAGE["fingerprint"]):
    return CheckpointKey(PARTITION_KEY, version, fingerprint, READ_BATCH_ROWS)


def _same_output(path, clean_bytes):
    a, b = pq.read_table(path), pq.read_table(io.BytesIO(clean_bytes))
    assert a.num_rows == b.num_rows > 0
    assert a.equals(b)  # every column, vectors bit for bit (float equality), the same order
    assert a.schema.metadata == b.schema.metadata  # fingerprint, model, lineage
    assert pq.ParquetFile(path).metadata.num_row_groups == pq.ParquetFile(io.BytesIO(clean_bytes)).metadata.num_row_groups


def test_a_stopped_run_commits_parts_and_the_rerun_continues_after_them(model, clean, tmp_path):
    src, clean_bytes, clean_result = clean
    out = tmp_path / "out.parquet"
    stop, on_batch = _stop_after(3)
    with pytest.raises(Preempted) as info:
        embed(str(src), str(out), model, stop=stop, on_batch=on_batch)
    p = info.value
    assert (p.records, p.parts_committed, p.partition_key) == (3 * READ_BATCH_ROWS, 3, PARTITION_KEY)
    assert not out.exists()  # no output, no temp file of it
    assert [f.name for f in tmp_path.iterdir()] == [".out.parquet.parts"]
    resume = Checkpoints(str(out), _key()).load()
    assert (len(resume.paths), resume.progress.batches, resume.progress.records, resume.progress.rows) == (3, 3, 48, 48)

    again = embed(str(src), str(out), model)
    assert again.resumed_rows == p.rows == 48
    assert (again.rows, again.records, again.skipped_empty_rows, again.tokens, again.truncated_rows) == (
        clean_result.rows, clean_result.records, clean_result.skipped_empty_rows, clean_result.tokens,
        clean_result.truncated_rows)
    _same_output(out, clean_bytes)
    assert out.read_bytes() == clean_bytes  # the very same file
    assert sorted(f.name for f in tmp_path.iterdir()) == ["out.parquet"]  # the parts are gone


def test_without_checkpoints_a_stop_commits_nothing(model, clean, tmp_path):
    src, _, _ = clean
    out = tmp_path / "out.parquet"
    stop, on_batch = _stop_after(2)
    with pytest.raises(Preempted) as info:
        embed(str(src), str(out), model, checkpoint=False, stop=stop, on_batch=on_batch)
    assert (info.value.records, info.value.parts_committed) == (0, 0)
    assert list(tmp_path.iterdir()) == []


def test_parts_of_another_source_version_or_fingerprint_are_never_used_and_are_removed(model, clean, tmp_path):
    src, clean_bytes, _ = clean
    out = tmp_path / "out.parquet"
    for version, lineage in (("old-version", None), (SOURCE_VERSION, {**LINEAGE, "fingerprint": "fp-other"})):
        stop, on_batch = _stop_after(2)
        with pytest.raises(Preempted):
            embed(str(src), str(out), model, stop=stop, on_batch=on_batch, version=version, lineage=lineage)
    fs, root = staging_dir(str(out))
    (left,) = fs.ls(root)  # the second stop's start removed the first's parts
    assert left.endswith(_key(fingerprint="fp-other").digest)
    assert Checkpoints(str(out), _key()).load().paths == ()  # loading removes the others
    assert fs.ls(root) == []
    stop, on_batch = _stop_after(2)
    with pytest.raises(Preempted):
        embed(str(src), str(out), model, stop=stop, on_batch=on_batch, version="old-version")
    result = embed(str(src), str(out), model)  # parts of "old-version" exist: not used
    assert result.resumed_rows == 0
    _same_output(out, clean_bytes)
    assert not (tmp_path / ".out.parquet.parts").exists()


def test_temp_objects_and_parts_after_an_unreadable_one_are_not_used(model, clean, tmp_path):
    src, clean_bytes, _ = clean
    out = tmp_path / "out.parquet"
    stop, on_batch = _stop_after(4)
    with pytest.raises(Preempted):
        embed(str(src), str(out), model, stop=stop, on_batch=on_batch)
    part_dir = tmp_path / ".out.parquet.parts" / _key().digest
    names = sorted(f.name for f in part_dir.iterdir())
    assert names == [f"part-{i:06d}.parquet" for i in range(4)]
    # what a kill while writing part 4 leaves: a temp object (a torn part never has a committed name)
    (part_dir / ".part-000004.parquet.tmp-0123456789ab").write_bytes(b"PAR1 torn")
    torn = part_dir / "part-000002.parquet"  # and a committed part whose bytes do not read back
    torn.write_bytes(torn.read_bytes()[:100])
    resume = Checkpoints(str(out), _key()).load()
    assert [os.path.basename(p) for p in resume.paths] == ["part-000000.parquet", "part-000001.parquet"]
    assert sorted(f.name for f in part_dir.iterdir()) == ["part-000000.parquet", "part-000001.parquet"]
    result = embed(str(src), str(out), model)
    assert result.resumed_rows == 2 * READ_BATCH_ROWS
    _same_output(out, clean_bytes)


def test_a_unit_killed_while_removing_its_parts_leaves_parts_0_to_k_that_the_next_load_continues_after(
        model, clean, tmp_path, monkeypatch):
    src, _, _ = clean
    out = tmp_path / "out.parquet"
    stop, on_batch = _stop_after(4)
    with pytest.raises(Preempted):
        embed(str(src), str(out), model, stop=stop, on_batch=on_batch)
    store = Checkpoints(str(out), _key())
    removed, rm = [], store._rm

    def killed_after_two(path):  # the unit dies (SIGKILL) after two removals
        if len(removed) == 2:
            raise KeyboardInterrupt
        rm(path)
        removed.append(os.path.basename(path))

    monkeypatch.setattr(store, "_rm", killed_after_two)
    with pytest.raises(KeyboardInterrupt):
        store.remove()
    assert removed == ["part-000003.parquet", "part-000002.parquet"]
    resume = Checkpoints(str(out), _key()).load()
    assert [os.path.basename(p) for p in resume.paths] == ["part-000000.parquet", "part-000001.parquet"]
    assert resume.progress.records == 2 * READ_BATCH_ROWS


def test_checkpoints_on_s3(model, clean, s3):
    src, clean_bytes, _ = clean
    endpoint, client = s3
    bucket = s3.bucket("dgpu-checkpoint")
    opts = {"client_kwargs": {"endpoint_url": endpoint}}
    client.put_object(Bucket=bucket, Key="corpus/part.txt", Body=src.read_bytes())
    source, out = f"s3://{bucket}/corpus/part.txt", f"s3://{bucket}/out/e/part.txt.parquet"
    stop, on_batch = _stop_after(3)
    with pytest.raises(Preempted):
        embed(source, out, model, stop=stop, on_batch=on_batch, storage_options=opts)

    def keys():
        return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="out/").get("Contents", []))

    digest = _key().digest
    assert keys() == [f"out/e/.part.txt.parquet.parts/{digest}/part-{i:06d}.parquet" for i in range(3)]
    result = embed(source, out, model, storage_options=opts)
    assert result.resumed_rows == 3 * READ_BATCH_ROWS
    assert keys() == ["out/e/part.txt.parquet"]
    body = client.get_object(Bucket=bucket, Key="out/e/part.txt.parquet")["Body"].read()
    assert pq.read_table(io.BytesIO(body)).equals(pq.read_table(io.BytesIO(clean_bytes)))
    embed(source, f"s3://{bucket}/clean/part.txt.parquet", model, checkpoint=False, storage_options=opts)
    assert body == client.get_object(Bucket=bucket, Key="clean/part.txt.parquet")["Body"].read()  # the same file
