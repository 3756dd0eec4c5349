"""``dagster-gpu --help``: every subcommand the CLI dispatches is listed with its usage line."""

from __future__ import annotations

import re

from dagster_gpu.commands.main import COMMANDS, main


def test_help_lists_every_subcommand(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = re.findall(r"^    dagster-gpu (\w+)", out, flags=re.M)
    assert sorted(set(listed)) == sorted(COMMANDS) == ["backfill", "index", "report", "search", "stale", "whatif"]
    assert "dagster-gpu index -m MODULE -a INDEX_ASSET --rebuild" in out


def test_an_unknown_command_is_refused_with_the_help(capsys):
    assert main(["serch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dagster-gpu: unknown command 'serch'") and "dagster-gpu search -m MODULE" in err


def test_dagsters_no_dagster_yaml_warning_shows_once_per_command(tmp_path, monkeypatch, caplog):
    """A command reads its instance several times (to open it, for the daemon's instance ref: what ``backfill``
    does); Dagster warns at each read of a home without dagster.yaml (dagster 1.13,
    ``dagster._core.instance.config.dagster_instance_config``): the CLI lets it through once."""
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    from dagster_gpu.commands.common import NO_INSTANCE_YAML
    from dagster_gpu.commands.main import quiet_dagster_warnings
    from dagster_gpu.instance.run_queue import daemon_instance_ref

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    caplog.set_level("WARNING", logger="dagster")
    quiet_dagster_warnings()
    quiet_dagster_warnings()  # idempotent: one filter
    with dg.DagsterInstance.get():
        pass
    InstanceRef.from_dir(str(tmp_path))
    daemon_instance_ref(str(tmp_path), 2)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith(NO_INSTANCE_YAML)]
    assert len(said) == 1, said
    assert f"found at {tmp_path}. Defaulting to loading and storing all metadata with {tmp_path}" in said[0]
