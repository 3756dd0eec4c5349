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


#: The start of the warning Dagster logs (logger ``dagster``) each time it reads an instance whose home has no
#: dagster.yaml (``dagster._core.instance.config.dagster_instance_config``, dagster 1.13): once per instance read.
NO_INSTANCE_YAML = "No dagster instance configuration file"


class _OncePerHome:
    """A logging filter passing each distinct :data:`NO_INSTANCE_YAML` warning (one per home directory) once."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def filter(self, record) -> bool:
        msg = record.getMessage()
        if not msg.startswith(NO_INSTANCE_YAML):
            return True
        if msg in self.seen:
            return False
        self.seen.add(msg)
        return True


def no_instance_yaml_warning_once() -> None:
    """Let Dagster's "no dagster.yaml found" warning through once per process (a command reads its instance several
    times: to open it, for the daemon's instance ref, ...). Idempotent."""
    import logging

    logger = logging.getLogger("dagster")
    if not any(isinstance(f, _OncePerHome) for f in logger.filters):
        logger.addFilter(_OncePerHome())
