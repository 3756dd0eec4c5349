"""Backend settings: each default is written once (the settings class) and the Dagster schema comes from it."""

from __future__ import annotations

import dataclasses

import pytest
from dagster._config import process_config

from dagster_gpu.local import backend as local
from dagster_gpu.slurm import backend as slurm
from dagster_gpu.k8s.settings import KubernetesSettings, config_field, settings_from_config
from dagster_gpu.executor.executor import GPU_EXECUTOR_CONFIG
from dagster_gpu.instance.settings import from_section
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
    assert settings_from_config(_resolve(config_field(), {})) == m.PodSettings()
    assert settings_from_config({}) == m.PodSettings()


def test_kubernetes_section_values_reach_the_pod_settings():
    s = settings_from_config(_resolve(config_field(), {
        "namespace": "gpu", "mig_profile": None, "sharing_strategy": "MPS", "termination_grace_period_seconds": 5,
        "postgres_password_secret": {"name": "pg"}, "labels": {"team": "a"},
        "env_secret_refs": [{"env": "AWS_SECRET_ACCESS_KEY", "secret": "s3", "key": "secret-key"}]}))
    assert (s.namespace, s.mig_profile, s.sharing_strategy, s.termination_grace_period_seconds) == ("gpu", None, "MPS", 5)
    assert s.secret_env == (m.SecretEnv("DAGSTER_PG_PASSWORD", "pg", "postgresql-password"),
                            m.SecretEnv("AWS_SECRET_ACCESS_KEY", "s3", "secret-key"))
    assert dict(s.labels) == {"team": "a"}
    assert settings_from_config({"postgres_password_secret": None}).secret_env == ()


def test_unknown_keys_and_bad_values_are_rejected_by_the_schema():
    assert not process_config(config_field().config_type, {"namespce": "x"}).success
    assert not process_config(config_field().config_type, {"sharing_strategy": "Nope"}).success
    assert not process_config(slurm.config_field().config_type, {"throttle": "four"}).success


def test_slurm_section_lists_become_tuples_and_env_files_expand(monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    s = slurm.SlurmSettings.from_section(_resolve(slurm.config_field(), {"env_files": ["~/pg.env"], "throttle": 4}))
    assert s.env_files == ("/home/u/pg.env",) and s.throttle == 4 and s.extra_sbatch_args == ()


# -- one name for the exit wait: settle_wait_seconds; the old names are deprecated aliases ---------------------
@pytest.fixture
def fresh_warnings(monkeypatch, caplog):
    """The once-per-process warning set emptied, and the settings module's warnings captured."""
    import dagster_gpu.instance.settings as settings_module

    monkeypatch.setattr(settings_module, "_warned", set())
    caplog.set_level("WARNING", logger="dagster_gpu.instance.settings")
    return caplog


def _deprecation_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "dagster_gpu.instance.settings" and r.levelname == "WARNING"]


@pytest.mark.parametrize("section,old,cls,field", [
    ("slurm", "reconcile_wait_seconds", slurm.SlurmSettings, GPU_EXECUTOR_CONFIG["slurm"]),
    ("kubernetes", "finalize_wait_seconds", KubernetesSettings, GPU_EXECUTOR_CONFIG["kubernetes"]),
])
def test_an_old_wait_key_still_works_and_warns_once_naming_the_new_key(fresh_warnings, section, old, cls, field):
    resolved = _resolve(field, {old: 7.5})  # gpu_executor's own schema still accepts the old key
    assert resolved["settle_wait_seconds"] == cls.settle_wait_seconds  # Dagster filled in the new key's default
    s = cls.from_section(resolved)
    assert s.settle_wait_seconds == 7.5 and getattr(s, old) is None
    assert s == cls(settle_wait_seconds=7.5)
    cls.from_section(resolved)  # the same config read again (each process builds its backends more than once)
    warnings = _deprecation_warnings(fresh_warnings)
    assert len(warnings) == 1, warnings
    assert f"{section}.{old} is deprecated" in warnings[0] and f"use {section}.settle_wait_seconds" in warnings[0]
    assert "7.5" in warnings[0]


@pytest.mark.parametrize("cls,old", [(slurm.SlurmSettings, "reconcile_wait_seconds"), (KubernetesSettings, "finalize_wait_seconds")])
def test_the_old_wait_name_works_as_a_keyword_too(fresh_warnings, cls, old):
    assert cls(**{old: 0}).settle_wait_seconds == 0
    assert len(_deprecation_warnings(fresh_warnings)) == 1


@pytest.mark.parametrize("cls,old", [(slurm.SlurmSettings, "reconcile_wait_seconds"), (KubernetesSettings, "finalize_wait_seconds")])
def test_old_and_new_wait_keys_that_disagree_are_an_error_naming_both(fresh_warnings, cls, old):
    with pytest.raises(ValueError, match=rf"{old} \(5\.0\).*settle_wait_seconds \(9\.0\)"):
        cls.from_section({old: 5.0, "settle_wait_seconds": 9.0})
    assert cls.from_section({old: 5.0, "settle_wait_seconds": 5.0}).settle_wait_seconds == 5.0  # the same value: fine


@pytest.mark.parametrize("section,field,cls,default", [
    ("local", GPU_EXECUTOR_CONFIG["local"], local.LocalSettings, 30.0),
    ("slurm", GPU_EXECUTOR_CONFIG["slurm"], slurm.SlurmSettings, 20.0),
    ("kubernetes", GPU_EXECUTOR_CONFIG["kubernetes"], KubernetesSettings, 15.0),
])
def test_settle_wait_seconds_is_the_exit_wait_in_every_section(fresh_warnings, section, field, cls, default):
    assert field.config_type.fields["settle_wait_seconds"].default_value == default
    assert from_section(cls, _resolve(field, {"settle_wait_seconds": 3})).settle_wait_seconds == 3
    assert _deprecation_warnings(fresh_warnings) == []


def test_each_backend_waits_its_section_s_settle_wait_old_name_or_new(fresh_warnings, monkeypatch, tmp_path):
    """Through the registry, as gpu_executor builds them (no scheduler is called: the Slurm backend only
    creates its spool, the Kubernetes one gets an API client that is never used)."""
    from kubernetes import client

    import dagster_gpu.k8s.backend as k8s_backend
    from dagster_gpu.executor.registry import build_backend

    monkeypatch.setattr(k8s_backend, "load_api_client", lambda *a: client.ApiClient(client.Configuration()))
    tmp_path.chmod(0o700)
    spool = str(tmp_path / "spool")
    assert build_backend("local", {"local": {"settle_wait_seconds": 4}}, tmp_path).settle_wait_s == 4
    assert build_backend("slurm", {"slurm": {"spool_dir": spool, "settle_wait_seconds": 5}}, tmp_path).settle_wait_s == 5
    assert build_backend("slurm", {"slurm": {"spool_dir": spool, "reconcile_wait_seconds": 6}}, tmp_path).settle_wait_s == 6
    assert build_backend("kubernetes", {"kubernetes": {"settle_wait_seconds": 7}}, tmp_path).settle_wait_s == 7
    assert build_backend("kubernetes", {"kubernetes": {"finalize_wait_seconds": 8}}, tmp_path).settle_wait_s == 8
    assert len(_deprecation_warnings(fresh_warnings)) == 2
