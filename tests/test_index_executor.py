"""The vector index below the embeddings through gpu_executor (local backend, real worker processes): the
corpus sensor's ranged run over three new files materializes the embedding asset, the index's run over the
same partitions follows (rows in LanceDB = rows of each output, the check passes); after one file changes, the
sensor requests that partition alone, its run re-embeds only the changed texts, and the index's run replaces
only that partition's rows.

Code location: tests/index_executor_pipeline.py (corpus source asset, embedding asset, index asset, one job)."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from dagster_gpu.index.lance import VectorIndex
from tests.conftest import REPO, fortune_records

pytestmark = [pytest.mark.e2e]

FILES = {"a.txt": "cookie", "b.txt": "computers", "c.txt": "linux"}
PER_FILE = 8
RUN_CONFIG = {"execution": {"config": {"sleep_seconds": 0.2, "retries": {"disabled": {}}}}}


def _tick(p, instance):
    """One sensor tick with its dynamic-partition requests and asset events applied as the daemon applies them."""
    result = p.ixe_sensor(dg.build_sensor_context(instance=instance, definitions=p.defs))
    for req in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    for ev in result.asset_events or []:
        instance.report_runless_asset_event(ev)
    return result


def _run(target, instance, request: dg.RunRequest) -> dg.ExecuteJobResult:
    """``target``'s job over the request's partition or range, through gpu_executor."""
    tags = dict(request.tags or {})
    if request.partition_key is not None:
        tags["dagster/partition"] = request.partition_key
    result = dg.execute_job(dg.reconstructable(target), instance=instance, tags=tags, run_config=RUN_CONFIG)
    assert result.success, [e.message for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    # every step ran in a worker process the local backend started
    steps = {e.step_key for e in result.all_events if e.event_type_value == "STEP_SUCCESS"}
    assert steps and steps == {e.step_key for e in result.all_events if e.event_type_value == "STEP_WORKER_STARTING"}
    return result


def _index_rows(ix: VectorIndex, pk: str) -> dict[str, np.ndarray]:
    t = ix.open().to_arrow()
    t = t.filter(pc.equal(t.column("partition_key"), pk))
    return {d: np.asarray(v, np.float32) for d, v in zip(t.column("doc_id").to_pylist(), t.column("vector").to_pylist())}


def _output(root: Path, pk: str):
    (path,) = (root / "out").rglob(f"{pk}*.parquet")
    t = pq.read_table(path, columns=["doc_id", "text_sha256", "vector"])
    return path, {d: np.asarray(v, np.float32) for d, v in zip(t.column("doc_id").to_pylist(), t.column("vector").to_pylist())}


def _materializations(instance, key, pk) -> list:
    return instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, asset_partitions=[pk]), limit=10).records


def test_index_follows_embeddings_through_gpu_executor(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    records = {}
    for name, src in FILES.items():
        recs = fortune_records(src, PER_FILE)
        (corpus / name).write_text("\n%\n".join(recs) + "\n")
        records[name] = recs
    monkeypatch.setenv("DAGSTER_GPU_IXE_DIR", str(tmp_path))
    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.delitem(os.sys.modules, "tests.index_executor_pipeline", raising=False)
    from tests import index_executor_pipeline as p

    ix = VectorIndex(str(tmp_path / "lance"), "ixe_embeddings")
    emb_key, ix_key = p.ixe_embeddings.key, p.ixe_index.key
    with dg.instance_for_test() as instance:
        first = _tick(p, instance)
        assert [r.partition_key_range for r in first.run_requests] == [dg.PartitionKeyRange("a.txt", "c.txt")]
        _run(p.get_embeddings_job, instance, first.run_requests[0])
        result = _run(p.get_index_job, instance, first.run_requests[0])
        checks = [c for c in result.get_asset_check_evaluations() if c.asset_key == ix_key]
        assert sorted((c.partition, c.passed) for c in checks) == [(k, True) for k in FILES]
        before = {}
        for k in FILES:
            _, out = _output(tmp_path, k)
            before[k] = _index_rows(ix, k)
            assert len(out) == PER_FILE and ix.partition_rows(k) == PER_FILE
            assert before[k].keys() == out.keys()
            assert all(np.array_equal(before[k][d], out[d]) for d in out)  # the output's own vectors
        (fp,) = ix.fingerprints()
        mat = _materializations(instance, emb_key, "b.txt")[0].asset_materialization
        assert mat.metadata["embedding/fingerprint"].value == fp

        # one file changes: a record edited, one appended; the sensor requests that partition alone
        recs = list(records["b.txt"])
        recs[3] = recs[3] + " (revised)"
        recs.append("A record added to the corpus after the first run.")
        (corpus / "b.txt").write_text("\n%\n".join(recs) + "\n")
        second = _tick(p, instance)
        assert [(r.partition_key, r.partition_key_range) for r in second.run_requests] == [("b.txt", None)]
        _run(p.get_embeddings_job, instance, second.run_requests[0])
        emb_mat = _materializations(instance, emb_key, "b.txt")[0].asset_materialization
        assert emb_mat.metadata["embedding/reused_rows"].value == PER_FILE - 1  # only the two new texts embedded
        result = _run(p.get_index_job, instance, second.run_requests[0])
        _, out = _output(tmp_path, "b.txt")
        after = _index_rows(ix, "b.txt")
        assert len(out) == PER_FILE + 1 and ix.partition_rows("b.txt") == PER_FILE + 1
        assert after.keys() == out.keys() and all(np.array_equal(after[d], out[d]) for d in out)
        assert not np.array_equal(after["b.txt/3"], before["b.txt"]["b.txt/3"])  # the edited record's new vector
        assert all(np.array_equal(after[d], before["b.txt"][d]) for d in before["b.txt"] if d != "b.txt/3")
        for k in ("a.txt", "c.txt"):  # the other partitions: neither re-embedded nor touched in the index
            assert len(_materializations(instance, emb_key, k)) == 1 and len(_materializations(instance, ix_key, k)) == 1
            rows = _index_rows(ix, k)
            assert rows.keys() == before[k].keys() and all(np.array_equal(rows[d], before[k][d]) for d in rows)
        assert [(c.partition, c.passed) for c in result.get_asset_check_evaluations()] == [("b.txt", True)]
        assert ix.count_rows() == 3 * PER_FILE + 1
