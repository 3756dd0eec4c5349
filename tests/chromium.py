"""Debian's ``chromium`` for the browser tests (driven by Playwright through ``executable_path``)."""

from __future__ import annotations

import os
import shutil

import pytest


def chromium_path() -> str:
    """The path of Debian's chromium; a skip without it, a failure under ``CI=true`` (scripts/test.sh installs
    it)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        msg = "Debian's chromium is not installed (scripts/test.sh installs it)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path
