"""``dagster-gpu whatif`` prints each plan's expected preemption cost, with the rate learned from the instance."""

import json

import dagster as dg
import pytest

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.commands.whatif import whatif_main
from dagster_gpu.policy import DeviceGroup, KubernetesState, SlurmState, Snapshot
from tests.preemption_events import record_preempted_steps

A100 = "NVIDIA A100-SXM4-80GB"


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(3):
        (d / f"day{i}.jsonl").write_bytes(b"x" * (200_000 * (i + 1)))  # 1k, 2k, 3k rows at 200 B/row
    return d


@pytest.fixture
def snapfile(tmp_path):
    sn = Snapshot(
        rate_card=RateCard.load(),
        slurm=SlurmState(pools=(DeviceGroup(A100, A100, 80, 1, 1),), launch_latency_s=5, billed_overhead_s=20,
                         preemptions_per_gpu_hour=0.2, preemption_pool="slurm:gpu/low"),
        kubernetes=KubernetesState(pools=(DeviceGroup(A100, A100, 80, 2, 2),), launch_latency_s=10,
                                   billed_overhead_s=30),
    )
    p = tmp_path / "snap.json"
    p.write_text(json.dumps(sn.to_json()))
    return p


def _expected_usd(rate: float, lost_s: float) -> float:
    # one unit of the three partitions on Slurm: 0.5 + 1 + 1.5 s of work at the fallback 2,000 texts/s, 20 s
    # start-up: 23 s = 23/3600 GPU-h; each preemption costs the start-up + lost_s, at 1.20 USD per GPU-hour
    return 1.2 * rate * 23 / 3600 * (20 + lost_s) / 3600


def test_whatif_prints_the_prior_preemption_cost_without_an_instance(corpus, snapfile, capsys, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    assert whatif_main([str(corpus), "--snapshot", str(snapfile), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["preemption"] == {"slurm": {"pool": "slurm:gpu/low", "preemptions_per_gpu_hour": 0.2,
                                           "learned": False, "source": "as in the snapshot"}}
    lost = (0.5**2 + 1**2 + 1.5**2) / (2 * 3)  # no checkpoints: the partition in flight, length-biased
    assert doc["preemption_usd"]["slurm"] == pytest.approx(_expected_usd(0.2, lost))
    assert doc["preemption_usd"]["kubernetes"] == 0.0
    rows = doc["plans"]["slurm"]
    assert sum(r["preemption_cost_usd"] for r in rows) == pytest.approx(_expected_usd(0.2, lost))
    pl = rows[0]["placement"]
    assert pl["preemptions_per_gpu_hour"] == 0.2 and pl["preemption_rate_learned"] is False
    assert pl["expected_preemption_cost_usd"] == pytest.approx(_expected_usd(0.2, lost))
    # checkpoints every 500 records (0.25 s): a preemption loses 0.125 s of work
    assert whatif_main([str(corpus), "--snapshot", str(snapfile), "--json", "--checkpoint-records", "500"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["checkpoint_records"] == 500
    assert doc["preemption_usd"]["slurm"] == pytest.approx(_expected_usd(0.2, 0.125))


def test_whatif_learns_the_rate_from_the_instance_and_prints_it(corpus, snapfile, capsys):
    with dg.instance_for_test() as instance:  # sets DAGSTER_HOME
        record_preempted_steps(instance)  # slurm:gpu/low: 2 preemptions in 1 GPU-h
        assert whatif_main([str(corpus), "--snapshot", str(snapfile), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        rate = (0.2 * 10 + 2) / (10 + 1)
        pre = doc["preemption"]["slurm"]
        assert pre["preemptions_per_gpu_hour"] == pytest.approx(rate) and pre["learned"] is True
        lost = (0.5**2 + 1**2 + 1.5**2) / (2 * 3)
        assert doc["preemption_usd"]["slurm"] == pytest.approx(_expected_usd(rate, lost))
        assert whatif_main([str(corpus), "--snapshot", str(snapfile)]) == 0
        out = capsys.readouterr().out
    assert "preempt USD" in out
    assert ("preemption on slurm (slurm:gpu/low): 0.364 per GPU-h (learned: 2 preemption(s) in 1.00 GPU-h, "
            "with prior 0.2/GPU-h weighing 10 GPU-h)") in " ".join(out.split())
