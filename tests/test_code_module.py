"""``-m MODULE`` of the commands: the working directory first, then the workspace file's working_directory."""

from __future__ import annotations

import sys

import pytest

from dagster_gpu.commands.code_module import load_definitions, workspace_directories


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user's project (its own package beside its workspace.yaml), and another folder to run from."""
    proj = tmp_path / "my_project"
    (proj / "my_embeddings").mkdir(parents=True)
    (proj / "my_embeddings" / "__init__.py").write_text("")
    (proj / "my_embeddings" / "definitions.py").write_text("import dagster as dg\ndefs = dg.Definitions()\n")
    (proj / "workspace.yaml").write_text(
        "load_from:\n  - python_file:\n      relative_path: other.py\n      working_directory: elsewhere\n"
        "  - python_module:\n      module_name: my_embeddings.definitions\n      working_directory: .\n")
    away = tmp_path / "away"
    away.mkdir()
    monkeypatch.chdir(away)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield proj, away
    for name in [m for m in sys.modules if m.startswith("my_embeddings")]:
        del sys.modules[name]


def test_the_workspace_files_working_directory_is_used_from_another_folder(project, capsys):
    proj, _away = project
    assert workspace_directories(proj / "workspace.yaml", "my_embeddings.definitions") == [
        str(proj), str(proj / "elsewhere")]  # the module's own location first, relative to the file's folder
    loaded = load_definitions("my_embeddings.definitions", "defs", "dagster-gpu backfill", proj / "workspace.yaml")
    assert loaded is not None and loaded[0].__file__ == str(proj / "my_embeddings" / "definitions.py")


def test_a_module_found_nowhere_says_where_it_was_looked_for(project, capsys):
    proj, away = project
    (proj / "workspace.yaml").write_text("load_from:\n  - python_module:\n      module_name: x\n      working_directory: lib\n")
    assert load_definitions("my_embeddings.definitions", "defs", "dagster-gpu backfill", proj / "workspace.yaml") is None
    err = capsys.readouterr().err
    assert err.startswith("dagster-gpu backfill: cannot import -m my_embeddings.definitions: No module named 'my_embeddings' "
                          f"(looked in the working directory {away} and the workspace file {proj / 'workspace.yaml'}'s "
                          f"working_directory {proj / 'lib'}; ")
    assert load_definitions("my_embeddings.definitions", "defs", "dagster-gpu stale", away / "workspace.yaml") is None
    assert f"(looked in the working directory {away} (workspace file {away / 'workspace.yaml'} names no other" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["stale", "search", "index", "whatif"])
def test_every_command_that_imports_a_module_takes_the_workspace_file(project, capsys, command):
    """From another folder, ``-w``'s workspace file names the module's working_directory: each command imports it
    (and then refuses the asset the empty Definitions lacks); without ``-w`` its hint names ``-w``, which it has."""
    import dagster as dg

    from dagster_gpu.commands.main import main

    proj, _away = project
    extra = {"search": ["a query"], "index": ["--rebuild"], "whatif": []}.get(command, [])
    argv = [command, "-m", "my_embeddings.definitions", "-a", "nothing_here", *extra]
    with dg.instance_for_test():
        assert main([*argv, "-w", str(proj / "workspace.yaml")]) == 2
        err = capsys.readouterr().err
        assert "unrecognized arguments" not in err and "cannot import" not in err and "No module named" not in err, err
        assert "nothing_here" in err, err
        for name in [m for m in sys.modules if m.startswith("my_embeddings")]:
            del sys.modules[name]
        sys.path.remove(str(proj))
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "No module named 'my_embeddings'" in err and "-w's workspace file" in err, err
