"""tests/waiting.py: the tests' one polling wait."""

from __future__ import annotations

import pytest

from tests.waiting import wait_for


def test_wait_for_returns_the_first_true_value():
    values = iter([None, 0, [], {"run": "r1"}])
    assert wait_for(lambda: next(values), 5, poll_s=0.01) == {"run": "r1"}


def test_wait_for_names_what_it_waited_for_and_why_past_its_timeout():
    calls = []
    with pytest.raises(AssertionError) as e:
        wait_for(lambda: calls.append(1), 0.05, poll_s=0.01, what="the run", why=lambda: "daemon log tail:\nboom")
    assert str(e.value) == "timed out after 0.05s waiting for the run\ndaemon log tail:\nboom" and len(calls) >= 2
