"""The priority and preemption settings of both backends: what reaches sbatch and the pod spec, and the config
schema generated from the settings dataclasses."""

from __future__ import annotations

import pytest
from dagster._config import process_config

from dagster_gpu.contracts import StepLaunch
from dagster_gpu.k8s import manifests as m
from dagster_gpu.k8s.settings import KubernetesSettings
from dagster_gpu.k8s.settings import config_field as k8s_config_field
from dagster_gpu.policy.placement import Placement
from dagster_gpu.core.request import GpuRequest
from dagster_gpu.slurm.backend import SlurmBackend, SlurmSettings
from dagster_gpu.slurm.client import SlurmClient
from tests.test_k8s_manifests import validate


def _slurm(tmp_path, **kw) -> SlurmBackend:
    return SlurmBackend(SlurmSettings(spool_dir=str(tmp_path / "spool"), **kw), client=SlurmClient())


def test_sbatch_gets_qos_requeue_and_the_signal_lead_time(tmp_path):
    default = _slurm(tmp_path).sbatch_options_for(1)
    assert "--requeue" in default and not any(o.startswith("--signal") for o in default)
    opts = _slurm(tmp_path, qos="batch-preemptible", requeue=False, signal_lead_seconds=120).sbatch_options_for(1)
    assert opts[:3] == ["--qos=batch-preemptible", "--no-requeue", "--signal=B:USR1@120"]
    assert "--requeue" not in opts
    with pytest.raises(ValueError, match="signal_lead_seconds"):
        SlurmSettings(signal_lead_seconds=70000)


def test_slurm_schema_generated_from_the_settings_has_the_new_keys():
    from dagster_gpu.settings.schema import config_field

    r = process_config(config_field(SlurmSettings, "slurm").config_type, {"requeue": False, "signal_lead_seconds": 90})
    assert r.success, r.errors
    s = SlurmSettings.from_section(r.value)
    assert (s.requeue, s.signal_lead_seconds) == (False, 90)


def _launch() -> StepLaunch:
    return StepLaunch(run_id="0b5c3c5e-8a8e-4f5b-9d7e-1c2d3e4f5a6b", step_key="embeddings", partition_keys=("a.txt",),
                      attempt=0, argv=("python", "-m", "dagster", "api", "execute_step"), env={},
                      request=GpuRequest(count=1), placement=Placement(backend="kubernetes", reason="test"))


def test_pod_gets_the_priority_class_and_the_kueue_queue_label():
    r = process_config(k8s_config_field().config_type, {"priority_class_name": "dagster-gpu-batch", "queue_name": "batch"})
    assert r.success, r.errors
    settings = KubernetesSettings.from_section(r.value).pod_settings()
    pod, _, _ = m.step_objects(_launch(), settings)
    d = validate(pod)
    assert d["spec"]["priorityClassName"] == "dagster-gpu-batch"
    assert d["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "batch"
    plain, _, _ = m.step_objects(_launch(), KubernetesSettings().pod_settings())
    d = validate(plain)
    assert "priorityClassName" not in d["spec"] and "kueue.x-k8s.io/queue-name" not in d["metadata"]["labels"]


@pytest.mark.parametrize("field,value", [("priority_class_name", "Batch_Low"), ("priority_class_name", "a;b"),
                                         ("queue_name", "batch.queue"), ("queue_name", "x" * 64)])
def test_names_that_are_not_kubernetes_names_are_refused(field, value):
    with pytest.raises(m.ManifestError, match=field):
        KubernetesSettings(**{field: value}).pod_settings()


def test_the_recommended_priority_class_never_preempts():
    import yaml
    from pathlib import Path

    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "resources/k8s/manifests/50-batch-priorityclass.yaml").read_text())
    assert (doc["kind"], doc["metadata"]["name"], doc["preemptionPolicy"]) == ("PriorityClass", "dagster-gpu-batch", "Never")
    assert doc["value"] < -10 and doc["globalDefault"] is False  # below the autoscaler's expendable cutoff


def test_each_backend_names_its_preemption_pool_and_reports_its_prior(tmp_path):
    from dagster_gpu.k8s.backend import KubernetesBackend
    from dagster_gpu.local.backend import LocalBackend

    r = process_config(config_field_slurm().config_type, {"slurm_partition": "gpu", "qos": "batch-preemptible",
                                                            "preemptions_per_gpu_hour": 0.5})
    assert r.success, r.errors
    s = _slurm(tmp_path, **{k: r.value[k] for k in ("slurm_partition", "qos", "preemptions_per_gpu_hour")})
    assert s.preemption_pool == "slurm:gpu/batch-preemptible" and s.settings.preemptions_per_gpu_hour == 0.5
    assert _slurm(tmp_path).preemption_pool == "slurm:-/-"
    r = process_config(k8s_config_field().config_type, {"priority_class_name": "dagster-gpu-batch",
                                                        "preemptions_per_gpu_hour": 0.25})
    assert r.success, r.errors
    ks = KubernetesSettings.from_section(r.value)
    kb = KubernetesBackend(object(), ks.pod_settings(), rates={"default": 1.0},
                           preemptions_per_gpu_hour=ks.preemptions_per_gpu_hour)
    assert (kb.preemption_pool, kb.preemptions_per_gpu_hour) == ("kubernetes:dagster-gpu-batch", 0.25)
    assert LocalBackend(tmp_path / "logs").preemption_pool == "local"


def config_field_slurm():
    from dagster_gpu.settings.schema import config_field

    return config_field(SlurmSettings, "slurm")
