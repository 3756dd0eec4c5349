"""``whatif``'s runtime estimate against a measured run on this host: real materializations of the real asset
(in process, on the CPU) teach the runtime model; the model's estimate of partitions it has not seen is then
compared with their measured embedding seconds. The model needs each materialization's corpus bytes (recorded
as ``corpus/bytes``), and a throughput measured on the CPU is the CPU's: no CPU slowdown applied on top of
it, and no GPU priced at it."""

from __future__ import annotations

import json

import dagster as dg
import pytest
from dagster._core.instance_for_test import instance_for_test

from dagster_gpu import CorpusSource, TextFormat, embedding_asset
from dagster_gpu.commands.whatif import whatif_main
from dagster_gpu.instance.history import runtime_model
from dagster_gpu.policy.runtime import FALLBACK_TEXTS_PER_SECOND, StepSize
from tests.conftest import fortune_records

pytestmark = pytest.mark.exclusive  # the estimate is checked against runs timed here: no other test runs meanwhile (tests/host_locks.py)

#: partition -> records (one fortune file, "people", cut in five, so every partition has texts of the same kind)
SIZES = {"h1": 150, "h2": 200, "h3": 250, "new1": 200, "new2": 300}


def test_estimate_within_2x_of_a_measured_cpu_run(tmp_path, capsys):
    records = fortune_records("people", sum(SIZES.values()))
    assert len(records) == sum(SIZES.values())
    d = tmp_path / "corpus"
    d.mkdir()
    at = 0
    for name, n in SIZES.items():
        (d / name).write_text("".join(r.rstrip("\n") + "\n%\n" for r in records[at:at + n]))
        at += n
    corpus = CorpusSource(url=str(d), text_format=TextFormat(format="text", record_separator_line="%"))
    asset = embedding_asset(name="est", corpus=corpus, output_url=str(tmp_path / "out"), device="cpu")
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("est_files", list(SIZES))

        def materialize(pk: str) -> dict:
            assert dg.materialize([asset], instance=instance, partition_key=pk).success
            rec = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=asset.key, asset_partitions=[pk]), limit=1).records[0]
            return {k: v.value for k, v in rec.asset_materialization.metadata.items()}

        history = {pk: materialize(pk) for pk in ("h1", "h2", "h3")}
        for pk, md in history.items():
            assert md["corpus/bytes"] == (d / pk).stat().st_size  # what the model scales rows by
            assert md["billing/device_type"] == "cpu"
            assert md["embedding/config"] == asset.metadata_by_key[asset.key]["dagster_gpu/config"].value  # for stale
        model = runtime_model(instance, asset.key)
        assert model.n_history == 3 and model.n_gpu_history == 0
        measured_tps = sorted(md["embedding/texts_per_second"] for md in history.values())[1]
        # the CPU's own figure, as measured (the model takes rows ÷ embedding/seconds; both figures keep 4 digits)
        assert model.cpu_texts_per_second == pytest.approx(measured_tps, rel=1e-3)
        assert model.texts_per_second == FALLBACK_TEXTS_PER_SECOND  # a GPU is not priced at the CPU's speed
        sizes = {pk: (d / pk).stat().st_size for pk in ("new1", "new2")}
        estimate = {pk: model.cpu_runtime_s(StepSize(bytes=b), slowdown=20.0) for pk, b in sizes.items()}
        measured = {pk: materialize(pk)["embedding/seconds"] for pk in sizes}
        for pk in sizes:
            ratio = estimate[pk] / measured[pk]
            assert 0.5 <= ratio <= 2.0, (pk, estimate[pk], measured[pk])
        # the same model through whatif (live local state of this CPU host, one unit per partition): the CPU
        # alternative's runtime is the unit's start-up + the partition's overhead + the model's CPU work, no ×20
        from dagster_gpu.commands.whatif import live_snapshot

        local = live_snapshot({}).local
        model = runtime_model(instance, asset.key)  # now 5 materializations
        assert whatif_main([str(d), "--asset", "est", "--json", "--per-run", "1"]) == 0
        doc = json.loads(capsys.readouterr().out)
        # a CPU-only host plans no GPU: its runtime source names no GPU fallback figure ("GPU 2000 texts/s")
        assert "CPU median" in doc["runtime_model"] and "GPU" not in doc["runtime_model"]
        chosen = {r["partition"]: r["placement"] for r in doc["plans"]["auto"]}
        alt = next(a for a in chosen["new2"]["alternatives"] if a["device"] == "cpu")
        size = StepSize(bytes=sizes["new2"])
        assert alt["runtime_s"] == pytest.approx(
            local.billed_overhead_s + model.partition_overhead_s(size) + model.cpu_runtime_s(size), rel=1e-6)
        assert model.cpu_runtime_s(size) / measured["new2"] < 2.0
