"""pytest plugin (loaded by tests/conftest.py): end-to-end tests may not skip in CI.

Under ``CI=true`` (any of ``1``/``true``/``yes``) or ``DAGSTER_GPU_REQUIRE_SERVICES=1`` (set by
``scripts/test.sh``), a test marked ``e2e``, ``slurm``, ``k8s`` or ``postgres`` that skips — a service
down, a cluster that did not start, a resource version not served — is reported as failed (an error when
it skipped in a fixture), with the skip reason, so the session fails. Outside CI such tests skip with the
same reason, for a developer without the services. ``xfail`` is left alone.
"""

from __future__ import annotations

import os

import pytest

#: A skip of a test carrying any of these markers fails the session under CI.
SERVICE_MARKERS = frozenset({"e2e", "slurm", "k8s", "postgres"})
_TRUE = {"1", "true", "yes"}


def services_required(env: os._Environ | dict | None = None) -> bool:
    """True under ``CI=true`` or ``DAGSTER_GPU_REQUIRE_SERVICES=1`` (case-insensitive ``1/true/yes``)."""
    env = os.environ if env is None else env
    return any(str(env.get(k, "")).strip().lower() in _TRUE for k in ("CI", "DAGSTER_GPU_REQUIRE_SERVICES"))


def _skip_reason(longrepr) -> str:
    # a skip's longrepr is (path, lineno, "Skipped: <reason>")
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    rep = outcome.get_result()
    if not rep.skipped or hasattr(rep, "wasxfail") or not services_required():
        return
    marks = sorted({m.name for m in item.iter_markers()} & SERVICE_MARKERS)
    if not marks:
        return
    rep.outcome = "failed"
    rep.longrepr = (
        f"{item.nodeid}: an end-to-end test (markers: {', '.join(marks)}) skipped while services are required "
        f"(CI=true or DAGSTER_GPU_REQUIRE_SERVICES=1): {_skip_reason(rep.longrepr)}"
    )
