"""What every ``dagster-gpu`` command shares: its console and the Dagster instance, with one-line errors."""

from __future__ import annotations

import sys

#: Columns of a console whose output goes to a file or a pipe (rich would assume 80 and cut table cells).
LOG_WIDTH = 160


def console():
    """A rich Console: the terminal's width on a terminal, ``LOG_WIDTH`` columns otherwise."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=LOG_WIDTH)


def instance_or_none(prog: str):
    """``DagsterInstance.get()``, or None after printing one line to stderr, prefixed ``{prog}: ``, naming
    ``$DAGSTER_HOME`` and what is wrong with it (not set, set to a path that is not an existing directory, not
    absolute); the caller exits 2. Errors other than the instance's home propagate."""
    import os

    import dagster as dg
    from dagster._core.errors import DagsterHomeNotSetError

    try:
        return dg.DagsterInstance.get()
    except (DagsterHomeNotSetError, dg.DagsterInvariantViolationError) as e:
        home = os.environ.get("DAGSTER_HOME")
        path = os.path.expanduser(home or "")
        if not home:
            what = "$DAGSTER_HOME is not set."
        elif not os.path.isabs(path):
            what = f"$DAGSTER_HOME is {home!r}, which is not an absolute path."
        elif not os.path.isdir(path):
            what = f"$DAGSTER_HOME is {home!r}, which is not an existing directory."
        else:
            what = str(e).strip().splitlines()[0].split(". ")[0].rstrip(".") + "."
        print(f"{prog}: {what} Set DAGSTER_HOME to the instance's directory (the demo's: .dagster_home).",
              file=sys.stderr)
        return None
