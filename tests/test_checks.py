"""Asset checks on embedding outputs: the pure verdicts on real parquet files, and end to end on a real
instance (the real asset and model in process: a materialization records five passing checks per
partition; a corrupted output fails the recheck, naming the check; a ranged body records per-partition
evaluations and a failed blocking check fails its step)."""

from __future__ import annotations

import hashlib
import warnings

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from dagster._core.instance_for_test import instance_for_test

from dagster_gpu import CorpusSource, TextFormat, embedding_asset
from dagster_gpu.instance.checks import (
    CHECKS, HASH_PER_RECORD_ID, OUTPUT_READABLE, RECHECK, ROWS_MATCH_RECORDS, VECTOR_DIM, VECTORS_FINITE,
    OutputFacts, check_evaluations, check_outputs, check_specs, evaluate, read_facts, recheck_asset_check,
    verify_output,
)
from dagster_gpu.embedding.writer import AtomicParquetWriter, output_schema, output_table

DIM = 4


def write_output(path, ids, vectors, hashes=None, dim=DIM, chunks=None, texts=None, doc_ids=None):
    n = len(ids)
    texts_or = texts or [str(i) for i in ids]
    hashes = hashes or [hashlib.sha256(t.encode()).hexdigest() for t in texts_or]
    schema = output_schema(dim, include_text=texts is not None)
    table = output_table(
        schema, doc_ids=doc_ids or [f"p/{i}" for i in ids], record_ids=ids, chunk_index=chunks or [0] * n,
        char_start=[0] * n, char_end=[len(t) for t in texts_or], token_count=[3] * n, hashes=hashes,
        vectors=np.asarray(vectors, dtype=np.float32).reshape(n, dim), texts=texts)
    with AtomicParquetWriter(str(path), schema) as w:
        w.write(table)
    return str(path)


def verdicts(outcomes):
    return {o.name: o.passed for o in outcomes}


def test_good_output_passes_all_five(tmp_path):
    uri = write_output(tmp_path / "p.parquet", [0, 2, 3], np.ones((3, DIM)))
    out = verify_output(uri, expected_dim=DIM, records_read=5, skipped_empty_rows=2)
    assert [o.name for o in out] == list(CHECKS)
    assert all(o.passed for o in out), out
    assert out[1].description == "3 rows; 5 records read − 2 skipped = 3"


def test_each_defect_fails_its_own_check(tmp_path):
    nan = np.ones((3, DIM))
    nan[1, 2] = np.nan
    uri = write_output(tmp_path / "nan.parquet", [0, 1, 2], nan)
    out = {o.name: o for o in verify_output(uri, expected_dim=DIM, records_read=3, skipped_empty_rows=0)}
    assert {k: o.passed for k, o in out.items()} == {**dict.fromkeys(CHECKS, True), VECTORS_FINITE: False}
    assert out[VECTORS_FINITE].description == "1 vector(s) with NaN/inf, first at record_id 1"

    inf = np.ones((2, DIM))
    inf[0, 0] = -np.inf
    uri = write_output(tmp_path / "inf.parquet", [7, 7], inf)  # also a duplicate record id
    out = {o.name: o for o in verify_output(uri, expected_dim=8, records_read=3, skipped_empty_rows=0)}
    assert verdicts(out.values()) == {OUTPUT_READABLE: True, ROWS_MATCH_RECORDS: False, VECTOR_DIM: False,
                                      VECTORS_FINITE: False, HASH_PER_RECORD_ID: False}
    assert out[VECTOR_DIM].description == "vector dimension 4; expected 8"
    assert out[HASH_PER_RECORD_ID].description == "1 duplicate (doc_id, chunk_index) row(s) (first: p/7), 0 malformed text_sha256"

    uri = write_output(tmp_path / "hash.parquet", [0, 1], np.ones((2, DIM)), hashes=["abc", "Z" * 64])
    out = {o.name: o for o in verify_output(uri, expected_dim=DIM, records_read=2, skipped_empty_rows=0)}
    assert not out[HASH_PER_RECORD_ID].passed and "2 malformed text_sha256" in out[HASH_PER_RECORD_ID].description


def test_chunked_rows_count_records_with_at_least_one_chunk(tmp_path):
    # record 0 in three chunks, record 2 in one; record 1 was empty (skipped)
    uri = write_output(tmp_path / "c.parquet", [0, 0, 0, 2], np.ones((4, DIM)), chunks=[0, 1, 2, 0])
    out = {o.name: o for o in verify_output(uri, expected_dim=DIM, records_read=3, skipped_empty_rows=1)}
    assert all(o.passed for o in out.values()), out
    assert out[ROWS_MATCH_RECORDS].description == "2 records in 4 rows; 3 records read − 1 skipped = 2"
    assert out[ROWS_MATCH_RECORDS].metadata["records"] == 2 and out[ROWS_MATCH_RECORDS].metadata["rows"] == 4
    # a record that lost its chunks is missing: 1 record with a chunk, 2 expected
    uri = write_output(tmp_path / "lost.parquet", [0, 0], np.ones((2, DIM)), chunks=[0, 1])
    out = {o.name: o for o in verify_output(uri, expected_dim=DIM, records_read=3, skipped_empty_rows=1)}
    assert not out[ROWS_MATCH_RECORDS].passed


def test_a_chunk_index_repeated_within_a_doc_id_fails_the_hash_check(tmp_path):
    uri = write_output(tmp_path / "d.parquet", [0, 0, 1], np.ones((3, DIM)), chunks=[0, 0, 0],
                       doc_ids=["gpl-3", "gpl-3", "mit"])
    out = {o.name: o for o in verify_output(uri, expected_dim=DIM, records_read=2, skipped_empty_rows=0)}
    assert not out[HASH_PER_RECORD_ID].passed
    assert out[HASH_PER_RECORD_ID].description.startswith("1 duplicate (doc_id, chunk_index) row(s) (first: gpl-3)")


def test_kept_text_must_hash_to_text_sha256(tmp_path):
    good = write_output(tmp_path / "g.parquet", [0, 1], np.ones((2, DIM)), texts=["alpha", "beta"])
    assert all(o.passed for o in verify_output(good, expected_dim=DIM, records_read=2, skipped_empty_rows=0))
    wrong = [hashlib.sha256(b"alpha").hexdigest(), hashlib.sha256(b"not beta").hexdigest()]
    bad = write_output(tmp_path / "b.parquet", [0, 1], np.ones((2, DIM)), texts=["alpha", "beta"], hashes=wrong)
    out = {o.name: o for o in verify_output(bad, expected_dim=DIM, records_read=2, skipped_empty_rows=0)}
    assert not out[HASH_PER_RECORD_ID].passed and "1 malformed text_sha256" in out[HASH_PER_RECORD_ID].description


def test_an_output_without_doc_id_and_chunk_columns_is_checked_by_record_id(tmp_path):
    """Outputs written before doc_id/chunk_index existed (record_id, text_sha256, vector) still recheck."""
    p = tmp_path / "old.parquet"
    h = hashlib.sha256(b"x").hexdigest()
    pq.write_table(pa.table({"record_id": pa.array([0, 1, 1], pa.int64()), "text_sha256": [h] * 3,
                             "vector": pa.array([[1.0] * DIM] * 3, pa.list_(pa.float32(), DIM))}), p)
    out = {o.name: o for o in verify_output(str(p), expected_dim=DIM, records_read=2, skipped_empty_rows=0)}
    assert out[ROWS_MATCH_RECORDS].passed and not out[HASH_PER_RECORD_ID].passed
    assert out[HASH_PER_RECORD_ID].description.startswith("1 duplicate (doc_id, chunk_index) row(s) (first: 1)")


def test_missing_and_unreadable_outputs(tmp_path):
    out = verify_output(str(tmp_path / "none.parquet"), expected_dim=DIM, records_read=1, skipped_empty_rows=0)
    assert verdicts(out) == dict.fromkeys(CHECKS, False)
    assert "none.parquet: not found" in out[0].description
    assert out[1].description.startswith("not checked: the output could not be read")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not really")
    facts = read_facts(str(bad))
    assert facts.rows is None and "bad.parquet: unreadable" in facts.error
    good = write_output(tmp_path / "t.parquet", [0, 1], np.ones((2, DIM)))
    data = open(good, "rb").read()
    (tmp_path / "trunc.parquet").write_bytes(data[: len(data) // 2])  # cut in half: no footer
    assert "unreadable" in read_facts(str(tmp_path / "trunc.parquet")).error


def test_wrong_schema_and_empty_output(tmp_path):
    pq.write_table(pa.table({"record_id": pa.array([1], pa.int64())}), tmp_path / "cols.parquet")
    facts = read_facts(str(tmp_path / "cols.parquet"))
    assert facts.error.endswith("columns ['text_sha256', 'vector'] missing")
    with AtomicParquetWriter(str(tmp_path / "empty.parquet"), output_schema(DIM)):
        pass
    out = verify_output(str(tmp_path / "empty.parquet"), expected_dim=DIM, records_read=2, skipped_empty_rows=2)
    assert all(o.passed for o in out), out


def test_evaluate_is_pure_on_facts():
    out = evaluate(OutputFacts(rows=10, dim=384), expected_dim=384, records_read=12, skipped_empty_rows=1)
    assert verdicts(out)[ROWS_MATCH_RECORDS] is False
    assert out[1].metadata == {"rows": 10, "records": 10, "records_read": 12, "skipped_empty_rows": 1, "expected_rows": 11}


def test_specs_are_blocking_and_partitioned():
    pdef = dg.DynamicPartitionsDefinition(name="f")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the preview warning is silenced inside
        specs = check_specs(dg.AssetKey(["x", "emb"]), pdef)
    assert [s.name for s in specs] == list(CHECKS)
    assert all(s.blocking and s.partitions_def == pdef and s.asset_key == dg.AssetKey(["x", "emb"]) for s in specs)


# -- end to end on a real instance ----------------------------------------------------------------
def _fortune(path, records):
    path.write_text("".join(f"{r}\n%\n" for r in records), encoding="utf-8")


def _check_history(instance, key, name):
    recs = instance.event_log_storage.get_asset_check_execution_history(dg.AssetCheckKey(key, name), limit=50)
    return {(r.partition, r.run_id): r.status.value for r in recs}


def test_materialization_records_checks_and_a_corrupt_output_fails_its_recheck(tmp_path):
    corpus_dir = tmp_path / "corpus"
    corpus_dir.mkdir()
    _fortune(corpus_dir / "a", ["One fortune.", "", "Two fortunes."])
    _fortune(corpus_dir / "b", ["Three.", "Four.", "Five."])
    corpus = CorpusSource(url=str(corpus_dir), text_format=TextFormat(format="text", record_separator_line="%"))
    asset = embedding_asset(name="emb", corpus=corpus, output_url=str(tmp_path / "out"), device="cpu")
    recheck = recheck_asset_check(asset)
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("emb_files", ["a", "b"])
        runs = {}
        for pk in ("a", "b"):
            r = dg.materialize([asset], instance=instance, partition_key=pk)
            assert r.success
            runs[pk] = r.run_id
            evs = [e.event_specific_data for e in r.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
            assert sorted((e.check_name, e.partition, e.passed) for e in evs) == sorted((n, pk, True) for n in CHECKS)
        rows_md = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset.key, asset_partitions=["a"]), limit=1
        ).records[0].asset_materialization.metadata
        assert rows_md["embedding/rows"].value == 2 and rows_md["embedding/skipped_empty_rows"].value == 1
        for name in CHECKS:
            assert _check_history(instance, asset.key, name) == {("a", runs["a"]): "SUCCEEDED", ("b", runs["b"]): "SUCCEEDED"}

        # corrupt b's output on disk: one vector becomes NaN
        path = tmp_path / "out" / "emb" / "b.parquet"
        t = pq.read_table(path)
        vec = t.column("vector").combine_chunks().flatten().to_numpy().copy().reshape(3, -1)
        vec[2, 0] = np.nan
        t = t.set_column(t.schema.get_field_index("vector"), "vector", pa.FixedSizeListArray.from_arrays(pa.array(vec.reshape(-1), pa.float32()), vec.shape[1]))
        pq.write_table(t, path)

        verdict = {}
        for pk in ("a", "b"):
            r = dg.materialize([asset, recheck], instance=instance, tags={"dagster/partition": pk},
                               selection=dg.AssetSelection.checks(recheck))
            assert r.success  # the recheck is not blocking
            (ev,) = [e.event_specific_data for e in r.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
            assert ev.check_name == RECHECK and ev.partition == pk
            verdict[pk] = (ev.passed, ev.description)
        assert verdict["a"] == (True, "all five checks pass")
        assert verdict["b"] == (False, "vectors_finite: 1 vector(s) with NaN/inf, first at record_id 2")


def test_ranged_body_records_per_partition_evaluations_and_blocks(tmp_path):
    """The pattern the ranged embedding body uses: per-partition evaluations + one Output per check."""
    pdef = dg.DynamicPartitionsDefinition(name="files")
    key = dg.AssetKey("emb")
    facts = {"a": OutputFacts(rows=2, dim=DIM), "b": OutputFacts(rows=2, dim=DIM, nonfinite_vectors=1, first_nonfinite_id=0),
             "c": OutputFacts(rows=2, dim=DIM)}

    @dg.asset(name="emb", partitions_def=pdef, check_specs=check_specs(key, pdef), output_required=False)
    def emb(context):
        for k in context.partition_keys:
            yield dg.AssetMaterialization(asset_key=key, partition=k)
            yield from check_evaluations(key, k, evaluate(facts[k], expected_dim=DIM, records_read=2, skipped_empty_rows=0))
        yield from check_outputs(key)

    with instance_for_test() as instance:
        instance.add_dynamic_partitions("files", ["a", "b", "c"])
        r = dg.materialize([emb], instance=instance, raise_on_error=False,
                           tags={"dagster/asset_partition_range_start": "a", "dagster/asset_partition_range_end": "c"})
        assert not r.success
        (failure,) = [e for e in r.all_events if e.event_type_value == "STEP_FAILURE"]
        assert "1 blocking asset check failed" in failure.event_specific_data.error.message
        assert _check_history(instance, key, VECTORS_FINITE) == {
            ("a", r.run_id): "SUCCEEDED", ("b", r.run_id): "FAILED", ("c", r.run_id): "SUCCEEDED"}
        assert _check_history(instance, key, VECTOR_DIM) == {
            ("a", r.run_id): "SUCCEEDED", ("b", r.run_id): "SUCCEEDED", ("c", r.run_id): "SUCCEEDED"}
        assert instance.get_materialized_partitions(key) == {"a", "b", "c"}


def _check_state(instance, asset, name):
    """The UI's per-partition status of a check (what the Checks tab's partitions view reads): status -> keys."""
    from dagster._core.definitions.partitions.context import partition_loading_context

    ck = dg.AssetCheckKey(asset.key, name)
    with partition_loading_context(dynamic_partitions_store=instance):
        state = instance.event_log_storage.get_asset_check_state([(ck, asset.partitions_def)])[ck]
        return {s.value: sorted(sub.subset_value.get_partition_keys()) for s, sub in state.subsets.items()
                if not sub.is_empty}


def test_failed_partitions_record_failed_checks_with_the_reason(tmp_path):
    """A ranged run where two partitions fail (no file): their checks are recorded FAILED at once, with the reason
    (Dagster alone leaves them PLANNED: "in progress" until the run ends, then "execution failed" without a
    reason); the partition that succeeds reads SUCCEEDED in the per-partition status, which needs each
    evaluation to target the partition's materialization."""
    from dagster_gpu.instance.checks import PARTITION_FAILURE

    corpus_dir = tmp_path / "corpus"
    corpus_dir.mkdir()
    _fortune(corpus_dir / "a", ["One.", "Two."])
    _fortune(corpus_dir / "b", ["Three."])
    corpus = CorpusSource(url=str(corpus_dir), text_format=TextFormat(format="text", record_separator_line="%"))
    asset = embedding_asset(name="emb", corpus=corpus, output_url=str(tmp_path / "out"), device="cpu")
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("emb_files", ["a", "b", "c"])
        first = dg.materialize([asset], instance=instance, partition_key="b")
        assert first.success
        assert _check_state(instance, asset, VECTOR_DIM) == {"SUCCEEDED": ["b"]}

        (corpus_dir / "b").unlink()  # b was materialized before; c never had a file
        r = dg.materialize([asset], instance=instance, raise_on_error=False,
                           tags={"dagster/asset_partition_range_start": "a", "dagster/asset_partition_range_end": "c"})
        assert not r.success
        (failure,) = [e for e in r.all_events if e.event_type_value == "STEP_FAILURE"]
        assert "2 of 3 partition(s) failed (1 materialized)" in failure.event_specific_data.error.message
        for name in CHECKS:
            assert _check_history(instance, asset.key, name) == {
                ("b", first.run_id): "SUCCEEDED",
                ("a", r.run_id): "SUCCEEDED", ("b", r.run_id): "FAILED", ("c", r.run_id): "FAILED"}
            assert _check_state(instance, asset, name) == {"SUCCEEDED": ["a"], "FAILED": ["b", "c"]}
        evs = [(i, e.event_specific_data) for i, e in enumerate(r.all_events) if e.event_type_value == "ASSET_CHECK_EVALUATION"]
        failed = {(ev.partition, ev.check_name): ev for _i, ev in evs if not ev.passed}
        assert set(failed) == {(k, n) for k in ("b", "c") for n in CHECKS}
        reason = failed[("c", VECTOR_DIM)].metadata[PARTITION_FAILURE].value
        assert reason.startswith("partition 'c': no file in corpus")
        assert failed[("c", VECTOR_DIM)].description == f"not evaluated: the partition failed ({reason})"
        # at once: recorded before partition a is embedded, not when the unit ends
        (mat_at,) = [i for i, e in enumerate(r.all_events) if e.event_type_value == "ASSET_MATERIALIZATION"]
        assert max(i for i, ev in evs if not ev.passed) < mat_at
        # b's failed checks target its latest materialization (from the first run); c has none
        b_mat = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset.key, asset_partitions=["b"]), limit=1).records[0]
        assert failed[("b", VECTOR_DIM)].target_materialization_data.storage_id == b_mat.storage_id
        assert b_mat.run_id == first.run_id and failed[("c", VECTOR_DIM)].target_materialization_data is None
        # each failed partition's page lists an observation with the reason (OSS storage records no asset-failure
        # event: reference/adoption-kueue-fleet-notes.md); the partition that succeeded gets none
        obs = {rec.partition_key: rec.asset_observation.metadata for rec in instance.fetch_observations(
            dg.AssetRecordsFilter(asset_key=asset.key), limit=10).records}
        assert sorted(obs) == ["b", "c"]
        assert obs["c"][PARTITION_FAILURE].value == reason
        assert obs["b"][PARTITION_FAILURE].value.startswith("partition 'b': no file in corpus")
