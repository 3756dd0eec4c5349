"""Backend settings: each default is written once (the settings class) and the Dagster schema comes from it."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
from dagster._config import process_config

from dagster_gpu.local import backend as local
from dagster_gpu.slurm import backend as slurm
from dagster_gpu.k8s.settings import KubernetesSettings, config_field, settings_from_config
from dagster_gpu.executor.executor import GPU_EXECUTOR_CONFIG
from dagster_gpu.settings.schema import from_section, moved_keys
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
    assert set(fields) == {f.name for f in dataclasses.fields(cls)} | set(moved_keys(cls))
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING and f.default is not None:
            expected = list(f.default) if isinstance(f.default, tuple) else f.default
            assert fields[f.name].default_value == expected, f.name
            assert resolved[f.name] == expected


def test_the_executor_schema_uses_the_generated_sections():
    assert set(GPU_EXECUTOR_CONFIG["slurm"].config_type.fields) == \
        {f.name for f in dataclasses.fields(slurm.SlurmSettings)} | set(moved_keys(slurm.SlurmSettings))
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
    import dagster_gpu.settings.schema as settings_module

    monkeypatch.setattr(settings_module, "_warned", set())
    caplog.set_level("WARNING", logger="dagster_gpu.settings.schema")
    return caplog


def _deprecation_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "dagster_gpu.settings.schema" and r.levelname == "WARNING"]


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


# -- nested sections: slurm.ssh and slurm.rest; the flat keys they replace are deprecated ----------------------
RENAMED_SLURM_KEYS = {
    "ssh_host": "ssh.host", "ssh_user": "ssh.user", "ssh_port": "ssh.port", "ssh_identity_file": "ssh.identity_file",
    "ssh_known_hosts_file": "ssh.known_hosts_file", "ssh_proxy_jump": "ssh.proxy_jump", "ssh_config": "ssh.config",
    "ssh_control_dir": "ssh.control_dir", "ssh_forward_env": "ssh.forward_env", "remote_spool_dir": "ssh.remote_spool_dir",
    "rest_url": "rest.url", "rest_user": "rest.user", "rest_token_env": "rest.token_env", "rest_token_file": "rest.token_file",
    "rest_auth_header": "rest.auth_header", "rest_data_parser": "rest.data_parser",
    "rest_max_array_size": "rest.max_array_size", "rest_forward_env": "rest.forward_env",
    "rest_working_dir": "rest.working_dir", "rest_ca_file": "rest.ca_file",
    "rest_token_wait_seconds": "rest.token_wait_seconds",
}


def _run_config_slurm(section: dict) -> dict:
    """The ``slurm:`` section as Dagster resolves it for a real job on gpu_executor (``validate_run_config``)."""
    import dagster as dg

    from dagster_gpu.executor.executor import gpu_executor

    @dg.op
    def noop():
        return None

    @dg.job(executor_def=gpu_executor)
    def one_op():
        noop()

    resolved = dg.validate_run_config(one_op, {"execution": {"config": {"backend": "slurm", "slurm": section}}})
    return resolved["execution"]["gpu_executor"]["slurm"]


def test_each_flat_slurm_key_has_its_nested_key():
    assert {old: new for old, (new, _) in moved_keys(slurm.SlurmSettings).items()} == RENAMED_SLURM_KEYS


def test_the_nested_ssh_and_rest_sections_are_valid_gpu_executor_config(tmp_path):
    from dagster_gpu.executor.executor import gpu_executor
    from dagster_gpu.slurm.ssh import transport_from_settings

    schema = gpu_executor.config_schema.config_type.fields["slurm"].config_type
    assert set(schema.fields["ssh"].config_type.fields) >= {"host", "port", "known_hosts_file", "remote_spool_dir"}
    assert not process_config(gpu_executor.config_schema.config_type, {"slurm": {"ssh": {"hots": "x"}}}).success
    section = _run_config_slurm({"transport": "ssh", "spool_dir": str(tmp_path / "spool"),
                                 "ssh": {"host": "login.example", "port": 2222, "known_hosts_file": "/etc/kh",
                                         "remote_spool_dir": "/shared/spool", "control_dir": str(tmp_path / "ctl")},
                                 "rest": {"url": "https://slurm.example.org", "token_wait_seconds": 5}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the nested form warns about nothing
        s = slurm.SlurmSettings.from_section(section)
    assert (s.ssh.host, s.ssh.port, s.ssh.forward_env, s.rest.url, s.rest.token_wait_seconds, s.rest.working_dir) == \
        ("login.example", 2222, ("DAGSTER_*",), "https://slurm.example.org", 5.0, "/tmp")
    t = transport_from_settings(s)
    assert (t.target.host, t.target.port, t.remote_spool, t.control_dir) == ("login.example", 2222, "/shared/spool", str(tmp_path / "ctl"))


def test_the_flat_form_still_works_and_warns_naming_the_new_key(fresh_warnings):
    section = _run_config_slurm({"transport": "ssh", "ssh_host": "login.example", "ssh_port": 2222,
                                 "remote_spool_dir": "/shared/spool", "rest_token_wait_seconds": 5.0})
    with pytest.warns(DeprecationWarning) as caught:
        s = slurm.SlurmSettings.from_section(section)
    assert sorted(str(w.message) for w in caught) == [
        f"gpu_executor config: slurm.{old} is deprecated: use slurm.{new}"
        for old, new in sorted([("remote_spool_dir", "ssh.remote_spool_dir"), ("rest_token_wait_seconds", "rest.token_wait_seconds"),
                                ("ssh_host", "ssh.host"), ("ssh_port", "ssh.port")])]
    assert s == slurm.SlurmSettings.from_section(_run_config_slurm({
        "transport": "ssh", "ssh": {"host": "login.example", "port": 2222, "remote_spool_dir": "/shared/spool"},
        "rest": {"token_wait_seconds": 5.0}}))
    logged = _deprecation_warnings(fresh_warnings)
    assert len(logged) == 4 and any("slurm.ssh_host is deprecated and will be removed; use slurm.ssh.host" in m for m in logged)


def test_a_flat_key_and_its_nested_key_together_are_an_error_naming_both(fresh_warnings):
    section = _run_config_slurm({"ssh_host": "a.example", "ssh": {"host": "b.example"}})
    with pytest.raises(ValueError, match=r"both slurm\.ssh_host \('a\.example'\) and slurm\.ssh\.host \('b\.example'\) "
                                         r"are set; ssh_host is the deprecated flat form of ssh\.host: keep ssh\.host only"):
        slurm.SlurmSettings.from_section(section)


def test_the_example_config_s_commented_ssh_and_rest_sections_are_valid():
    import yaml
    from pathlib import Path

    text = (Path(__file__).parents[1] / "resources" / "executor.example.yaml").read_text()
    base = yaml.safe_load(text)["slurm"]
    commented = [ln.strip()[2:] for ln in text.splitlines() if ln.strip().startswith("# ") and ":" in ln and ln.startswith("  #")]
    for kind in ("ssh", "rest"):
        lines = [ln for ln in commented if ln.startswith(f"{kind}:")]
        assert len(lines) == 1, commented
        section = {**base, "transport": kind, **yaml.safe_load(lines[0])}
        s = slurm.SlurmSettings.from_section(_run_config_slurm(section))
        assert s.transport == kind and (s.ssh.host if kind == "ssh" else s.rest.url).endswith("example.org")
