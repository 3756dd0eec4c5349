"""Which partitions are stale and why (pure: dagster_gpu.partitions.stale.find_stale on hand-built recorded versions)."""

from __future__ import annotations

from dagster_gpu.partitions.source_versions import Recorded
from dagster_gpu.partitions.stale import find_stale

FP_OLD, FP_NEW = "cfg1-00aa", "cfg1-11bb"


def test_source_and_fingerprint_changes_are_stale_with_why_missing_gone_and_running_are_apart():
    keys = ["same", "edited", "refp", "both", "never", "deleted", "running", "unversioned"]
    current = {"same": "etag:1", "edited": "etag:2b", "refp": "etag:3", "both": "size:4,mtime:9.5",
               "never": "etag:5", "running": "etag:7b", "unversioned": "etag:8"}
    recorded = {
        "same": Recorded("etag:1", FP_NEW),
        "edited": Recorded("etag:2a", FP_NEW),
        "refp": Recorded("etag:3", FP_OLD),
        "both": Recorded("size:4,mtime:1.5", FP_OLD),
        "deleted": Recorded("etag:6", FP_NEW),
        "running": Recorded("etag:7a", FP_NEW),
        "unversioned": Recorded(None, FP_NEW),  # materialized before source versions were recorded
    }
    s = find_stale(keys, current, recorded, FP_NEW, in_progress={"running"})
    assert [(p.partition_key, p.reasons) for p in s.stale] == [
        ("edited", ("source changed: etag:2a → etag:2b",)),
        ("refp", (f"fingerprint changed: {FP_OLD} → {FP_NEW}",)),
        ("both", ("source changed: size:4,mtime:1.5 → size:4,mtime:9.5", f"fingerprint changed: {FP_OLD} → {FP_NEW}")),
    ]
    assert (s.missing, s.gone, s.in_progress) == (("never",), ("deleted",), ("running",))
    assert s.stale_keys == ["edited", "refp", "both"]
    j = s.to_json()
    assert j["stale"][0] == {"partition_key": "edited", "reasons": ["source changed: etag:2a → etag:2b"],
                             "source_old": "etag:2a", "source_new": "etag:2b", "fingerprint_old": None, "fingerprint_new": None}
    assert j["missing"] == ["never"] and j["gone"] == ["deleted"]


def test_an_asset_without_a_code_version_is_stale_only_for_its_files():
    recorded = {"a": Recorded("etag:1", "run-id-1"), "b": Recorded("etag:1", None)}
    s = find_stale(["a", "b"], {"a": "etag:1", "b": "etag:2"}, recorded, None)
    assert [(p.partition_key, p.reasons) for p in s.stale] == [("b", ("source changed: etag:1 → etag:2",))]
    # a materialization that recorded no code version, under an asset that has one
    s = find_stale(["a"], {"a": "etag:1"}, {"a": Recorded("etag:1", None)}, FP_NEW)
    assert s.stale[0].reasons == (f"fingerprint changed: none recorded → {FP_NEW}",)


def test_a_fingerprint_change_names_the_options_that_changed():
    from dagster_gpu.embedding.fingerprint import config_fields, config_fingerprint

    old = config_fields(model="all-MiniLM-L6-v2", max_seq_length=256)
    new = config_fields(model="all-MiniLM-L6-v2", max_seq_length=128, prompt_name="query")
    fp_old, fp_new = config_fingerprint(model="all-MiniLM-L6-v2", max_seq_length=256), config_fingerprint(
        model="all-MiniLM-L6-v2", max_seq_length=128, prompt_name="query")
    recorded = {"a": Recorded("etag:1", fp_old, config=old), "b": Recorded("etag:1", fp_old)}
    s = find_stale(["a", "b"], {"a": "etag:1", "b": "etag:1"}, recorded, fp_new, config=new)
    assert dict((p.partition_key, p.reasons) for p in s.stale) == {
        "a": (f'fingerprint changed (prompt_name null → "query"; max_seq_length 256 → 128): {fp_old} → {fp_new}',),
        "b": (f"fingerprint changed (options not recorded by that materialization): {fp_old} → {fp_new}",),
    }


def test_output_columns_are_compared_with_the_file_when_the_materialization_recorded_none():
    from dagster_gpu.embedding.fingerprint import DEFAULT_COLUMNS, config_fields, config_fingerprint, output_columns

    legacy = config_fields(model="m")  # recorded before columns were part of the options
    legacy_fp = config_fingerprint(model="m")
    keys = ["kept", "had_package", "unknown"]
    current = dict.fromkeys(keys, "etag:1")
    recorded = {k: Recorded("etag:1", legacy_fp, config=legacy) for k in keys}
    files = {"kept": {"carry_columns": [], "include_text": False},
             "had_package": {"carry_columns": ["package"], "include_text": False}}
    # the asset dropped carry_columns (default columns: the same code version as before)
    s = find_stale(keys, current, recorded, config_fingerprint(model="m", columns=DEFAULT_COLUMNS),
                   config=config_fields(model="m", columns=DEFAULT_COLUMNS), file_columns=files)
    assert [(p.partition_key, p.reasons) for p in s.stale] == [
        ("had_package", ('output columns changed (columns {"carry_columns": ["package"], "include_text": false} → '
                         '{"carry_columns": [], "include_text": false})',))]
    # the asset carries "package" now (a new code version): only the outputs without it are stale
    cols = output_columns(carry_columns=["package"])
    fp = config_fingerprint(model="m", columns=cols)
    s = find_stale(keys, current, recorded, fp, config=config_fields(model="m", columns=cols), file_columns=files)
    assert [(p.partition_key, p.reasons) for p in s.stale] == [
        ("kept", ('fingerprint changed (columns {"carry_columns": [], "include_text": false} → '
                  f'{{"carry_columns": ["package"], "include_text": false}}): {legacy_fp} → {fp}',)),
        # its file's columns unknown: the recorded options say
        ("unknown", ('fingerprint changed (columns null → {"carry_columns": ["package"], "id_column": null, '
                     f'"include_text": false}}): {legacy_fp} → {fp}',))]


def test_failed_partitions_are_not_counted_missing():
    s = find_stale(["ok", "bad", "never"], dict.fromkeys(["ok", "bad", "never"], "etag:1"),
                   {"ok": Recorded("etag:1", FP_NEW)}, FP_NEW, failed={"bad"})
    assert (s.missing, s.failed, s.stale) == (("never",), ("bad",), ())
    assert s.to_json()["failed"] == ["bad"]


def test_the_columns_of_an_output_file_are_read_from_its_footer(tmp_path):
    import pyarrow as pa

    from dagster_gpu.definitions.partitions import output_file_columns
    from tests.index_helpers import write_output

    carried = write_output(tmp_path / "a.parquet", 2, 8, pk="a", fingerprint="f", texts=["x", "y"],
                           carried={"package": pa.array(["p", "q"])})
    plain = write_output(tmp_path / "b.parquet", 2, 8, pk="b", fingerprint="f")
    got = output_file_columns({"a": (str(carried), 1.0), "b": (str(plain), 1.0),
                               "gone": (str(tmp_path / "none.parquet"), 1.0)})
    assert got == {"a": {"carry_columns": ["package"], "include_text": True},
                   "b": {"carry_columns": [], "include_text": False}}  # an unreadable file: not compared
