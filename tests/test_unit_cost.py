"""What one work unit costs, learned from the asset's finished units (partitions/unit_cost.py over
instance/history.fetch_unit_samples): only whole units, on the same kind of device, that reused nothing; the
packaged calibration before there is any."""

from __future__ import annotations

import dagster as dg
import pytest

from dagster_gpu import CorpusSource, GpuRequest, TextFormat, embedding_asset
from dagster_gpu.partitions.unit_cost import calibration_seconds, unit_cost
from dagster_gpu.instance.history import fetch_unit_samples
from dagster_gpu.policy.batching import UnitSample


def _mat(key: dg.AssetKey, partition: str, unit: str, of: int, *, wall: float, emb: float, device: str = "cpu",
         reused: int = 0) -> dg.AssetMaterialization:
    # the keys a work unit writes (worker/unit.py, worker/metadata.py), with a CPU unit's figures
    return dg.AssetMaterialization(asset_key=key, partition=partition, metadata={
        "local/unit": unit, "dagster_gpu/unit_partitions": of, "billing/device_type": device,
        "billing/wall_seconds": wall, "embedding/seconds": emb, "corpus/bytes": 700, "embedding/rows": 5,
        "embedding/texts_per_second": 50.0, "embedding/reused_rows": reused})


def test_units_are_learned_whole_on_the_same_device_and_the_cost_follows(tmp_path):
    corpus = CorpusSource(url=str(tmp_path), text_format=TextFormat(format="text"))
    asset = embedding_asset(name="u_embeddings", corpus=corpus, output_url=str(tmp_path / "out"), device="cpu",
                            gpu=GpuRequest(count=1))
    key = asset.key
    with dg.instance_for_test() as instance:
        assert fetch_unit_samples(instance, key, cpu=True) == []
        assert (unit_cost(instance, asset).startup_s, unit_cost(instance, asset).per_partition_s) == calibration_seconds()
        events = [
            _mat(key, "a", "u1", 2, wall=3.0, emb=0.5), _mat(key, "b", "u1", 2, wall=2.0, emb=0.5),  # whole: 4 s beyond
            _mat(key, "c", "u2", 3, wall=9.0, emb=0.5), _mat(key, "d", "u2", 3, wall=1.0, emb=0.5),  # 2 of 3: left out
            _mat(key, "e", "u3", 1, wall=1.0, emb=0.9, device="nvidia-h100-80gb"),                  # on a GPU
            _mat(key, "f", "u4", 1, wall=8.0, emb=0.1, reused=3),                                    # reused rows
        ]
        for ev in events:
            instance.report_runless_asset_event(ev)
        assert fetch_unit_samples(instance, key, cpu=True) == [UnitSample(2, 5.0, 1.0, 1400)]
        assert fetch_unit_samples(instance, key, cpu=False) == [UnitSample(1, 1.0, 0.9, 700)]
        cost = unit_cost(instance, asset)  # the history ran on the CPU: the CPU's units
        assert cost.startup_s == pytest.approx(4.0)
        # per partition: (1.0 s useful - 1400 bytes x seconds per byte) / 2
        assert cost.per_partition_s == pytest.approx((1.0 - cost.seconds_per_byte * 1400) / 2)
        assert "median of the last 1 unit(s) of this asset on the CPU" in cost.source
