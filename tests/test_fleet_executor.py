"""gpu_executor's ``clusters:`` through its real config schema and step handler: each cluster gets its own backend
(settings, rate table, worker interpreter), today's single sections keep working, bad config names the cluster."""

from __future__ import annotations

import logging

import dagster as dg
import pytest
from dagster._config import process_config

from dagster_gpu.executor.command import worker_python_for
from dagster_gpu.executor.executor import GPU_EXECUTOR_CONFIG
from dagster_gpu.executor.fleet import gather_fleet
from dagster_gpu.executor.step_handler import GpuStepHandler
from dagster_gpu.fleet import FleetConfigError

A100 = "NVIDIA A100-SXM4-80GB"


def _processed(config):
    r = process_config(dg.Shape(GPU_EXECUTOR_CONFIG), config)
    assert r.success, r.errors
    return r.value


FLEET = {
    "worker_python": "/opt/venv/bin/python",
    "slurm": {"slurm_partition": "debug"},
    "clusters": {
        "campus": {"slurm": {"slurm_partition": "a100", "throttle": 3, "worker_python": "/shared/venv/bin/python"},
                   "rates": {"default": 0.9}, "waiting_budget_seconds": 600},
        "cloud": {"kubernetes": {"namespace": "embed", "kubeconfig": "/nonexistent/kubeconfig"}},
    },
}


def test_each_cluster_gets_its_own_backend_rates_and_worker_python(tmp_path):
    h = GpuStepHandler(_processed(FLEET), tmp_path)
    assert h.candidates == ["local", "slurm", "campus", "cloud"]
    assert [h.cluster_kind(n) for n in h.candidates] == ["local", "slurm", "slurm", "kubernetes"]
    assert h.waiting_budget_s("campus") == 600.0 and h.waiting_budget_s("slurm") is None
    assert h.rate_card.rate("campus", A100) == 0.9 and h.rate_card.rate("slurm", A100) == 1.2
    assert h.rate_card.rate("cloud", A100) == 2.4  # the rate card's kubernetes table
    campus, legacy = h.backend("campus"), h.backend("slurm")
    assert campus is not legacy and campus.name == legacy.name == "slurm"
    assert campus.settings.slurm_partition == "a100" and campus.settings.throttle == 3
    assert legacy.settings.slurm_partition == "debug"
    assert worker_python_for("slurm", h.cluster_config("campus")) == "/shared/venv/bin/python"
    assert worker_python_for("slurm", h.cluster_config("slurm")) == "/opt/venv/bin/python"


def test_a_cluster_that_cannot_be_asked_is_skipped_with_its_reason_logged(tmp_path, caplog):
    h = GpuStepHandler(_processed({"local": {"enabled": False}, "clusters": FLEET["clusters"]}), tmp_path)
    with caplog.at_level(logging.WARNING):
        fleet = gather_fleet(h, ["cloud"])
    (cloud,) = fleet.clusters
    assert (cloud.name, cloud.kind, cloud.state.reachable) == ("cloud", "kubernetes", False)
    assert cloud.state.reason == "ConfigException: Invalid kube-config file. No configuration found."
    assert "cluster cloud (kubernetes) skipped:" in caplog.text


def test_todays_one_section_config_is_unchanged(tmp_path):
    h = GpuStepHandler(_processed({"slurm": {"slurm_partition": "gpu"}}), tmp_path)
    assert h.candidates == ["local", "slurm"] and h.cluster_kind("slurm") == "slurm"
    assert h.rate_card.rates.keys() == {"local", "slurm", "kubernetes"}


def test_bad_cluster_config_fails_at_the_executor_naming_cluster_and_key(tmp_path):
    r = process_config(dg.Shape(GPU_EXECUTOR_CONFIG), {"clusters": {"campus": {"slurm": {"no_such_key": 1}}}})
    assert not r.success and "no_such_key" in str(r.errors)
    with pytest.raises(FleetConfigError, match=r"clusters\.campus: give exactly one of `slurm:` or `kubernetes:` \(got both\)"):
        GpuStepHandler(_processed({"clusters": {"campus": {"slurm": {}, "kubernetes": {}}}}), tmp_path)


def test_a_kubernetes_cluster_bills_its_pod_intervals_at_its_own_rates(tmp_path):
    from tests import k8s_helpers as K

    kubeconfig = K.K8S_DIR / "executor.kubeconfig"
    if not kubeconfig.exists():
        pytest.skip(f"no kubeconfig at {kubeconfig} (resources/k8s/cluster.sh start)")
    h = GpuStepHandler(_processed({"kubernetes": {"kubeconfig": str(kubeconfig)}, "clusters": {
        "cloud": {"kubernetes": {"kubeconfig": str(kubeconfig)}, "rates": {"NVIDIA A100": 3.1, "default": 3.0}}}}), tmp_path)
    assert h.backend("cloud").rates == {"NVIDIA A100": 3.1, "default": 3.0}
    assert h.backend("kubernetes").rates == dict(h.rate_card.table("kubernetes"))  # today's section: the rate card's
