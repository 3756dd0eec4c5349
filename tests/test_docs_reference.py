"""The generated reference pages (scripts/docs/reference.py) on settings classes of every shape: nested sections at
any depth, optional ones, tuples, mappings and renamed keys become rows with their dotted key, type, default and
description."""

from __future__ import annotations

from dataclasses import dataclass

from dagster_gpu.settings.schema import apply_renamed, config_field, renamed, setting
from scripts.docs.reference import ROOT, _cell, command_names, documented_keys, request_tags, settings_rows


@dataclass(frozen=True)
class Inner:
    host: str = setting(description="Login node.")
    port: int = setting(22, "TCP port.")


@dataclass(frozen=True)
class Middle:
    inner: Inner = setting(default_factory=lambda: Inner(host="h"), description="Its inner section.")
    extra: Inner | None = setting(None, "An optional section.")
    names: tuple[str, ...] = setting(("a",), "Names.")


@dataclass(frozen=True)
class Outer:
    middle: Middle = setting(default_factory=Middle, description="Middle section.")
    labels: dict = setting(default_factory=dict, description="Labels.")
    wait_s: float = setting(20.0, "Seconds.")
    old_wait_s: float | None = renamed("wait_s")

    def __post_init__(self):
        apply_renamed(self, "outer")


def test_nested_sections_become_dotted_rows_at_any_depth():
    rows = {key: (kind, default, desc) for key, kind, default, desc in settings_rows({"outer": config_field(Outer, "O.")})}
    assert rows["outer"] == ("section", "none", "O.")
    # a key without a default is required within its section; the section's default is the whole factory value
    assert rows["outer.middle.inner.host"] == ("String (or {env: VAR})", "required", "Login node.")
    assert rows["outer.middle.inner"] == ("section", '`{"host": "h", "port": 22}`', "Its inner section.")
    assert rows["outer.middle.inner.port"] == ("Int", "`22`", "TCP port.")
    assert rows["outer.middle.extra"] == ("section or null", "none", "An optional section.")
    assert rows["outer.middle.extra.host"][2] == "Login node."
    assert rows["outer.middle.names"][:2] == ("[String]", "`[\"a\"]`")
    assert rows["outer.labels"][0] == "mapping"
    assert rows["outer.wait_s"] == ("Float", "`20.0`", "Seconds.")
    assert rows["outer.old_wait_s"][2].startswith("Deprecated: the old name of wait_s")


def test_every_executor_key_has_a_description():
    rows = settings_rows()
    assert {"backend", "local.forkserver_idle_seconds", "slurm.slurm_partition", "kubernetes.namespace"} <= {r[0] for r in rows}
    assert [r[0] for r in rows if not r[3].strip()] == []


def test_commands_and_bill_keys_come_from_the_code():
    assert command_names()[:5] == ["backfill", "stale", "whatif", "report", "search"]
    keys = {key: doc for _, key, doc in documented_keys(ROOT / "dagster_gpu" / "billing" / "keys.py")}
    assert keys["billing/cost_usd"] == "USD: GPU-seconds × rate ÷ 3600."


def test_request_tags_carry_their_meaning():
    tags = {tag: doc for tag, _, doc in request_tags()}
    assert tags["dagster-gpu/gpu-count"] == "whole devices wanted (int >= 0, default 1)"
    assert tags["dagster-gpu/deadline-seconds"].endswith("absent means ``batch`` (no deadline)")
    assert tags["dagster-gpu/asset-key"] == tags["dagster-gpu/corpus-url"]  # one comment above the pair
    assert all(tags.values()), [t for t, d in tags.items() if not d]
    assert _cell("``a|b``") == "`a\\|b`"
