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
    """``DagsterInstance.get()``, or None after printing one line to stderr naming what is wrong with
    ``$DAGSTER_HOME`` (not set, not a directory); the caller exits 2."""
    import dagster as dg
    from dagster._core.errors import DagsterHomeNotSetError

    try:
        return dg.DagsterInstance.get()
    except (DagsterHomeNotSetError, dg.DagsterInvariantViolationError) as e:
        first = str(e).strip().splitlines()[0]
        print(f"{prog}: {first} Set DAGSTER_HOME to the instance's directory (the demo's: .dagster_home).", file=sys.stderr)
        return None
