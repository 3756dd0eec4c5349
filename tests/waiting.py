"""The one polling wait of the tests: ``wait_for(pred, timeout_s)`` until ``pred()`` is true."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_for(pred: Callable[[], T], timeout_s: float, poll_s: float = 1.0, what: str = "condition",
             why: Callable[[], str] | None = None) -> T:
    """Call ``pred()`` every ``poll_s`` seconds until it returns a true value, and return that value. Past
    ``timeout_s`` seconds (a bound on waiting for a process or cluster, not a speed assertion) raise AssertionError
    ``timed out after <timeout_s>s waiting for <what>``, followed by ``why()`` on its own line when given (the state
    that explains the wait: a daemon's log, the cluster's jobs)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}" + (f"\n{why()}" if why else ""))
