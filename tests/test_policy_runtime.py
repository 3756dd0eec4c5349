"""Expected runtime from history, the fallback, the Dagster read-out, the snapshot JSON and after_submit."""

import pytest

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.policy import DeviceGroup, KubernetesState, SlurmState, Snapshot, after_submit
from dagster_gpu.instance.history import point_from_metadata, points_from_metadata
from dagster_gpu.policy.runtime import (
    FALLBACK_BYTES_PER_ROW, FALLBACK_CPU_TEXTS_PER_SECOND, FALLBACK_ROWS, FALLBACK_TEXTS_PER_SECOND, HistoryPoint,
    RuntimeModel, StepSize,
)

A100 = "NVIDIA A100-SXM4-80GB"


def test_fallback_without_history():
    m = RuntimeModel.from_history([])
    assert m.n_history == 0 and "fallback" in m.source
    # 2,000,000 bytes / 200 bytes per row = 10,000 rows / 2,000 texts/s = 5 s
    assert FALLBACK_TEXTS_PER_SECOND == 2000.0 and FALLBACK_BYTES_PER_ROW == 200.0
    assert m.runtime_s(StepSize(bytes=2_000_000)) == pytest.approx(5.0)


def test_fallback_on_cpu_is_the_measured_cpu_figure_and_says_so():
    m = RuntimeModel.from_history([])
    # docs/benchmarks.md "Throughput against SentenceTransformer.encode on CPU": 46.3 texts/s, not the GPU figure ÷ 20 (100 texts/s)
    assert FALLBACK_CPU_TEXTS_PER_SECOND == 46.3 and m.cpu_rate() == 46.3
    assert m.cpu_runtime_s(StepSize(rows=463)) == pytest.approx(10.0)
    assert m.cpu_runtime_s(StepSize(rows=463), slowdown=20.0) == pytest.approx(10.0)  # a host's slowdown: GPU history only
    on_cpu = m.describe(gpu=False, cpu=True)
    assert on_cpu == ("fallback (no history): CPU 46.3 texts/s (measured: all-MiniLM-L6-v2 on 2 shared CPU cores, "
                      "docs/benchmarks.md), 200 bytes/row")
    assert "CPU" not in m.describe(gpu=True, cpu=False) and "GPU 2000 texts/s (stated" in m.describe(gpu=True, cpu=False)
    assert "GPU 2000" in m.source and "CPU 46.3" in m.source  # both devices when none is named
    # GPU history without CPU history: the GPU figure ÷ the slowdown, as before
    g = RuntimeModel.from_history([HistoryPoint(1000, 1000.0)])
    assert g.fallback_cpu_texts_per_second is None and g.cpu_rate(slowdown=10.0) == 100.0


def test_unknown_size_uses_typical_rows():
    # a GPU asset that reads no corpus file: 10,000 fallback rows / 2,000 texts/s = 5 s without history
    assert FALLBACK_ROWS == 10000.0 and RuntimeModel.from_history([]).runtime_s(StepSize()) == pytest.approx(5.0)
    m = RuntimeModel.from_history([HistoryPoint(rows=r, texts_per_second=100.0) for r in (300, 100, 900)])
    assert m.typical_rows == 300.0 and m.runtime_s(StepSize()) == pytest.approx(3.0)  # median rows / median rate


def test_medians_scaled_by_partition_size():
    hist = [
        HistoryPoint(rows=10_000, texts_per_second=1000.0, bytes=1_000_000, product=A100, utilization_percent=20),
        HistoryPoint(rows=20_000, texts_per_second=3000.0, bytes=4_000_000, product=A100, utilization_percent=40),
        HistoryPoint(rows=5_000, texts_per_second=2000.0, bytes=1_000_000, product=A100, utilization_percent=30),
        HistoryPoint(rows=0, texts_per_second=9e9),  # ignored: no rows
    ]
    m = RuntimeModel.from_history(hist)
    assert m.n_history == 3 and m.texts_per_second == 2000.0 and m.gpu_busy == pytest.approx(0.3)
    assert m.rows_per_byte == pytest.approx(0.005)  # median of 0.01, 0.005, 0.005
    assert m.runtime_s(StepSize(bytes=8_000_000)) == pytest.approx(8_000_000 * 0.005 / 2000)  # 20 s
    assert m.runtime_s(StepSize(rows=4000, bytes=1)) == pytest.approx(2.0)  # known rows win
    # a 1g slice (1/7 = 0.143) with u = 0.3 runs at 0.476 speed; a 3g slice (0.43) at full speed
    assert m.speed(1 / 7) == pytest.approx((1 / 7) / 0.3) and m.speed(3 / 7) == 1.0


def test_cpu_history_and_slowdown():
    m = RuntimeModel.from_history([HistoryPoint(1000, 1000.0)], cpu_slowdown=10.0)
    assert m.cpu_runtime_s(StepSize(rows=1000)) == pytest.approx(10.0)
    m2 = RuntimeModel.from_history([HistoryPoint(1000, 1000.0), HistoryPoint(1000, 50.0, product="cpu")])
    assert m2.texts_per_second == 1000.0 and m2.cpu_runtime_s(StepSize(rows=1000)) == pytest.approx(20.0)


def test_history_points_from_metadata_plain_and_dagster_values():
    from dagster import MetadataValue

    md = {"embedding/rows": MetadataValue.int(1200), "embedding/texts_per_second": MetadataValue.float(600.0),
          "corpus/bytes": MetadataValue.int(240_000), "gpu/product_name": MetadataValue.text(A100),
          "gpu/utilization_mean_percent": MetadataValue.float(35.0)}
    p = point_from_metadata(md)
    assert p == HistoryPoint(1200, 600.0, 240_000, A100, 35.0)
    assert points_from_metadata([md, {"embedding/rows": 5}]) == [p]


def test_fetch_history_from_a_real_instance():
    from dagster import AssetKey, AssetMaterialization, DagsterInstance

    from dagster_gpu.instance.history import fetch_history, runtime_model

    with DagsterInstance.ephemeral() as inst:
        for i, tps in enumerate((100.0, 300.0, 200.0)):
            inst.report_runless_asset_event(AssetMaterialization(
                AssetKey("embeddings"), partition=f"p{i}",
                metadata={"embedding/rows": 1000 * (i + 1), "embedding/texts_per_second": tps,
                          "corpus/bytes": 100_000 * (i + 1)}))
        pts = fetch_history(inst, "embeddings")
        assert sorted(p.texts_per_second for p in pts) == [100.0, 200.0, 300.0]
        m = runtime_model(inst, AssetKey("embeddings"))
        assert m.texts_per_second == 200.0 and m.rows_per_byte == pytest.approx(0.01) and m.n_history == 3
        assert runtime_model(inst, "other").n_history == 0


def test_snapshot_json_round_trip():
    sn = Snapshot(
        rate_card=RateCard.load(),
        slurm=SlurmState(pools=(DeviceGroup(A100, A100, 80, 2, 10, 1, 30.0),), array_throttle=4, running_tasks=1),
        kubernetes=KubernetesState(reachable=False, reason="timeout"),
    )
    back = Snapshot.loads(__import__("json").dumps(sn.to_json()))
    assert back.slurm == sn.slurm and back.kubernetes == sn.kubernetes and back.local is None
    assert back.rate_card.rate("kubernetes", "mig-1g.10gb", A100) == pytest.approx(2.4 / 7)


def test_after_submit_consumes_free_then_queues():
    sn = Snapshot(rate_card=RateCard.load(), slurm=SlurmState(pools=(DeviceGroup(A100, A100, 80, 1, 2, 0, 0.0),),
                                                              array_throttle=5))
    s1 = after_submit(sn, "slurm", A100, A100)
    assert s1.slurm.pools[0].free == 0 and s1.slurm.pools[0].pending == 0 and s1.slurm.running_tasks == 1
    s2 = after_submit(s1, "slurm", A100, A100)
    assert s2.slurm.pools[0].pending == 1 and s2.slurm.pools[0].start_estimate_s is None
    assert s2.slurm.running_tasks == 1


def test_history_learns_only_from_full_embeds():
    """A materialization that reused rows teaches nothing: a fully reused file reached the model with no text
    (it recorded 2,702 texts/s once), a partly reused one with a biased sample (the changed records and the
    long rows reuse always embeds again) behind reading and hashing the whole file: a newcomer's re-run with 118
    of 120 rows reused per file taught 22.4 texts/s where full embeds had taught 37.4."""
    fresh = {"embedding/rows": 1000, "embedding/texts_per_second": 100.0, "embedding/seconds": 10.0,
             "embedding/reused_rows": 0, "corpus/bytes": 100_000}
    older = {"embedding/rows": 500, "embedding/texts_per_second": 80.0, "corpus/bytes": 50_000}  # before reuse
    reused = {"embedding/rows": 1000, "embedding/texts_per_second": 2702.0, "embedding/seconds": 0.37,
              "embedding/reused_rows": 1000, "corpus/bytes": 100_000}
    partly = {"embedding/rows": 120, "embedding/texts_per_second": 8.0, "embedding/seconds": 0.25,
              "embedding/reused_rows": 118, "corpus/bytes": 12_000}
    pts = points_from_metadata([fresh, older, reused, partly])
    assert [p.texts_per_second for p in pts] == [100.0, 80.0]
    m = RuntimeModel.from_history(pts)
    assert m.n_history == 2 and m.texts_per_second == pytest.approx(90.0)  # median of 100 and 80
    assert m.rows_per_byte == pytest.approx(0.01)


def test_cpu_only_history_does_not_name_the_gpu_fallback_for_a_cpu_plan():
    m = RuntimeModel.from_history([HistoryPoint(1000, 50.0, product="cpu")])
    # a CPU-only host's plan: only the learned CPU figure, no "GPU 2000 texts/s (fallback)"
    assert m.describe(gpu=False, cpu=True) == "history of 1 materialization(s): CPU median 50.0 texts/s (1 on the CPU); 200 bytes/row"
    # a plan that places on a GPU still says where its GPU figure comes from
    assert "GPU 2000 texts/s (fallback: no GPU history)" in m.describe(gpu=True, cpu=True)
