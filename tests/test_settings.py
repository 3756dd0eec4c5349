"""Backend settings: each default is written once (the settings class) and the Dagster schema comes from it."""

from __future__ import annotations

import dataclasses

import pytest
from dagster._config import process_config

from dagster_gpu.executor.backends import local, slurm
from dagster_gpu.executor.backends.kubernetes_settings import KubernetesSettings, config_field, settings_from_config
from dagster_gpu.executor.executor import GPU_EXECUTOR_CONFIG
from dagster_gpu.executor.settings import from_section
from dagster_gpu.k8s import manifests as m


def _resolve(field, section):
    r = process_config(field.config_type, section)
    assert r.success, r.errors
    return r.value


@pytest.mark.parametrize("cls,field", [
    (slurm.SlurmSettings, slurm.config_field()),
    (KubernetesSettings, config_field()),
    (local.LocalSettings, local.config_field()),
])
def test_schema_defaults_are_the_settings_class_defaults(cls, field):
    resolved = _resolve(field, {})
    assert from_section(cls, resolved) == cls()  # the schema's defaults give the class's defaults
    fields = field.config_type.fields
    assert set(fields) == {f.name for f in dataclasses.fields(cls)}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING and f.default is not None:
            expected = list(f.default) if isinstance(f.default, tuple) else f.default
            assert fields[f.name].default_value == expected, f.name
            assert resolved[f.name] == expected


def test_the_executor_schema_uses_the_generated_sections():
    assert set(GPU_EXECUTOR_CONFIG["slurm"].config_type.fields) == {f.name for f in dataclasses.fields(slurm.SlurmSettings)}
    assert GPU_EXECUTOR_CONFIG["local"].config_type.fields["terminate_grace_seconds"].default_value == 10.0


def test_empty_kubernetes_section_gives_the_manifest_defaults():
    assert settings_from_config(_resolve(config_field(), {})) == m.K8sSettings()
    assert settings_from_config({}) == m.K8sSettings()


def test_kubernetes_section_values_reach_the_pod_settings():
    s = settings_from_config(_resolve(config_field(), {
        "namespace": "gpu", "mig_profile": None, "sharing_strategy": "MPS", "termination_grace_period_seconds": 5,
        "postgres_password_secret": {"name": "pg"}, "labels": {"team": "a"},
        "env_secret_refs": [{"env": "AWS_SECRET_ACCESS_KEY", "secret": "s3", "key": "secret-key"}]}))
    assert (s.namespace, s.mig_profile, s.sharing_strategy, s.termination_grace_period_s) == ("gpu", None, "MPS", 5)
    assert s.secret_env == (m.SecretEnv("DAGSTER_PG_PASSWORD", "pg", "postgresql-password"),
                            m.SecretEnv("AWS_SECRET_ACCESS_KEY", "s3", "secret-key"))
    assert dict(s.extra_labels) == {"team": "a"}
    assert settings_from_config({"postgres_password_secret": None}).secret_env == ()


def test_unknown_keys_and_bad_values_are_rejected_by_the_schema():
    assert not process_config(config_field().config_type, {"namespce": "x"}).success
    assert not process_config(config_field().config_type, {"sharing_strategy": "Nope"}).success
    assert not process_config(slurm.config_field().config_type, {"throttle": "four"}).success


def test_slurm_section_lists_become_tuples_and_env_files_expand(monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    s = slurm.SlurmSettings.from_section(_resolve(slurm.config_field(), {"env_files": ["~/pg.env"], "throttle": 4}))
    assert s.env_files == ("/home/u/pg.env",) and s.throttle == 4 and s.extra_sbatch_args == ()
