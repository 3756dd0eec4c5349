"""``dagster-gpu backfill``'s selection (registering corpus files, --missing, --failed) and its failure
listing, on a real (SQLite) instance with runs in the states the daemon leaves them."""

from __future__ import annotations

import json
import time

import sys
import threading
import types
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.events import EngineEventData
from rich.console import Console

from dagster_gpu import CorpusSource, TextFormat, asset_job, embedding_asset
from dagster_gpu.commands.backfill import PartitionSummary, summarize_partitions, wait_for_bills
from dagster_gpu.instance.bills import BilledShare, billed_share, unit_of
from dagster_gpu.commands.main import main
from dagster_gpu.instance.failures import failure_detail, first_line, log_location
from dagster_gpu.definitions.partitions import NoCorpus, corpus_of, register_corpus_files, select_partitions
from dagster_gpu.commands.progress import failures_table, print_summary

_EVENT = {dg.DagsterRunStatus.FAILURE: "PIPELINE_FAILURE", dg.DagsterRunStatus.STARTED: "PIPELINE_START",
          dg.DagsterRunStatus.SUCCESS: "PIPELINE_SUCCESS", dg.DagsterRunStatus.CANCELED: "PIPELINE_CANCELED"}


@pytest.fixture
def setup(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    for name in ("done.txt", "failed.txt", "never.txt", "running.txt", "canceled.txt"):
        (d / name).write_text("a record\n")
    (d / "skip.md").write_text("not matched by the pattern\n")
    corpus = CorpusSource(url=str(d), pattern="*.txt", text_format=TextFormat(format="text"))
    asset = embedding_asset(name="c_embeddings", corpus=corpus, output_url=str(tmp_path / "out"), device="cpu")
    job = asset_job(asset)
    defs = dg.Definitions(assets=[asset], jobs=[job])
    module = types.ModuleType("cli_test_defs")
    module.defs, module.fortune_corpus, module.asset = defs, corpus, asset
    return corpus, asset, defs, module


def _run(instance, defs, asset, pk, status):
    run = instance.create_run_for_job(defs.resolve_job_def("c_embeddings_job"), tags={"dagster/partition": pk},
                                      asset_selection=frozenset({asset.key}))
    instance.run_storage.handle_run_event(run.run_id, dg.DagsterEvent(event_type_value=_EVENT[status], job_name=run.job_name))
    return run


def test_corpus_of_finds_the_module_source(setup):
    corpus, asset, _defs, module = setup
    assert corpus_of(asset, module) is corpus  # its pattern and reader apply
    plain = corpus_of(asset, None)
    assert plain.url == corpus.url and plain.pattern == "*"
    with pytest.raises(NoCorpus, match="asset plain has no op tag 'dagster-gpu/corpus-url'"):
        corpus_of(_plain_asset())


def _plain_asset():
    @dg.asset(name="plain")
    def plain():
        return None

    return plain


def test_register_then_select_missing_and_failed(setup):
    corpus, asset, defs, _module = setup
    with dg.instance_for_test() as instance:
        added = register_corpus_files(instance, asset, corpus)
        assert added == ["canceled.txt", "done.txt", "failed.txt", "never.txt", "running.txt"]  # not skip.md
        assert register_corpus_files(instance, asset, corpus) == []  # idempotent
        instance.report_runless_asset_event(dg.AssetMaterialization(asset.key, partition="done.txt"))
        instance.report_runless_asset_event(dg.AssetMaterialization(asset.key, partition="failed.txt"))  # earlier success
        _run(instance, defs, asset, "done.txt", dg.DagsterRunStatus.SUCCESS)
        _run(instance, defs, asset, "failed.txt", dg.DagsterRunStatus.FAILURE)
        _run(instance, defs, asset, "running.txt", dg.DagsterRunStatus.STARTED)
        _run(instance, defs, asset, "canceled.txt", dg.DagsterRunStatus.CANCELED)
        assert select_partitions(instance, asset) == added
        assert select_partitions(instance, asset, missing=True) == ["canceled.txt", "never.txt"]  # running: in flight
        # as the UI's partitions view shows them: a canceled run's partition is missing, not failed
        assert select_partitions(instance, asset, failed=True) == ["failed.txt"]
        assert select_partitions(instance, asset, missing=True, failed=True) == ["canceled.txt", "failed.txt", "never.txt"]


def test_cli_registers_and_reports_nothing_to_do(setup, monkeypatch, capsys):
    corpus, asset, defs, module = setup
    monkeypatch.setitem(sys.modules, "cli_test_defs", module)
    with dg.instance_for_test() as instance:
        # every file materialized: --missing finds nothing after registering them all
        instance.add_dynamic_partitions("c_embeddings_files", ["done.txt"])
        for f in corpus.list_files():
            instance.report_runless_asset_event(dg.AssetMaterialization(asset.key, partition=f.key))
        assert main(["backfill", "-m", "cli_test_defs", "-a", "c_embeddings", "--missing"]) == 0
        out = capsys.readouterr()
        assert "4 new partition(s) registered" in out.out
        assert "no missing partitions of c_embeddings to backfill" in out.err
        assert sorted(instance.get_dynamic_partitions("c_embeddings_files")) == sorted(f.key for f in corpus.list_files())
        assert main(["backfill", "-m", "cli_test_defs", "-a", "c_embeddings", "--partitions", "nope.txt"]) == 2
        assert "partitions not registered for c_embeddings: nope.txt" in capsys.readouterr().err
        # a corpus file deleted: --prune removes its partition (and only it), so --missing stays at nothing to do
        gone = corpus.list_files()[0]
        Path(gone.uri).unlink()
        instance.add_dynamic_partitions("c_embeddings_files", ["also-gone.txt"])  # registered, never materialized
        assert main(["backfill", "-m", "cli_test_defs", "-a", "c_embeddings", "--missing", "--prune"]) == 0
        out = capsys.readouterr()
        assert f"2 partition(s) of deleted files removed: {gone.key}, also-gone.txt" in out.out.replace("\n", "")
        assert "no missing partitions of c_embeddings to backfill" in out.err
        assert sorted(instance.get_dynamic_partitions("c_embeddings_files")) == sorted(f.key for f in corpus.list_files())
        # bad arguments: one line and exit 2, no traceback
        assert main(["backfill", "-m", "cli_test_defs", "-a", "nosuch"]) == 2
        assert "no asset 'nosuch' in cli_test_defs.defs (assets: c_embeddings)" in capsys.readouterr().err
        assert main(["backfill", "-m", "cli_test_defs", "--attribute", "corpus", "-a", "c_embeddings"]) == 2
        assert "cli_test_defs.corpus is not a dagster Definitions" in capsys.readouterr().err
    for home in (None, corpus.url + "/no-such-dir"):
        if home is None:
            monkeypatch.delenv("DAGSTER_HOME", raising=False)
        else:
            monkeypatch.setenv("DAGSTER_HOME", home)
        assert main(["backfill", "-m", "cli_test_defs", "-a", "c_embeddings"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("dagster-gpu backfill: ") and "DAGSTER_HOME" in err and "Traceback" not in err


def test_cli_records_the_corpus_files_versions_as_the_sensor_does(setup, monkeypatch, capsys):
    """With its corpus as a source asset (``corpus_source``), ``backfill`` records each file's source version on
    it (an observation and a runless materialization, as a corpus sensor tick: the UI counts the files filled at
    once), and a second run records nothing new."""
    from dagster_gpu.partitions.source_versions import corpus_asset_key, corpus_source, corpus_versions

    corpus, asset, _defs, module = setup
    spec, linked = corpus_source(asset, corpus)
    module.defs = dg.Definitions(assets=[spec, linked])
    monkeypatch.setitem(sys.modules, "cli_test_defs", module)
    with dg.instance_for_test() as instance:
        for f in corpus.list_files():  # every file materialized: --missing has nothing to run
            instance.report_runless_asset_event(dg.AssetMaterialization(asset.key, partition=f.key))
        assert main(["backfill", "-m", "cli_test_defs", "-a", "c_embeddings", "--missing"]) == 0
        assert "5 file version(s) recorded on c_embeddings_corpus" in capsys.readouterr().out
        key = corpus_asset_key(asset.key)
        assert corpus_versions(instance, key) == {f.key: f.version for f in corpus.list_files()}
        assert instance.get_materialized_partitions(key) == {f.key for f in corpus.list_files()}
        assert main(["backfill", "-m", "cli_test_defs", "-a", "c_embeddings", "--missing"]) == 0
        assert "recorded" not in capsys.readouterr().out  # nothing changed


def test_cli_refuses_columns_on_text_files_before_any_unit_starts(tmp_path, monkeypatch, capsys):
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "status.jsonl").write_text('{"text": "a", "id": "1", "package": "p"}\n')
    for name in ("copyright", "changelog", "README"):
        (d / name).write_text("plain text\n")
    corpus = CorpusSource(url=str(d), text_format=TextFormat(id_column="id", carry_columns=["package"]))
    asset = embedding_asset(name="t_embeddings", corpus=corpus, output_url=str(tmp_path / "out"), device="cpu")
    module = types.ModuleType("cli_text_defs")
    module.defs, module.corpus = dg.Definitions(assets=[asset]), corpus
    monkeypatch.setitem(sys.modules, "cli_text_defs", module)
    with dg.instance_for_test() as instance:
        assert main(["backfill", "-m", "cli_text_defs", "-a", "t_embeddings"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"dagster-gpu backfill: 3 of 4 files of corpus {d} (pattern '*') are read as text, which "
                              f"has no columns: id_column / carry_columns need parquet or JSON Lines files")
        assert err.rstrip().endswith("README, changelog, copyright")
        assert instance.get_dynamic_partitions("t_embeddings_files") == [] and not instance.get_backfills()


def test_log_location_and_first_line():
    assert log_location({"local/log_file": dg.MetadataValue.text("/var/log/w.log")}, "r1") == "/var/log/w.log"
    assert log_location({"slurm/log_file": dg.MetadataValue.path("/spool/12_3.log")}, "r1") == "/spool/12_3.log"
    assert log_location({"k8s/namespace": "embed", "k8s/pod": "step-abc"}, "r1") == (
        "kubectl logs -n embed step-abc while the pod exists; its last lines are in run r1's step failure")
    assert log_location({}, "r1") == "run r1 in the Dagster UI (Runs → r1)"
    assert first_line("\n  dagster._core.errors.Boom: bad\nTraceback ...") == "dagster._core.errors.Boom: bad"
    assert first_line("x" * 200, limit=10) == "x" * 9 + "…"
    assert first_line(None) == ""


def test_failed_partitions_are_listed_below_the_summary(setup, tmp_path):
    _corpus, asset, defs, _module = setup
    with dg.instance_for_test() as instance:
        run = _run(instance, defs, asset, "failed.txt", dg.DagsterRunStatus.FAILURE)
        log = tmp_path / "worker.log"
        instance.report_dagster_event(
            dg.DagsterEvent(event_type_value="STEP_WORKER_STARTING", job_name=run.job_name, step_key="c_embeddings",
                            event_specific_data=EngineEventData(metadata={"local/log_file": dg.MetadataValue.text(str(log))})),
            run.run_id,
        )
        d = failure_detail(instance, "failed.txt", run.run_id, "partition 'failed.txt': undecodable\nmore lines")
        assert (d.partition_key, d.run_id, d.error, d.log) == ("failed.txt", run.run_id, "partition 'failed.txt': undecodable", str(log))
        rows = [PartitionSummary("done.txt", ok=True, rows=3, seconds=1.0, texts_per_second=3.0, backend="local",
                                 gpu_seconds=2.0, cost_usd=0.0001, bill=BilledShare(0.00015, 10.8, "process")),
                PartitionSummary("failed.txt", ok=False, error="partition 'failed.txt': undecodable\nTraceback", run_id=run.run_id,
                                 unit=("local/unit", "u1")),
                PartitionSummary("never.txt", ok=False, error="not materialized")]
        con = Console(record=True, width=200)
        print_summary(con, instance, rows, title="Backfill x")
        text = con.export_text()
        summary, failures = text.split("2 failed partition(s)")
        assert "undecodable" not in summary  # the error is no longer squeezed into the cost column
        assert "1/3 ok" in summary and "0.000100" in summary
        # billed: done.txt's share of its unit's bill; failed.txt ran but its bill has not landed; never.txt never ran
        # the table's total row and the one sentence that states the scheduler's bill, as the report does
        assert "0.000150 (1 pending)" in summary and summary.count("pending") == 3
        assert "The scheduler's bill (every partition's share" in summary and "): 0.000150 (1 pending) USD" in summary
        lines = [ln for ln in failures.splitlines() if "failed.txt" in ln or "never.txt" in ln]
        assert run.run_id in lines[0] and "partition 'failed.txt': undecodable" in lines[0] and str(log) in lines[0]
        assert "not materialized" in lines[1] and "no run recorded" in lines[1]
        assert failures_table([d]).row_count == 1
        assert "reused" not in summary  # no partition reused a vector: no column for it
        # a re-run that reused rows says so, and a partition whose every row was reused has no throughput
        again = [PartitionSummary("done.txt", ok=True, rows=3, reused_rows=3, seconds=0.0, texts_per_second=0.0,
                                  backend="local", gpu_seconds=0.5, cost_usd=0.00001),
                 PartitionSummary("edited.txt", ok=True, rows=4, reused_rows=1, seconds=0.5, texts_per_second=6.0,
                                  backend="local", gpu_seconds=1.0, cost_usd=0.00002),
                 PartitionSummary("never.txt", ok=False, error="not materialized")]
        con = Console(record=True, width=200)
        print_summary(con, instance, again, title="Backfill y")
        table = con.export_text().split("1 failed partition(s)")[0]
        assert "reused" in table
        done = next(ln for ln in table.splitlines() if "done.txt" in ln)
        edited = next(ln for ln in table.splitlines() if "edited.txt" in ln)
        assert [c.strip() for c in done.split("│")[1:6]] == ["done.txt", "3", "3", "0.00", "all reused"]
        assert [c.strip() for c in edited.split("│")[1:6]] == ["edited.txt", "4", "1", "0.50", "6.0"]


def test_identical_failures_are_one_row_naming_how_many_partitions():
    from dagster_gpu.instance.failures import FailureDetail

    why = "id_column / carry_columns need a JSON Lines or CSV corpus (TextFormat format 'text' has no columns)"
    same = [FailureDetail(f"f{i:03d}.txt", "run1", f"partition 'f{i:03d}.txt': {why}", "/logs/u1.log") for i in range(275)]
    other = FailureDetail("data.jsonl", "run2", "partition 'data.jsonl': line 3 is not valid JSON", "/logs/u2.log")
    con = Console(record=True, width=300)
    con.print(failures_table([*same[:100], other, *same[100:]]))
    text = con.export_text()
    assert "276 failed partition(s), 2 distinct error(s)" in text
    assert text.count(why) == 1  # once, not 275 times
    rows = [ln for ln in text.splitlines() if "│" in ln and ("partition" in ln)]
    assert "275 partitions: f000.txt, f001.txt, f002.txt … (+272)" in rows[0] and f"partition <partition>: {why}" in rows[0]
    assert "run1" in rows[0] and "/logs/u1.log" in rows[0]
    assert "data.jsonl" in rows[1] and "partition 'data.jsonl': line 3 is not valid JSON" in rows[1]


def test_a_partitions_billed_share_is_the_bill_of_the_unit_that_ran_it(setup):
    _corpus, asset, _defs, _module = setup
    with dg.instance_for_test() as instance:
        for unit, cost in (("u-old", 0.5), ("u-new", 0.25)):  # the partition ran twice: one bill per unit
            instance.report_runless_asset_event(dg.AssetObservation(asset.key, partition="p.txt", metadata={
                "billing/source": "process", "billing/cost_usd": cost, "billing/gpu_seconds": cost * 100, "local/unit": unit}))
        instance.report_runless_asset_event(dg.AssetObservation(asset.key, partition="p.txt", metadata={"other": 1}))
        assert billed_share(instance, asset.key, "p.txt", ("local/unit", "u-old")) == BilledShare(0.5, 50.0, "process")
        assert billed_share(instance, asset.key, "p.txt", ("local/unit", "u-new")) == BilledShare(0.25, 25.0, "process")
        assert billed_share(instance, asset.key, "p.txt", ("slurm/job_id", "12_0")) is None  # not billed yet
        assert billed_share(instance, asset.key, "other.txt", ("local/unit", "u-new")) is None
        assert billed_share(instance, asset.key, "p.txt", None) is None
    assert unit_of({"slurm/job_id": dg.MetadataValue.text("12_3"), "slurm/log_file": "/x"}) == ("slurm/job_id", "12_3")
    assert unit_of({"k8s/pod": "dagster-gpu-ab-0"}) == ("k8s/pod", "dagster-gpu-ab-0")
    assert unit_of({"local/log_file": "/x"}) is None


def test_the_summary_waits_for_a_bill_that_lands_after_the_runs_ended(setup):
    """A run worker bills its unit at exit, after the run's status is final: the summary re-reads the
    partitions whose bill is pending (the daemon still up) instead of showing measured costs only."""
    _corpus, asset, _defs, _module = setup

    def bill(instance, key, unit, cost):
        instance.report_runless_asset_event(dg.AssetObservation(asset.key, partition=key, metadata={
            "billing/source": "process", "billing/cost_usd": cost, "billing/gpu_seconds": 1.0, "local/unit": unit}))

    with dg.instance_for_test() as instance:
        for key in ("a.txt", "b.txt"):
            instance.report_runless_asset_event(dg.AssetMaterialization(asset.key, partition=key, metadata={
                "local/unit": "u1", "billing/cost_usd": 0.001}))
        instance.report_runless_asset_event(dg.AssetMaterialization(asset.key, partition="inline.txt"))  # no unit
        bill(instance, "a.txt", "u1", 0.002)
        rows = summarize_partitions(instance, asset.key, ["a.txt", "b.txt", "inline.txt"])
        assert [(r.billed_cost_usd, r.bill_pending) for r in rows] == [(0.002, False), (None, True), (None, False)]
        late = threading.Timer(0.5, bill, (instance, "b.txt", "u1", 0.003))
        late.start()
        waits: list[int] = []
        rows = wait_for_bills(instance, asset.key, rows, timeout_s=120, poll_s=0.1, on_wait=waits.append)
        late.join()
        assert [r.partition_key for r in rows] == ["a.txt", "b.txt", "inline.txt"]
        assert [r.billed_cost_usd for r in rows] == [0.002, 0.003, None] and not any(r.bill_pending for r in rows)
        assert waits and set(waits) == {1}
        # a bill that never lands: the wait ends at its timeout with the partition still pending
        instance.report_runless_asset_event(dg.AssetMaterialization(asset.key, partition="c.txt", metadata={"local/unit": "u2"}))
        rows = wait_for_bills(instance, asset.key, summarize_partitions(instance, asset.key, ["c.txt"]), timeout_s=0.3, poll_s=0.1)
        assert rows[0].bill_pending


def test_a_corpus_store_that_refuses_the_listing_is_one_line_naming_the_corpus(tmp_path, monkeypatch, capsys):
    """Found by a new-user run: an unreachable S3 endpoint (or wrong credentials) printed 134 lines of
    botocore tracebacks without the corpus URL."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    corpus = CorpusSource(url="s3://corp/corpus", text_format=TextFormat(format="text"), storage_options={
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},  # nothing listens on the discard port
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2}})
    asset = embedding_asset(name="u_embeddings", corpus=corpus, output_url=str(tmp_path / "out"), device="cpu")
    module = types.ModuleType("cli_unreachable_defs")
    module.defs, module.corpus = dg.Definitions(assets=[asset], jobs=[asset_job(asset)]), corpus
    monkeypatch.setitem(sys.modules, "cli_unreachable_defs", module)
    with dg.instance_for_test():
        assert main(["backfill", "-m", "cli_unreachable_defs", "-a", "u_embeddings"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("dagster-gpu backfill: corpus 's3://corp/corpus' cannot be listed: EndpointConnectionError: "
                           'Could not connect to the endpoint URL: "http://127.0.0.1:9/corp/corpus"')


def test_stale_lists_why_and_prune_deletes_the_output_of_the_deleted_file_only(setup, tmp_path, monkeypatch, capsys):
    import json
    import os
    import time

    corpus, asset, defs, module = setup
    monkeypatch.setitem(sys.modules, "cli_test_defs", module)
    cv = asset.code_versions_by_key[asset.key]
    out = tmp_path / "out" / "c_embeddings"
    out.mkdir(parents=True)
    with dg.instance_for_test() as instance:
        register_corpus_files(instance, asset, corpus)
        v = {f.key: f.version for f in corpus.list_files()}
        for pk in ("done.txt", "failed.txt", "running.txt", "canceled.txt"):
            (out / f"{pk}.parquet").write_bytes(b"PAR1")
            # canceled.txt was embedded with max_seq_length 64 (its materialization recorded its options)
            old = {**asset.metadata_by_key[asset.key]["dagster_gpu/config"].value, "max_seq_length": 64}
            instance.report_runless_asset_event(dg.AssetMaterialization(
                asset.key, partition=pk, metadata={"corpus/source_version": v[pk],
                                                   **({"embedding/config": dg.MetadataValue.json(old)} if pk == "canceled.txt" else {})},
                tags={"dagster/code_version": "cfg1-0000000000000000" if pk == "canceled.txt" else cv}))
        Path(corpus.url, "done.txt").write_text("a record, edited\n")
        os.utime(Path(corpus.url, "done.txt"), (time.time() + 5, time.time() + 5))
        edited = corpus.file_for_key("done.txt").version

        assert main(["stale", "-m", "cli_test_defs", "-a", "c_embeddings", "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        assert [(s["partition_key"], s["reasons"]) for s in got["stale"]] == [
            ("canceled.txt", [f"fingerprint changed (max_seq_length 64 → null): cfg1-0000000000000000 → {cv}"]),
            ("done.txt", [f"source changed: {v['done.txt']} → {edited}"])]
        assert got["missing"] == ["never.txt"] and got["gone"] == [] and got["in_progress"] == []
        assert main(["stale", "-m", "cli_test_defs", "-a", "c_embeddings"]) == 0
        text = capsys.readouterr().out
        assert "Stale partitions of c_embeddings: 2" in text and "1 missing (never materialized), 0 gone" in text

        # failed.txt deleted: --prune removes its partition and its output, and says so; nothing else goes
        Path(corpus.url, "failed.txt").unlink()
        with pytest.raises(SystemExit) as usage:  # --partitions with --stale: argparse's usage error
            main(["backfill", "-m", "cli_test_defs", "-a", "c_embeddings", "--stale", "--partitions", "x"])
        assert usage.value.code == 2 and "--partitions cannot be combined with --missing/--failed/--stale" in capsys.readouterr().err
        _run(instance, defs, asset, "done.txt", dg.DagsterRunStatus.STARTED)  # in flight: not backfilled again
        _run(instance, defs, asset, "canceled.txt", dg.DagsterRunStatus.STARTED)
        _run(instance, defs, asset, "never.txt", dg.DagsterRunStatus.STARTED)
        assert main(["backfill", "-m", "cli_test_defs", "-a", "c_embeddings", "--prune", "--stale", "--missing"]) == 0
        res = capsys.readouterr()
        lines = res.out.replace("\n ", " ")
        assert "1 partition(s) of deleted files removed: failed.txt" in lines
        assert f"partition 'failed.txt': output {out / 'failed.txt.parquet'} deleted; partition removed" in lines
        assert "no missing and stale partitions of c_embeddings to backfill" in res.err
        assert sorted(p.name for p in out.iterdir()) == ["canceled.txt.parquet", "done.txt.parquet", "running.txt.parquet"]
        assert "failed.txt" not in instance.get_dynamic_partitions("c_embeddings_files")


def test_a_partition_whose_index_rows_cannot_be_deleted_stays_registered_with_its_output(setup, tmp_path):
    from dagster_gpu.index.lance import VectorIndex
    from dagster_gpu.definitions.partitions import prune_partitions

    corpus, asset, _defs, _module = setup
    out = tmp_path / "out" / "c_embeddings"
    out.mkdir(parents=True)
    (out / "never.txt.parquet").write_bytes(b"PAR1")
    (out / "done.txt.parquet").write_bytes(b"PAR1")
    broken = tmp_path / "lance-is-a-file"
    broken.write_text("not a LanceDB directory\n")
    with dg.instance_for_test() as instance:
        register_corpus_files(instance, asset, corpus)
        Path(corpus.url, "never.txt").unlink()
        (p,) = prune_partitions(instance, asset, corpus, delete_outputs=True, indexes=[VectorIndex(str(broken), "t")])
        assert p.partition_key == "never.txt" and p.error.startswith("FileExistsError") and p.outputs == ()
        assert p.describe().startswith("partition 'never.txt': kept: FileExistsError")
        assert "never.txt" in instance.get_dynamic_partitions("c_embeddings_files")
        assert sorted(x.name for x in out.iterdir()) == ["done.txt.parquet", "never.txt.parquet"]
        # the next prune, with an index that works (none yet: 0 rows), removes it and only it
        ok = VectorIndex(str(tmp_path / "lance"), "c_embeddings")
        (p,) = prune_partitions(instance, asset, corpus, delete_outputs=True, indexes=[ok])
        assert (p.error, p.outputs, p.index_rows) == (None, (str(out / "never.txt.parquet"),), ((repr(ok), 0),))
        assert sorted(x.name for x in out.iterdir()) == ["done.txt.parquet"]
        assert "never.txt" not in instance.get_dynamic_partitions("c_embeddings_files")


def test_backfill_accepts_the_index_asset_and_its_stale_partitions(setup, monkeypatch, capsys, tmp_path):
    from dagster_gpu.definitions.vector_index import vector_index_asset
    from dagster_gpu.definitions.partitions import embeddings_followed, stale_index_partitions

    corpus, asset, _defs, module = setup
    index = vector_index_asset(asset, uri=str(tmp_path / "lance"))
    module.defs = dg.Definitions(assets=[asset, index])
    monkeypatch.setitem(sys.modules, "cli_test_defs", module)
    assert embeddings_followed(index, [asset, index]) is asset and embeddings_followed(asset, [asset, index]) is None
    with pytest.raises(NoCorpus, match="follows c_embeddings, which is not an embedding asset"):
        embeddings_followed(index, [index])
    with dg.instance_for_test() as instance:
        # once refused ("has no op tag 'dagster-gpu/corpus-url'"): the index's partitions are the embeddings'
        assert main(["backfill", "-m", "cli_test_defs", "-a", "c_embeddings_index", "--stale"]) == 0
        out = capsys.readouterr()
        assert "5 new partition(s) registered" in out.out
        assert "no stale partitions of c_embeddings_index to backfill" in out.err
        # nothing stale: `stale` says so and suggests no `--stale` backfill
        assert main(["stale", "-m", "cli_test_defs", "-a", "c_embeddings_index"]) == 0
        text = capsys.readouterr().out
        assert "no stale partitions of c_embeddings_index" in text and "--stale" not in text
        for pk in ("done.txt", "failed.txt", "never.txt"):
            instance.report_runless_asset_event(dg.AssetMaterialization(asset.key, partition=pk))
        for pk in ("done.txt", "failed.txt"):
            instance.report_runless_asset_event(dg.AssetMaterialization(index.key, partition=pk))
        instance.report_runless_asset_event(dg.AssetMaterialization(asset.key, partition="failed.txt"))  # embedded again
        # behind its embeddings: failed.txt (embedded after it was indexed) and never.txt (never indexed)
        assert stale_index_partitions(instance, index, asset.key) == ["failed.txt", "never.txt"]
        assert select_partitions(instance, index, stale=True, follows=asset) == ["failed.txt", "never.txt"]
        assert select_partitions(instance, index, missing=True, follows=asset) == [
            "canceled.txt", "never.txt", "running.txt"]
        # `dagster-gpu stale` on the index asset (once refused the same way) says why each is stale
        capsys.readouterr()
        assert main(["stale", "-m", "cli_test_defs", "-a", "c_embeddings_index", "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        assert [(s["partition_key"], s["reasons"]) for s in got["stale"]] == [
            ("failed.txt", ["c_embeddings materialized again after it was indexed"]),
            ("never.txt", ["c_embeddings materialized, never indexed"])]
        assert (got["missing"], got["gone"]) == (["canceled.txt", "running.txt"], [])
        assert main(["stale", "-m", "cli_test_defs", "-a", "c_embeddings_index"]) == 0
        text = capsys.readouterr().out
        assert "Stale partitions of c_embeddings_index: 2" in text
        assert "dagster-gpu backfill -m cli_test_defs -a c_embeddings_index --stale" in text


def test_scattered_keys_are_bridged_into_one_run_when_cheaper(setup):
    from dagster_gpu.definitions.partitions import bridged_selection

    corpus, asset, _defs, _module = setup
    with dg.instance_for_test() as instance:
        register_corpus_files(instance, asset, corpus)
        for f in corpus.list_files():
            instance.report_runless_asset_event(dg.AssetMaterialization(
                asset.key, partition=f.key, metadata={"corpus/source_version": f.version}))
        # canceled.txt and never.txt are apart; done.txt and failed.txt between are materialized files of 9 bytes:
        # redoing them costs 2 × 1.03 s, less than the 15.7 s start-up of a second unit
        assert bridged_selection(instance, asset, ["canceled.txt", "never.txt"], corpus) == [
            "canceled.txt", "done.txt", "failed.txt", "never.txt"]
        # a key in flight between them is not redone: two runs
        _run(instance, _defs, asset, "failed.txt", dg.DagsterRunStatus.STARTED)
        assert bridged_selection(instance, asset, ["canceled.txt", "never.txt"], corpus) == ["canceled.txt", "never.txt"]


@pytest.mark.exclusive  # a wait timed between 2.5 and 6 s
def test_the_runs_a_daemons_sensors_started_are_waited_for_before_it_stops(capsys):
    """The demo's daemon was stopped while the index's automation sensor had a run going: that run failed
    ("Execution was interrupted unexpectedly"). Runs other than the backfill's, started since the daemon was,
    are waited for (one never submitted is not: no daemon starts it), and what still runs then is named."""
    import threading

    from dagster._core.storage.dagster_run import DagsterRun

    from dagster_gpu.commands.backfill import other_work, wait_for_other_work
    from dagster_gpu.commands.progress import drain_other_runs
    from dagster_gpu.commands.common import console as make_console

    with dg.instance_for_test() as instance:
        since = time.time() - 1
        S = dg.DagsterRunStatus
        for run_id, status, backfill in (("mine", S.STARTED, "b1"), ("index", S.STARTED, "b2"),
                                         ("sensor", S.STARTING, None), ("not_started", S.NOT_STARTED, "b2"), ("done", S.SUCCESS, "b2")):
            instance.add_run(DagsterRun(job_name=f"job_{run_id}", run_id=run_id, status=status,
                                        tags={"dagster/backfill": backfill} if backfill else {}))
        assert sorted(r.run_id for r in other_work(instance, since, "b1").running) == ["index", "sensor"]
        assert not other_work(instance, time.time() + 5, "b1")  # started before the daemon: not its
        t0 = time.monotonic()
        threading.Timer(1.0, lambda: instance.report_run_canceled(instance.get_run_by_id("sensor"))).start()
        left = wait_for_other_work(instance, since, "b1", timeout_s=3, poll_s=0.2)
        assert [r.run_id for r in left.running] == ["index"] and 2.5 < time.monotonic() - t0 < 6

        class _Daemon:
            started_at = since
        assert drain_other_runs(instance, _Daemon(), "b1", make_console(), timeout_s=0.5) == 1
        out = capsys.readouterr().out
        assert "Waiting up to 0 s for 1 run(s) the daemon's sensors started meanwhile (job_index;" in out
        assert "1 run(s) still in flight will be interrupted and fail: index" in out


def test_the_runs_waited_for_that_failed_are_reported_with_their_failure(capsys):
    """The index runs the daemon's sensors started while the embeddings ran: one failed on its partitions
    (IndexSchemaError); the command names it, its partitions and why, instead of ending with its normal summary."""
    from dagster._core.execution.plan.objects import StepFailureData, UserFailureData
    from dagster._core.storage.dagster_run import DagsterRun

    from dagster_gpu.commands.backfill import failed_other_runs
    from dagster_gpu.commands.common import console as make_console
    from dagster_gpu.commands.progress import report_failed_other_runs

    with dg.instance_for_test() as instance:
        since = time.time() - 1
        S = dg.DagsterRunStatus
        idx = dg.AssetKey(["c_embeddings_index"])
        for run_id, status, tags in (("mine", S.FAILURE, {"dagster/backfill": "b1"}), ("ok_index", S.SUCCESS, {}),
                                     ("bad_index", S.FAILURE, {"dagster/asset_partition_range_start": "a.txt",
                                                               "dagster/asset_partition_range_end": "c.txt"}),
                                     ("lost", S.FAILURE, {"dagster/partition": "d.txt"})):
            instance.add_run(DagsterRun(job_name="index_job", run_id=run_id, status=status, tags=tags,
                                        asset_selection=frozenset({idx})))
        why = "2 of 3 partition(s) failed\na.txt: IndexSchemaError: column 'package' missing\nb.txt: IndexSchemaError: column 'package' missing"
        instance.report_dagster_event(dg.DagsterEvent(
            event_type_value="STEP_FAILURE", job_name="index_job", step_key="c_embeddings_index",
            event_specific_data=StepFailureData(error=None, user_failure_data=UserFailureData(label="failed", description=why))),
            "bad_index")
        got = failed_other_runs(instance, since, "b1")
        assert [(f.run_id, f.assets, f.partitions) for f in got] == [
            ("bad_index", "c_embeddings_index", "a.txt … c.txt"), ("lost", "c_embeddings_index", "d.txt")]
        assert got[0].error == why and got[1].error == "run failed (no step failure recorded)"
        assert failed_other_runs(instance, time.time() + 5, "b1") == []  # created before the daemon: not its
        assert report_failed_other_runs(instance, since, "b1", make_console()) == 2
        out = capsys.readouterr().out
        assert "2 run(s) the daemon's sensors started meanwhile failed" in out
        assert "run bad_index (c_embeddings_index, partitions a.txt … c.txt): 2 of 3 partition(s) failed" in out
        assert "a.txt: IndexSchemaError: column 'package' missing" in out


def _fake_running_daemon(instance):
    """A fresh BACKFILL heartbeat: the command takes it for a daemon already serving the instance and starts none."""
    from dagster._daemon.types import DaemonHeartbeat

    instance.add_daemon_heartbeat(DaemonHeartbeat(time.time(), "BACKFILL", "fake-daemon", None))


def _when_backfill_stored(instance, then, timeout_s: float = 60.0) -> threading.Thread:
    """Call ``then(backfill)`` from a thread once the command has stored its backfill."""
    def go():
        deadline = time.monotonic() + timeout_s
        while not (bfs := instance.get_backfills()) and time.monotonic() < deadline:
            time.sleep(0.1)
        if bfs:
            then(bfs[0])
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_a_backfill_that_failed_with_an_error_shows_it_and_exits_non_zero(setup, monkeypatch, capsys):
    """A workspace that does not load: the daemon marks the backfill FAILED with the load error stored on it and
    makes no run. Its message (not the stack) comes before the summary, and the exit is 1, even for partitions
    materialized earlier."""
    from dagster._core.execution.backfill import BulkActionStatus
    from dagster._utils.error import SerializableErrorInfo

    from dagster_gpu.commands.backfill import backfill_error

    corpus, asset, defs, module = setup
    monkeypatch.setitem(sys.modules, "cli_test_defs", module)
    msg = ("dagster._core.errors.DagsterAssetBackfillDataLoadError: Asset AssetKey(['c_embeddings']) existed at "
           "storage-time, but no longer does. This could be because it's inside a code location that's failing to "
           "load: ['no_such_module_trial20:defs']\n")
    error = SerializableErrorInfo(msg, ["  File \"x.py\", line 1, in <module>\n"], "DagsterAssetBackfillDataLoadError")
    with dg.instance_for_test() as instance:
        _fake_running_daemon(instance)
        instance.report_runless_asset_event(dg.AssetMaterialization(asset.key, partition="done.txt"))
        t = _when_backfill_stored(instance, lambda bf: instance.update_backfill(
            bf.with_status(BulkActionStatus.FAILED).with_error(error).with_end_timestamp(time.time())))
        assert main(["backfill", "-m", "cli_test_defs", "-a", "c_embeddings", "--bills-wait", "0"]) == 1
        t.join()
        out, err = capsys.readouterr()
        first = "DagsterAssetBackfillDataLoadError: Asset AssetKey(['c_embeddings']) existed at storage-time"
        assert f"failed: {first}" in out.replace("\n", "")
        assert "['no_such_module_trial20:defs']" in out.replace("\n", "")
        assert out.index("DagsterAssetBackfillDataLoadError") < out.index(": failed in 0 run(s)")  # before the summary
        assert "x.py" not in out and "dagster._core.errors" not in out
        assert err.startswith("dagster-gpu backfill: backfill ") and "failed: DagsterAssetBackfillDataLoadError" in err
        [bf] = instance.get_backfills()
        assert backfill_error(instance, bf.backfill_id) == msg.strip().removeprefix("dagster._core.errors.")
        # a cause fills the lines the message leaves
        caused = SerializableErrorInfo("Exception: outer\n", [], "Exception",
                                       cause=SerializableErrorInfo("builtins.ValueError: inner\n", [], "ValueError"))
        instance.update_backfill(bf.with_error(caused))
        assert backfill_error(instance, bf.backfill_id) == "Exception: outer\nValueError: inner"
        assert backfill_error(instance, bf.backfill_id, lines=1) == "Exception: outer"


def _queued_run(instance, run_id: str) -> None:
    """A run of asset c_index in the run queue, as a sensor's request leaves it."""
    from dagster._core.remote_origin import GrpcServerCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.storage.dagster_run import DagsterRun

    origin = RemoteJobOrigin(RemoteRepositoryOrigin(GrpcServerCodeLocationOrigin(host="localhost", port=1, location_name="x"), "__repository__"),
                             "index_job")
    instance.add_run(DagsterRun(job_name="index_job", run_id=run_id, status=dg.DagsterRunStatus.QUEUED,
                                remote_job_origin=origin, asset_selection=frozenset({dg.AssetKey("c_index")})))


def test_runs_queued_and_backfills_requested_by_the_daemons_sensors_are_waited_for_then_named(setup, capsys):
    """The index's automation sensor had queued runs and requested a backfill when the command stopped its daemon:
    they stayed QUEUED / REQUESTED and nothing was said. While the daemon runs they are waited for (its run queue
    and backfill loop start them); what is still queued or requested at the end is named with how to finish it."""
    from dagster._core.execution.backfill import BulkActionStatus

    from dagster_gpu.commands.backfill import other_work, submit_asset_backfill
    from dagster_gpu.commands.common import console as make_console
    from dagster_gpu.commands.progress import drain_other_runs

    _corpus, asset, defs, _module = setup
    with dg.instance_for_test() as instance:
        since = time.time() - 1
        instance.add_dynamic_partitions("c_embeddings_files", ["done.txt", "never.txt"])
        mine = submit_asset_backfill(instance, defs, asset.key, ["done.txt"])
        auto = submit_asset_backfill(instance, defs, asset.key, ["never.txt"], title="automation")
        _queued_run(instance, "queued")
        work = other_work(instance, since, mine)
        assert [r.run_id for r in work.queued] == ["queued"] and not work.running
        assert [b.backfill_id for b in work.requested] == [auto]

        class _Daemon:
            started_at = since
            dead: str | None = None

            def why_dead(self):
                return self.dead

        daemon = _Daemon()
        # the daemon's run queue starts the run and its backfill loop ends the backfill: the wait ends early
        def run_them():
            instance.report_run_canceled(instance.get_run_by_id("queued"))
            instance.update_backfill(instance.get_backfill(auto).with_status(BulkActionStatus.COMPLETED_SUCCESS))
        threading.Timer(1.0, run_them).start()
        t0 = time.monotonic()
        assert drain_other_runs(instance, daemon, mine, make_console(), timeout_s=30) == 0
        assert time.monotonic() - t0 < 10
        out = capsys.readouterr().out.replace("\n", "")
        assert "Waiting up to 30 s for 1 run(s) and 1 backfill(s) the daemon's sensors started meanwhile" in out
        assert "stay for the next" not in out
        # still queued when the wait ends (or the daemon died): one line naming them and how to finish them
        _queued_run(instance, "queued2")
        auto2 = submit_asset_backfill(instance, defs, asset.key, ["never.txt"])
        daemon.dead = "gone"
        t0 = time.monotonic()
        assert drain_other_runs(instance, daemon, mine, make_console(), timeout_s=30, code_location="-m my.defs") == 0
        assert time.monotonic() - t0 < 10  # a dead daemon runs nothing: no wait
        out = capsys.readouterr().out.replace("\n", "")
        assert (f"1 run(s) queued (queued2) and 1 backfill(s) requested ({auto2}) by the daemon's sensors meanwhile "
                "stay for the next dagster-daemon on this instance (`dagster dev` or `dagster-daemon run`); to run "
                "them now: dagster-gpu backfill -m my.defs -a c_embeddings --stale; dagster-gpu backfill -m my.defs "
                "-a c_index --stale") in out


def test_partitions_whose_file_is_gone_are_left_out_and_said(setup, monkeypatch, capsys):
    """A deleted corpus file's partition stays registered until --prune; a backfill without a filter selected
    it (its unit failing on the missing file) and said nothing. It is left out, with one line naming it."""
    from dagster._core.execution.backfill import BulkActionStatus

    corpus, asset, defs, module = setup
    monkeypatch.setitem(sys.modules, "cli_test_defs", module)
    with dg.instance_for_test() as instance:
        _fake_running_daemon(instance)
        register_corpus_files(instance, asset, corpus)
        for name in ("failed.txt", "never.txt"):
            (Path(corpus.url) / name).unlink()
        t = _when_backfill_stored(instance, lambda bf: instance.update_backfill(
            bf.with_status(BulkActionStatus.CANCELED).with_end_timestamp(time.time())))
        main(["backfill", "-m", "cli_test_defs", "-a", "c_embeddings", "--bills-wait", "0"])
        t.join()
        out = capsys.readouterr().out.replace("\n", "")
        assert ("2 registered partition(s) whose corpus file is gone left out: failed.txt, never.txt; --prune deletes "
                "them (with their outputs and index rows)") in out
        [bf] = instance.get_backfills()
        assert sorted(bf.asset_backfill_data.target_subset.get_partitions_subset(asset.key).get_partition_keys()) == [
            "canceled.txt", "done.txt", "running.txt"]
        assert "3 partitions of c_embeddings" in out


def test_without_a_terminal_progress_is_plain_lines_on_change_and_every_30_s():
    """rich's bar shows nothing until the end when stdout is a file (a demo's log was silent for 6.5 minutes):
    there, a plain line when the done count changes (at most one per 5 s) and every 30 s while nothing does."""
    import io

    from dagster_gpu.commands.backfill import BackfillProgress
    from dagster_gpu.commands.progress import BackfillFollower

    buf = io.StringIO()
    console = Console(file=buf, width=160)
    assert not console.is_terminal
    now = [100.0]
    follow = BackfillFollower(console, total=43, clock=lambda: now[0])
    P = BackfillProgress

    def at(t: float, p: BackfillProgress) -> None:
        now[0] = 100.0 + t
        follow(p)

    with follow:
        at(0, P(total=43, running=4, runs=2, runs_in_flight=2))                # first call: a line
        at(10, P(total=43, running=4, runs=2, runs_in_flight=2))               # nothing changed
        at(31, P(total=43, running=4, runs=2, runs_in_flight=2))               # 31 s since the last: a line
        at(33, P(total=43, succeeded=1, running=3, runs=2, runs_in_flight=2))  # changed, but 2 s after the last
        at(36, P(total=43, succeeded=2, running=2, runs=2, runs_in_flight=2))  # changed, 5 s after: a line
        at(190, P(total=43, succeeded=11, failed=1, running=4, runs=4, runs_in_flight=2))
        at(191, P(total=43, succeeded=42, failed=1, runs=5, status="COMPLETED_FAILED"))  # 1 s after: at the end
    lines = buf.getvalue().splitlines()
    buf.seek(0)
    buf.truncate()
    with BackfillFollower(console, total=2, clock=lambda: now[0]) as follow:
        follow(P(total=2, succeeded=2))
        follow(P(total=2, succeeded=2, status="COMPLETED_SUCCESS"))  # only the status changed: said at the end
    assert buf.getvalue().splitlines()[-1].endswith("[completed_success]")
    assert lines == [
        "backfill: 0/43 partitions done, 0 failed, 2 run(s) going, 0:00 elapsed [requested]",
        "backfill: 0/43 partitions done, 0 failed, 2 run(s) going, 0:31 elapsed [requested]",
        "backfill: 2/43 partitions done, 0 failed, 2 run(s) going, 0:36 elapsed [requested]",
        "backfill: 12/43 partitions done, 1 failed, 2 run(s) going, 3:10 elapsed [requested]",
        "backfill: 43/43 partitions done, 1 failed, 0 run(s) going, 3:11 elapsed [completed_failed]",
    ]


def test_a_workspace_whose_code_location_does_not_load_is_one_line_before_anything_is_stored(
        setup, tmp_path, monkeypatch, capfd):
    """A workspace naming a module that does not exist: the daemon started, the backfill was stored and failed,
    and the summary said "not materialized / no run recorded" for every partition. Now the workspace is loaded
    first, as the daemon would: one line naming the file and the location's load error, exit 2, nothing stored."""
    corpus, asset, defs, module = setup
    monkeypatch.setitem(sys.modules, "cli_test_defs", module)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "workspace.yaml").write_text("load_from:\n  - python_module: no_such_module_trial20\n")
    with dg.instance_for_test() as instance:
        t0 = time.monotonic()
        assert main(["backfill", "-m", "cli_test_defs", "-a", "c_embeddings"]) == 2
        assert time.monotonic() - t0 < 60
        out, err = capfd.readouterr()  # the code servers' too: their log, the import's traceback
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert "code_server" not in out and "Traceback" not in out, out
        assert err.startswith("dagster-gpu backfill: workspace file workspace.yaml does not load: code location "
                              "'no_such_module_trial20': DagsterImportError: ") and "no_such_module_trial20" in err
        assert instance.get_backfills() == []
        assert instance.get_dynamic_partitions("c_embeddings_files") == []  # not even the corpus files registered
        assert instance.get_daemon_heartbeats() == {}  # no daemon started


@pytest.mark.exclusive  # under CPU contention the automation sensor's request can land as the daemon stops (two-worker run)
@pytest.mark.e2e
def test_the_index_backfill_its_daemons_automation_requested_is_run_before_the_daemon_stops(tmp_path, monkeypatch):
    """The real dagster-daemon on a SQLite instance, its output to a file (not a terminal), no daemon running before:
    the index's automation sensor requests a backfill of the index after the embeddings; the command waits for it
    (it used to stop the daemon and leave it REQUESTED; one the sensor had not requested yet is its next tick's),
    and the log shows plain progress lines. ``--max-concurrent-runs 1`` overrides the file's limit of 2 for that
    daemon: no two runs were in progress at once, and dagster.yaml is left as it was."""
    import os
    import subprocess

    from dagster._core.execution.backfill import BulkActionStatus

    from tests.conftest import REPO

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in (1, 2, 3):
        (corpus / f"f{i}.txt").write_text(f"record one of {i}\n%\nrecord two of {i}\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        "run_coordinator:\n  module: dagster.core.run_coordinator\n  class: QueuedRunCoordinator\n  config:\n"
        "    max_concurrent_runs: 2\n    dequeue_interval_seconds: 1\ntelemetry:\n  enabled: false\n")
    ws = tmp_path / "ws.yaml"
    ws.write_text(f"load_from:\n  - python_file:\n      relative_path: {REPO / 'tests' / 'locations' / 'sensor_location.py'}\n"
                  f"      working_directory: {REPO}\n      location_name: sensors\n")
    env = {**os.environ, "DAGSTER_HOME": str(home), "DAGSTER_GPU_SD_DIR": str(tmp_path), "DAGSTER_GPU_SD_INTERVAL": "5",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("DAGSTER_GPU_SD_MAX_DELAY", None)
    with open(tmp_path / "log", "w") as log:
        cp = subprocess.run([sys.executable, "-m", "dagster_gpu.commands.main", "backfill", "-m",
                             "tests.locations.sensor_location", "-a", "sd_embeddings", "-w", str(ws), "--bills-wait", "0",
                             "--runs-wait", "300", "--max-concurrent-runs", "1"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path, timeout=600)
    out = (tmp_path / "log").read_text()
    assert cp.returncode == 0, out
    assert "backfill: 0/3 partitions done, 0 failed" in out
    assert "backfill: 3/3 partitions done, 0 failed" in out and "[completed_success]" in out
    assert "stay for the next dagster-daemon" not in out and "will be interrupted" not in out
    assert "runs at most 1 runs at once (--max-concurrent-runs)" in out
    assert "max_concurrent_runs: 2\n" in (home / "dagster.yaml").read_text()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.get() as instance:
        spans = sorted((r.start_time, r.end_time) for r in instance.get_run_records())
        assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:])), spans
        # nothing stranded: no backfill left requested, no run left queued or cut off
        assert {b.status for b in instance.get_backfills()} == {BulkActionStatus.COMPLETED_SUCCESS}
        assert {r.status for r in instance.get_runs()} == {dg.DagsterRunStatus.SUCCESS}
        # the command returned with the index current: each partition loaded after its embeddings
        ix = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey("sd_embeddings_index")),
                                             limit=10)
        assert sorted(r.partition_key for r in ix.records) == ["f1.txt", "f2.txt", "f3.txt"]
    assert "is behind its embeddings" not in out

    # a file changed, `backfill --stale` with no daemon running: it returns only once the index loaded it again
    # (the command's daemon used to stop before the automation requested anything, and search served the old rows)
    (corpus / "f1.txt").write_text("record one of 1, changed\n%\nrecord two of 1\n")
    with open(tmp_path / "log2", "w") as log:
        cp = subprocess.run([sys.executable, "-m", "dagster_gpu.commands.main", "backfill", "-m",
                             "tests.locations.sensor_location", "-a", "sd_embeddings", "-w", str(ws), "--bills-wait", "0",
                             "--runs-wait", "300", "--stale"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
                            timeout=600)
    out = (tmp_path / "log2").read_text()
    assert cp.returncode == 0, out
    assert "backfill: 1/1 partitions done, 0 failed" in out and "is behind its embeddings" not in out, out
    from dagster_gpu.commands.index_wait import index_lag
    from tests.locations import sensor_location

    with dg.DagsterInstance.get() as instance:
        assert index_lag(instance, sensor_location.sd_index, sensor_location.sd_embeddings.key, ["f1.txt"]).current
        last = instance.get_latest_materialization_event(dg.AssetKey("sd_embeddings_index"))
        assert last.asset_materialization.partition == "f1.txt"


def test_max_concurrent_runs_is_refused_under_one_and_beside_a_running_daemon(setup, monkeypatch, capsys):
    """The limit applies to the daemon the command starts; one already running keeps its dagster.yaml's."""
    from dagster._daemon.types import DaemonHeartbeat

    corpus, asset, defs, module = setup
    monkeypatch.setitem(sys.modules, "cli_test_defs", module)
    with pytest.raises(SystemExit) as e:
        main(["backfill", "-m", "cli_test_defs", "-a", "c_embeddings", "--max-concurrent-runs", "0"])
    assert e.value.code == 2
    assert "--max-concurrent-runs must be at least 1, got 0" in capsys.readouterr().err
    with dg.instance_for_test() as instance:
        instance.add_daemon_heartbeat(DaemonHeartbeat(time.time(), "BACKFILL", "d-1", None))
        assert main(["backfill", "-m", "cli_test_defs", "-a", "c_embeddings", "--max-concurrent-runs", "2"]) == 2
        err = capsys.readouterr().err
        assert "one already runs on this instance (id d-1)" in err
        assert f"run_coordinator.config (or concurrency.runs) in {instance.root_directory}/dagster.yaml" in err
        assert instance.get_dynamic_partitions("c_embeddings_files") == []  # refused before anything is stored


def test_embedding_spec_columns_are_checked_against_the_corpus_at_definition_and_before_any_unit(tmp_path, monkeypatch,
                                                                                                  capsys):
    """``EmbeddingSpec(id_column=…, carry_columns=…)`` (not the corpus's TextFormat): a pattern or format read as text
    is refused by ``embedding_asset`` naming the option; with a pattern that matches both (``*``, format ``auto``),
    ``backfill`` names the text files in one line before anything is registered or started."""
    from dagster_gpu import EmbeddingSpec

    d = tmp_path / "corpus"
    d.mkdir()
    (d / "b.jsonl").write_text('{"text": "a", "id": "1", "section": "s"}\n')
    (d / "a.txt").write_text("plain text\n")
    spec = EmbeddingSpec(id_column="id", carry_columns=("section",))
    for corpus, why in ((CorpusSource(url=str(d), pattern="*.txt"), "pattern '*.txt' matches text files"),
                        (CorpusSource(url=str(d), text_format=TextFormat(format="text")), "format 'text' has no columns")):
        with pytest.raises(ValueError) as e:
            embedding_asset(name="s_embeddings", corpus=corpus, spec=spec, output=str(tmp_path / "out"))
        assert str(e.value).startswith(f"embedding_asset 's_embeddings': EmbeddingSpec(id_column='id', carry_columns="
                                       f"('section',)) on corpus {d}"), str(e.value)
        assert why in str(e.value) and str(e.value).endswith("or leave id_column / carry_columns out")
    corpus = CorpusSource(url=str(d), text_format=TextFormat(format="auto"))
    asset = embedding_asset(name="s_embeddings", corpus=corpus, spec=spec, output=str(tmp_path / "out"))
    assert corpus_of(asset, None).text_format.id_column == "id"
    module = types.ModuleType("cli_spec_defs")
    module.defs, module.corpus = dg.Definitions(assets=[asset]), corpus
    monkeypatch.setitem(sys.modules, "cli_spec_defs", module)
    with dg.instance_for_test() as instance:
        assert main(["backfill", "-m", "cli_spec_defs", "-a", "s_embeddings"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"dagster-gpu backfill: 1 of 2 files of corpus {d} (pattern '*') are read as text, which "
                              f"has no columns: id_column / carry_columns need parquet or JSON Lines files"), err
        assert err.rstrip().endswith(": a.txt")
        assert instance.get_dynamic_partitions("s_embeddings_files") == [] and not instance.get_backfills()
