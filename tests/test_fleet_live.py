"""The three clusters the tests run, as one fleet: the Slurm 22.05 cluster (local transport), the Slurm 24.11 cluster
(slurmrestd) and the Kubernetes control plane, asked for their live state through gpu_executor's ``clusters:`` and
planned over by ``dagster-gpu whatif``. Read-only: nothing is submitted. Marked ``slurm`` and ``k8s`` so the
clusters are idle (tests/host_locks.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from dagster_gpu.commands.whatif import whatif_main
from tests import k8s_helpers as K
from tests import rest_helpers as R
from tests.slurm_helpers import cluster_unavailable_reason, slurm_conf

pytestmark = [pytest.mark.slurm, pytest.mark.k8s]


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(4):
        (d / f"day{i}.jsonl").write_text("".join(json.dumps({"text": f"row {i}-{j}"}) + "\n" for j in range(400)))
    return d


def test_a_backfill_is_spread_over_three_live_clusters_by_price_and_throttle(corpus, tmp_path, capsys, monkeypatch):
    for why in (cluster_unavailable_reason(), R.unavailable_reason(), K.cluster_skip_reason()):
        if why:
            pytest.skip(why)
    monkeypatch.setenv("SLURM_CONF", slurm_conf())  # the 22.05 cluster's, for the local transport
    token = R.write_token(tmp_path / "jwt")
    cfg = tmp_path / "executor.yaml"
    cfg.write_text(yaml.safe_dump({"execution": {"config": {"backend": "auto", "local": {"enabled": False}, "clusters": {
        "dept": {"slurm": {"account": "research", "throttle": 1}, "rates": {"default": 0.6}},
        "national": {"slurm": {"transport": "rest", "throttle": 1,
                               "rest": {"url": R.URL, "user": "root", "token_file": str(token)}},
                     "rates": {"default": 0.9}},
        "cloud": {"kubernetes": {"kubeconfig": str(K.K8S_DIR / "executor.kubeconfig"), "namespace": K.NAMESPACE},
                  "rates": {"default": 2.4}}}}}}, sort_keys=False))
    # due in 42 s: a unit is 20 s on Slurm (its start-up) + 5 s launch, 30 s + 10 s on Kubernetes; each Slurm
    # cluster's %1 throttle takes one unit at once, a second would start a unit's length later (finish 45 s)
    assert whatif_main([str(corpus), "--executor-config", str(cfg), "--tag", "dagster-gpu/deadline-seconds=42",
                        "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(c["cluster"], c["kind"], c["reachable"]) for c in doc["fleet"]] == [
        ("dept", "slurm", True), ("national", "slurm", True), ("cloud", "kubernetes", True)], doc["unreachable"]
    auto = doc["plans"]["auto"]
    assert [r["cluster"] for r in auto] == ["dept", "national", "cloud", "cloud"]
    assert all(r["placement"]["deadline_met"] for r in auto)
    first = auto[0]["placement"]
    assert first["reason"].startswith("cluster dept: least expected cost of ")
    assert "runners-up: national (slurm) " in first["reason"]
    totals = doc["totals_by_cluster"]["auto"]
    assert {c: t["partitions"] for c, t in totals.items()} == {"dept": 1, "national": 1, "cloud": 2}
    # each cluster priced from its own rates: the same 20 s Slurm unit costs 0.6 and 0.9 USD/GPU-h
    assert totals["national"]["cost_usd"] == pytest.approx(totals["dept"]["cost_usd"] * 0.9 / 0.6)
