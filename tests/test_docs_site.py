"""The docs site: ``mkdocs build --strict`` passes (a dead link, a page missing from the nav or a broken anchor
fails it), the generated reference pages hold every setting and command, the site loads nothing from the
network, and it renders in headless Chromium (Debian's ``chromium``, driven by Playwright as in
tests/test_ui_browser.py): the home page and the configuration reference are screenshotted and their visible text
checked. ``DAGSTER_GPU_DOCS_SCREENSHOTS=<dir>`` keeps the screenshots there (they are not committed).

mkdocs and mkdocs-material come with the ``docs`` extra; under ``CI=true`` their absence fails the test."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.chromium import chromium_path

ROOT = Path(__file__).resolve().parents[1]
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _need(module: str) -> None:
    try:
        __import__(module)
    except ImportError:
        msg = f"{module} is not installed (pip install -e '.[docs]')"
        if CI:
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    _need("mkdocs")
    _need("material")
    out = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    t0 = time.monotonic()
    cp = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - t0
    print(f"mkdocs build --strict: {seconds:.1f} s, {len(list(out.rglob('*.html')))} pages")
    assert cp.returncode == 0, f"mkdocs build --strict failed:\n{cp.stdout[-3000:]}\n{cp.stderr[-5000:]}"
    return out


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", page.read_text()))


def test_reference_pages_hold_every_setting_and_command(site):
    from scripts.docs.reference import command_names, settings_rows

    config = _text(site / "reference" / "configuration.html")
    rows = settings_rows()
    assert len(rows) > 60
    missing = [key for key, *_ in rows if key not in config]
    assert missing == [], f"settings missing from the configuration reference: {missing}"
    assert "slurm.slurm_partition" in config and "local.forkserver_idle_seconds" in config
    commands = _text(site / "reference" / "commands.html")
    names = command_names()
    assert {"backfill", "stale", "whatif", "report", "search"} <= set(names)
    for name in names:
        assert f"dagster-gpu {name}" in commands
    assert "--partitions" in commands and "--snapshot" in commands
    keys = _text(site / "reference" / "metadata-keys.html")
    assert "billing/gpu_seconds" in keys and "embedding/rows" in keys
    assert (site / "changelog.html").exists()


def test_site_loads_nothing_from_the_network(site):
    remote = []
    for page in site.rglob("*.html"):
        for m in re.finditer(r"<(?:script|link|img)\b[^>]*\b(?:src|href)=\"(https?:)?//[^\"]+\"", page.read_text()):
            remote.append(f"{page.relative_to(site)}: {m.group(0)[:120]}")
    assert remote == [], remote


def test_site_renders_in_chromium(site, tmp_path):
    chromium = chromium_path()
    _need("playwright")
    from playwright.sync_api import sync_playwright

    shots = Path(os.environ.get("DAGSTER_GPU_DOCS_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto((site / "index.html").as_uri(), wait_until="load")
            page.screenshot(path=str(shots / "docs-home.png"))
            page.get_by_role("heading", name="Where to start").wait_for(timeout=30_000)
            assert page.get_by_text("Backends and the cost policy").first.is_visible()
            page.goto((site / "reference" / "configuration.html").as_uri(), wait_until="load")
            page.screenshot(path=str(shots / "docs-configuration.png"))
            page.get_by_role("heading", name="Executor configuration").first.wait_for(timeout=30_000)
            cell = page.get_by_text("slurm.slurm_partition", exact=True).first
            cell.scroll_into_view_if_needed()
            assert cell.is_visible()
        finally:
            browser.close()
    assert errors == [], errors
    assert (shots / "docs-home.png").stat().st_size > 10_000
