"""The asset page in a real browser: dagster-webserver on a small instance, headless Chromium (Debian's
``chromium`` package, driven by Playwright through ``executable_path``).

Two partitions materialized with metadata from the real builder (``worker.metadata.build_metadata``):
one on a GPU (utilization, memory), one CPU-only whose GPU figures are unavailable. The Plots view must
draw the key figures and no plot of a setting (dimension, devices, rate), a partition's metadata must show
measured floats rounded (the UI prints a float's full repr), a partition's page must show the scheduler's
bill (rounded, under ``bill/*`` beside the measured ``billing/*``) and a failed partition's reason
(``dagster_gpu/partition_failure``), the corpus node in the lineage must count its
recorded files as filled, and the page must raise no page error. Under ``CI=true`` a missing Chromium is a
failure, not a skip (``scripts/test.sh`` installs it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dagster as dg

from tests.chromium import chromium_path
from tests.process_helpers import free_port

REPO = Path(__file__).resolve().parents[1]
KEY_FIGURES = ("embedding/rows", "embedding/texts_per_second", "gpu/utilization_mean_percent",
               "billing/gpu_seconds", "billing/cost_usd")
#: The step's settings: the same on every partition, stored as text so the Plots view draws no flat line for them.
SETTINGS = ("embedding/dim", "billing/devices", "billing/rate_usd_per_gpu_hour", "embedding/torch_threads")




def _metadata(gpu: bool, rows: int) -> dict:
    from dagster_gpu.embedding.pipeline import EmbeddingResult
    from dagster_gpu.policy.placement import Alternative, Placement
    from dagster_gpu.telemetry.stats import summarize
    from dagster_gpu.billing.measured import measure
    from dagster_gpu.worker.metadata import build_metadata

    result = EmbeddingResult(rows=rows, records=rows + 1, skipped_empty_rows=1, truncated_rows=0, dim=384,
                             seconds=rows / 500, output_uri=f"/out/{rows}.parquet")
    if gpu:
        telemetry = summarize([70, 80, 90], [900.0, 1200.0], ("GPU-1",), "NVIDIA A100-SXM4-80GB")
        billing = measure({"NVIDIA A100-SXM4-80GB": 1.2}, 40.0, "cuda", "NVIDIA A100-SXM4-80GB", 1)
        placement = Placement("slurm", "least expected cost", device="NVIDIA A100-SXM4-80GB", product="NVIDIA A100-SXM4-80GB",
                              alternatives=(Alternative("slurm", device="NVIDIA A100-SXM4-80GB", product="NVIDIA A100-SXM4-80GB",
                                                        start_delay_s=5, runtime_s=30, cost_usd=0.012),
                                            Alternative("kubernetes", feasible=False, note="unreachable")))
        return build_metadata(result=result, model_name="all-MiniLM-L6-v2", model_device="cuda", telemetry=telemetry,
                              billing=billing, backend="slurm", placement=placement)
    telemetry = summarize([], [], unavailable_reason="no NVIDIA driver: NVML unavailable")
    billing = measure({"cpu": 0.05}, 60.0, "cpu", None, 0)
    return build_metadata(result=result, model_name="all-MiniLM-L6-v2", model_device="cpu", telemetry=telemetry,
                          billing=billing, backend="local", placement=Placement("local", "forced by config"))


def test_asset_page_plots_key_figures_in_chromium(tmp_path, monkeypatch):
    chromium = chromium_path()
    from playwright.sync_api import sync_playwright

    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("gpu_part", "cpu_part"):
        (corpus / name).write_text("a fortune\n%\n")
    (tmp_path / "workspace.yaml").write_text(
        f"load_from:\n  - python_file:\n      relative_path: {REPO / 'tests' / 'locations' / 'ui_location.py'}\n"
        f"      working_directory: {REPO}\n      location_name: ui\n")
    env = {**os.environ, "DAGSTER_HOME": str(home), "DAGSTER_GPU_UI_CORPUS": str(corpus),
           "DAGSTER_GPU_UI_OUTPUT": str(tmp_path / "out")}
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.get() as instance:
        instance.add_dynamic_partitions("ui_embeddings_files", ["gpu_part", "cpu_part"])
        # what a corpus sensor tick records for the two files (dagster_gpu.partitions.source_versions.corpus_updates)
        from dagster_gpu import CorpusSource
        from dagster_gpu.partitions.source_versions import corpus_updates

        for ev in corpus_updates(dg.AssetKey("ui_embeddings_corpus"), CorpusSource(url=str(corpus)).list_files(), {}):
            instance.report_runless_asset_event(ev)
        for pk, gpu, rows in (("gpu_part", True, 1200), ("cpu_part", False, 300)):
            instance.report_runless_asset_event(dg.AssetMaterialization("ui_embeddings", partition=pk, metadata=_metadata(gpu, rows)))
    port = free_port()
    log = open(tmp_path / "webserver.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "dagster_webserver", "-w", str(tmp_path / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    errors: list[str] = []
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2).read()
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "webserver.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "dagster-webserver did not answer; log: " + str(tmp_path / "webserver.log")
                time.sleep(1)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 2000})
            page.on("pageerror", lambda e: errors.append(str(e)))
            # the first visit's "Join the Dagster community" dialog may open at any time: dismiss it whenever it does
            page.add_locator_handler(page.get_by_role("button", name="Skip"), lambda skip: skip.click())
            page.goto(f"http://127.0.0.1:{port}/assets/ui_embeddings", wait_until="networkidle", timeout=120_000)
            # the Overview tab's Metadata section: Table | Plots (dagster-webserver 1.13.27)
            page.get_by_text("Plots", exact=True).first.click(timeout=60_000)
            shot = Path(os.environ.get("DAGSTER_GPU_UI_SCREENSHOT", tmp_path / "plots.png"))
            try:
                for key in KEY_FIGURES:
                    page.get_by_text(key, exact=True).first.wait_for(timeout=60_000)
            finally:
                page.screenshot(path=str(shot), full_page=True)  # what the page showed, for a failed assertion
            drawn = [key for key in SETTINGS if page.get_by_text(key, exact=True).count()]
            assert drawn == [], f"settings plotted as figures: {drawn} (screenshot {shot})"
            # the CPU-only partition's GPU figures are left out, never drawn as 0: its utilization plot has one point
            page.goto(f"http://127.0.0.1:{port}/assets/ui_embeddings?view=events", wait_until="networkidle", timeout=120_000)
            page.get_by_text("cpu_part", exact=True).first.click()
            page.get_by_text("gpu/unavailable_reason").first.wait_for(timeout=60_000)
            assert page.get_by_text("gpu/utilization_mean_percent").count() == 0
            # 60 s at 0.05 USD/h = 0.000833333... USD: shown with 4 significant digits, not as a 17-digit repr
            assert page.get_by_text("0.0008333", exact=True).count() >= 1
            assert page.get_by_text("0.00083333333", exact=False).count() == 0
            # then cpu_part's scheduler bill lands, as the bill writer stores it (a 50-partition unit's process
            # interval), and a later run of gpu_part fails, as the unit records it
            from dagster_gpu.executor.bill_writer import observation_metadata
            from dagster_gpu.instance.checks import partition_failure_observation

            with dg.DagsterInstance.get() as instance:
                instance.report_runless_asset_event(dg.AssetObservation("ui_embeddings", partition="cpu_part", metadata=observation_metadata({
                    "billing/source": "process", "billing/gpu_seconds": 1042.0829971957237, "billing/cost_usd": 0.01447337496105172,
                    "billing/unit_gpu_seconds": 52104.14985978619, "local/unit": "u1", "local/unit_wall_seconds": 52104.14985978619},
                    cpu=False)))
                instance.report_runless_asset_event(partition_failure_observation(
                    dg.AssetKey("ui_embeddings"), "gpu_part", "partition 'gpu_part': line 3 is not valid JSON"))
            # a partition's page: the scheduler's bill under its own keys, rounded, beside the measured figures
            # (bill/gpu_seconds does not replace billing/gpu_seconds); a failed partition's reason
            page.goto(f"http://127.0.0.1:{port}/assets/ui_embeddings?view=partitions&partition=cpu_part",
                      wait_until="networkidle", timeout=120_000)
            try:
                page.get_by_text("bill/gpu_seconds", exact=True).first.wait_for(timeout=60_000)
                assert page.get_by_text("billing/gpu_seconds", exact=True).count() >= 1
                assert page.get_by_text("bill/unit_gpu_seconds", exact=True).count() >= 1
                assert page.get_by_text("local/unit_wall_seconds", exact=True).count() >= 1
                assert page.get_by_text("1042", exact=True).count() >= 1 and page.get_by_text("0.01447", exact=True).count() >= 1
                assert page.get_by_text("1042.0829", exact=False).count() == 0
                assert page.get_by_text("0.0144733", exact=False).count() == 0
            finally:
                page.screenshot(path=str(shot.with_name("bill.png")), full_page=True)
            page.goto(f"http://127.0.0.1:{port}/assets/ui_embeddings?view=partitions&partition=gpu_part",
                      wait_until="networkidle", timeout=120_000)
            try:
                page.get_by_text("dagster_gpu/partition_failure", exact=True).first.wait_for(timeout=60_000)
                assert page.get_by_text("partition 'gpu_part': line 3 is not valid JSON", exact=False).count() >= 1
            finally:
                page.screenshot(path=str(shot.with_name("failure.png")), full_page=True)
            # the lineage: the corpus node counts its files filled, as the embeddings node does (the node's
            # Partitions facet, "<n>% filled", counts materializations only)
            page.goto(f"http://127.0.0.1:{port}/asset-groups", wait_until="networkidle", timeout=120_000)
            page.get_by_text("ui_embeddings_corpus").first.wait_for(timeout=60_000)
            page.get_by_text("100% filled").first.wait_for(timeout=60_000)
            try:
                assert page.get_by_text("100% filled").count() == 2 and page.get_by_text("0% filled", exact=True).count() == 0
            finally:
                page.screenshot(path=str(shot.with_name("lineage.png")), full_page=True)
            browser.close()
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
    assert errors == [], errors
