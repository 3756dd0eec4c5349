"""pytest plugin (loaded by tests/conftest.py): the session's failures, one line each, in a file.

With ``DAGSTER_GPU_PYTEST_FAILURES=<path>`` (``scripts/test.sh`` sets it), the end of the session writes
``<path>``: one line per failed or erroring test, ``FAILED <node id> (<phase>): <first error line>``, and a
last line with the counts. ``scripts/test.sh`` prints that file after pytest has exited, so a CI log whose
tail holds whatever the interpreter printed at exit (an atexit hook, a worker's last words) still ends
with which tests failed and why. Without the variable nothing is written.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ENV = "DAGSTER_GPU_PYTEST_FAILURES"


def first_error_line(text: str) -> str:
    """The first ``E   `` line of a pytest failure report (the assertion or exception), else its last line;
    at most 300 characters."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    errs = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    line = errs[0] if errs else (lines[-1].strip() if lines else "")
    return line[:300]


def summary_lines(stats: dict, exitstatus: int) -> list[str]:
    """The failure lines of :mod:`this plugin <tests.failure_summary>` for a terminal reporter's ``stats``."""
    out = []
    for kind, word in (("failed", "FAILED"), ("error", "ERROR")):
        for rep in stats.get(kind, []):
            nodeid = getattr(rep, "nodeid", "") or "(collection)"
            when = getattr(rep, "when", "") or "collect"
            out.append(f"{word} {nodeid} ({when}): {first_error_line(getattr(rep, 'longreprtext', '') or '')}")
    counts = {k: len(stats.get(k, [])) for k in ("passed", "failed", "error", "skipped")}
    out.append("pytest exit status {}: {}".format(exitstatus, ", ".join(f"{n} {k}" for k, n in counts.items())))
    return out


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus: int, config) -> None:
    path = os.environ.get(ENV)
    if path:
        Path(path).write_text("\n".join(summary_lines(terminalreporter.stats, int(exitstatus))) + "\n")
