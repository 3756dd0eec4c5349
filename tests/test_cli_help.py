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
