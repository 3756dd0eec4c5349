"""``dagster-gpu report`` on a real instance: real materializations of the real asset (in process, CPU),
launch events carrying placements as the executor records them, then the HTML page."""

from __future__ import annotations

import os
import re
from dataclasses import replace

import dagster as dg
import pytest
from dagster._core.events import EngineEventData
from dagster._core.instance_for_test import instance_for_test

from dagster_gpu import CorpusSource, TextFormat, embedding_asset
from dagster_gpu.commands.report import collect, render_html, report_main, row_from, useful_fraction
from dagster_gpu.policy.placement import Alternative, Placement


def test_useful_fraction_sources():
    assert useful_fraction({"embedding/useful_fraction": 0.4, "embedding/seconds": 1.0}) == 0.4
    assert useful_fraction({"embedding/seconds": 3.0, "billing/wall_seconds": 12.0, "billing/gpu_seconds": 1.0}) == 0.25
    # a MIG slice: 1/7 device over 14 s of wall time bills 2 GPU-seconds; 7 s of embedding = half the wall
    assert useful_fraction({"embedding/seconds": 7.0, "billing/gpu_seconds": 2.0, "billing/devices": 1 / 7}) == pytest.approx(0.5)
    assert useful_fraction({"embedding/seconds": 3.0}) is None
    assert useful_fraction({"embedding/seconds": 30.0, "billing/wall_seconds": 12.0}) == 1.0  # clipped


def test_ranged_run_shares_its_estimate():
    p = Placement("slurm", "cheapest", device="A100", product="A100",
                  alternatives=(Alternative("slurm", device="A100", product="A100", cost_usd=0.09),))
    r = row_from("k", "run1", {"billing/cost_usd": 0.02, "dagster_gpu/backend": "slurm"},
                 {"dagster_gpu/placement": dg.MetadataValue.json(p.to_json())}, partitions_in_run=3)
    assert r.estimated_cost_usd == pytest.approx(0.03) and r.placement_reason == "cheapest"


def test_report_of_real_materializations(tmp_path, monkeypatch, capsys):
    d = tmp_path / "corpus"
    d.mkdir()
    sizes = {"small": 2, "medium": 12, "large": 40}
    for name, n in sizes.items():
        (d / name).write_text("".join(f"fortune number {i} of {name}\n%\n" for i in range(n)))
    corpus = CorpusSource(url=str(d), text_format=TextFormat(format="text", record_separator_line="%"))
    asset = embedding_asset(name="rep", corpus=corpus, output_url=str(tmp_path / "out"), device="cpu")
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("rep_files", list(sizes))
        run_ids = {}
        for pk in sizes:
            r = dg.materialize([asset], instance=instance, partition_key=pk)
            run_ids[pk] = r.run_id
        # the executor's launch event with the placement (here: two of the three runs)
        for pk, est in (("small", 0.0001), ("large", 0.0004)):
            p = Placement("local", "forced", device="cpu", alternatives=(Alternative("local", device="cpu", cost_usd=est),))
            instance.report_dagster_event(
                dg.DagsterEvent(event_type_value="STEP_WORKER_STARTING", job_name="__ephemeral_asset_job__", step_key="rep",
                                event_specific_data=EngineEventData(metadata={"dagster_gpu/placement": dg.MetadataValue.json(p.to_json()),
                                                                              "local/unit": f"u-{pk}"})),
                run_ids[pk])
        # the scheduler's bill of large's unit has landed (small's has not; medium ran in process: no unit)
        instance.report_runless_asset_event(dg.AssetObservation(asset.key, partition="large", metadata={
            "billing/source": "process", "billing/cost_usd": 0.0005, "billing/gpu_seconds": 36.0, "local/unit": "u-large"}))
        rows, failed = collect(instance, asset.key, last=10)
        assert [r.partition for r in rows] == ["small", "medium", "large"] and failed == []
        # a run that materialized nothing (its file is gone) is in the report too, with the partition and why
        instance.add_dynamic_partitions("rep_files", ["gone"])
        lost = dg.materialize([asset], instance=instance, partition_key="gone", raise_on_error=False)
        assert not lost.success
        rows, failed = collect(instance, asset.key, last=10, partitions_def_name="rep_files")
        assert [r.partition for r in rows] == ["small", "medium", "large"]
        assert [(k, rid) for k, rid, _ in failed] == [("gone", lost.run_id)]
        assert "no file in corpus" in failed[0][2] and "gone" in failed[0][2]
        assert collect(instance, asset.key, last=1)[1] == failed  # failed runs since the last materialization's run
        by = {r.partition: r for r in rows}
        assert {k: r.rows for k, r in by.items()} == sizes
        assert by["small"].estimated_cost_usd == 0.0001 and by["medium"].estimated_cost_usd is None
        assert (by["large"].billed_cost_usd, by["large"].bill_pending) == (0.0005, False)
        assert (by["small"].billed_cost_usd, by["small"].bill_pending) == (None, True)
        assert (by["medium"].unit, by["medium"].bill_pending) == (None, False)
        assert "<b>0.000500 (1 pending) USD</b>" in render_html(rows, failed, "t")
        assert all(r.backend == "local" and r.cost_usd > 0 and 0 < r.useful_fraction <= 1 for r in rows)
        assert all(r.utilization_percent is None and r.gpu_unavailable_reason.startswith("CPU-only") for r in rows)
        out = tmp_path / "report.html"
        assert os.environ["DAGSTER_HOME"] == instance.root_directory  # instance_for_test sets and restores it
        assert report_main(["-a", "rep", "--last", "2", "-o", str(out)]) == 0
        assert len(re.findall(r"<tr><td>(?:medium|large)</td>", out.read_text())) == 2
        assert f"<tr><td>gone</td><td><code>{lost.run_id}</code></td><td>" in out.read_text()
        assert report_main(["-a", "rep", "--backfill", "nope", "-o", str(out)]) == 2
        assert report_main(["-a", "nosuch", "--last", "2", "-o", str(out)]) == 2  # not an asset of this instance
        for bad in (["--last", "-3", "-o", str(out)], ["--last", "2", "-o", str(tmp_path / "no-dir" / "r.html")]):
            with pytest.raises(SystemExit) as e:
                report_main(["-a", "rep", *bad])  # argparse's error: usage and one line, exit 2
            assert e.value.code == 2
        # one partition failing in two runs: stdout counts it once, as the page does, and both runs
        lost_again = dg.materialize([asset], instance=instance, partition_key="gone", raise_on_error=False)
        assert not lost_again.success
        capsys.readouterr()
        assert report_main(["-a", "rep", "--last", "2", "-o", str(out)]) == 0
        assert "1 failed partition(s) in 2 failed run(s)" in capsys.readouterr().out
        assert ", 1 failed; measured cost" in out.read_text()
        page = render_html(rows, [("bad", "abcd1234", "a <b>reason</b>")], "rep: last 10")
    (tmp_path / "full.html").write_text(page)
    # cost, GPU-s, useful fraction, texts/s vs rows, estimate vs measured; a CPU run: no utilization chart, a sentence
    assert page.count("<svg ") == 5, page.count("<svg")
    assert "Mean GPU utilization: no GPU measured (CPU run)" in page
    assert "unavailable" in page  # CPU-only partitions: utilization marked, not drawn as 0 silently
    # self-contained: nothing fetched (namespaces are names, not requests)
    assert not re.search(r'(src|href)="(https?:)?//', page) and "<script" not in page and "<link" not in page
    assert "<tr><td>bad</td><td><code>abcd1234</code></td><td>a &lt;b&gt;reason&lt;/b&gt;</td></tr>" in page
    print(tmp_path / "full.html")


def _md(emb: float, wall: float) -> dict:
    return {"embedding/seconds": emb, "billing/wall_seconds": wall, "embedding/useful_fraction": emb / wall,
            "embedding/rows": 10, "dagster_gpu/backend": "local", "billing/cost_usd": wall * 1e-5,
            "billing/gpu_seconds": wall}


def test_useful_fraction_is_one_ratio_of_sums_in_the_cli_and_the_report():
    """One partition of 1 s of 10 measured, one of 90 of 100: 91 ÷ 110 = 0.827 (the mean of ratios, 0.5, is not
    the share of measured time that embedded). The CLI's summary and the HTML report give the same figure."""
    from dagster_gpu.commands.backfill import PartitionSummary
    from dagster_gpu.billing.metering import useful_fraction as ratio_of_sums
    from dagster_gpu.commands.report import total_useful_fraction
    from dagster_gpu.commands.progress import useful_fraction as cli_useful_fraction

    mds = {"tiny": _md(1.0, 10.0), "big": _md(90.0, 100.0)}
    rows = [row_from(k, "r1", md, None) for k, md in mds.items()]
    cli_rows = [PartitionSummary(k, ok=True, seconds=md["embedding/seconds"], billed_seconds=md["billing/wall_seconds"])
                for k, md in mds.items()] + [PartitionSummary("bad", ok=False, error="x")]
    assert total_useful_fraction(rows) == pytest.approx(91 / 110)
    assert cli_useful_fraction(cli_rows) == pytest.approx(91 / 110)
    assert [r.useful_fraction for r in rows] == [pytest.approx(0.1), pytest.approx(0.9)]
    assert ratio_of_sums([(None, 3.0), (1.0, None)]) is None and ratio_of_sums([(5.0, 4.0)]) == 1.0  # clipped
    page = render_html(rows, [], "t")
    assert "useful fraction <b>0.827</b>" in page
    assert "<td>0.827</td></tr>" in page  # the per-backend row: the same ratio of sums, not a mean of ratios


def test_report_counts_partitions_and_marks_the_pruned_one():
    """11 materializations of 8 partitions (3 materialized twice), one of them since pruned."""
    keys = [f"p{i}" for i in range(8)]
    rows = [row_from(k, f"r{i}", _md(1.0, 2.0), None) for i, k in enumerate(keys + keys[:3])]
    page = render_html(rows, [("p9", "r9", "bad")], "t", registered=set(keys) - {"p1"})
    assert "11 materialization(s) of 8 partition(s) (1 since pruned: p1), 1 failed" in page
    assert "11 partition(s)" not in page
    assert page.count('(pruned)</span>') == 2  # p1's two rows
    assert re.search(r"<tr><td>p1 <span class=\"pruned\"", page) and "<tr><td>p2</td>" in page
    # a backfill's page, one materialization each: "partition(s) materialized", nothing marked without registered
    page = render_html(rows[:8], [], "t")
    assert "8 partition(s) materialized, 0 failed" in page and "(pruned)" not in page


def test_policy_estimate_is_shown_beside_the_measured_outcome():
    p = Placement("local", "cheapest", device="cpu",
                  alternatives=(Alternative("local", device="cpu", runtime_s=24.0, cost_usd=0.0004),))
    launch = {"dagster_gpu/placement": dg.MetadataValue.json(p.to_json())}
    rows = [row_from(k, "r1", _md(4.0, 10.0), launch, partitions_in_run=2) for k in ("a", "b")]
    assert [(r.estimated_seconds, r.measured_seconds) for r in rows] == [(12.0, 10.0), (12.0, 10.0)]
    page = render_html(rows, [], "t")
    # per backend: 2 × 0.0002 estimated against 2 × 0.0001 measured
    assert "<td>0.000400 (×2.00 of measured)</td>" in page
    assert "<td>10.0</td><td>12.0</td>" in page  # measured s, estimate s


def test_no_estimates_sentence_matches_the_row_reasons():
    from dagster_gpu.commands.report import no_estimates

    only = Placement("local", "auto: local is the only configured backend", device="cpu",
                     alternatives=(Alternative("local", device="cpu", note="only configured backend"),))
    rows = [row_from(k, "r1", _md(1.0, 2.0), {"dagster_gpu/placement": dg.MetadataValue.json(only.to_json())})
            for k in ("a", "b")]
    page = render_html(rows, [], "t")
    assert "local was the only configured backend, so there was no choice to estimate" in page
    assert "forced" not in no_estimates(rows)
    forced = Placement("slurm", "forced by tag dagster-gpu/backend=slurm", alternatives=(Alternative("slurm"),))
    rows.append(row_from("c", "r2", _md(1.0, 2.0), {"dagster_gpu/placement": dg.MetadataValue.json(forced.to_json())}))
    assert "forced" in no_estimates(rows)


def test_all_reused_partition_shows_no_throughput():
    md = {**_md(0.1, 2.0), "embedding/rows": 40, "embedding/reused_rows": 40, "embedding/texts_per_second": 0.0}
    partly = {**md, "embedding/reused_rows": 10, "embedding/texts_per_second": 300.0}
    gone, some = row_from("all", "r1", md, None), row_from("part", "r1", partly, None)
    assert (gone.texts_per_second, some.texts_per_second) == (None, 300.0)
    page = render_html([gone, some], [], "t")
    assert "<td>40</td><td>–</td>" in page and "<td>40</td><td>300.0</td>" in page and "<td>0.0</td>" not in page


def test_hundreds_of_partitions_are_histograms_and_the_schedulers_bill_is_one_total_with_the_cli():
    """273 partitions: each per-partition chart is a histogram (20 bins, stacked by backend; 273 bars were 20-px
    strips with unreadable labels). The scheduler's bill is one total, the failed partitions' shares included, in
    the report and in the CLI summary alike."""
    from dagster_gpu.commands.backfill import PartitionSummary
    from dagster_gpu.commands.progress import print_summary
    from dagster_gpu.commands.report import MAX_BARS, FailedBill
    from dagster_gpu.instance.bills import SCHEDULERS_BILL, BilledShare
    from rich.console import Console

    keys = [f"file-{i:03d}" for i in range(273)]
    unit = ("local/unit", "u1")
    rows = [replace(row_from(k, "r1", _md(1.0 + i % 7, 10.0), None), unit=unit, bill=BilledShare(0.001, 1.0, "process"))
            for i, k in enumerate(keys)]
    failed = [("bad-1", "r1", "x"), ("bad-2", "r1", "x")]
    bills = [FailedBill(k, unit, BilledShare(0.0005, 0.5, "process")) for k, _, _ in failed]
    page = render_html(rows, failed, "t", failed_bills=bills)
    assert len(rows) > MAX_BARS
    assert page.count("<svg ") == 5  # the four per-partition charts and texts/s against rows (no estimates)
    first = page[page.index("<svg "):page.index("</svg>")]
    assert 20 <= first.count('<g id="patch_') < 30  # 20 bins (and the axes' frame), not 273 bars
    assert page.count("(273 partitions") == 4  # each histogram's title says how many
    total = f"{273 * 0.001 + 2 * 0.0005:.6f}"
    assert f"{SCHEDULERS_BILL}: <b>{total} USD</b>" in page.replace("&#x27;", "'")
    cli = [PartitionSummary(k, ok=True, rows=10, bill=BilledShare(0.001, 1.0, "process"), unit=unit) for k in keys]
    cli += [PartitionSummary(k, ok=False, error="x", bill=BilledShare(0.0005, 0.5, "process"), unit=unit) for k, _, _ in failed]
    con = Console(record=True, width=400)
    with dg.instance_for_test() as instance:
        print_summary(con, instance, cli, title="Backfill x")
    assert f"{SCHEDULERS_BILL[0].upper()}{SCHEDULERS_BILL[1:]}: {total} USD" in con.export_text()


def test_the_report_groups_a_fleet_by_cluster():
    """Materializations naming their cluster (dagster_gpu/cluster) are totalled per cluster, the kind beside it;
    one without a cluster (today's single section) stays under its backend."""
    def md(backend, cluster, cost):
        out = {**_md(1.0, 2.0), "dagster_gpu/backend": backend, "billing/cost_usd": cost}
        return {**out, "dagster_gpu/cluster": cluster} if cluster else out
    rows = [row_from("a", "r1", md("slurm", "campus", 0.25), None), row_from("b", "r1", md("slurm", "campus", 0.5), None),
            row_from("c", "r1", md("slurm", "dept", 0.125), None), row_from("d", "r1", md("kubernetes", None, 1.0), None)]
    assert [r.where for r in rows] == ["campus (slurm)", "campus (slurm)", "dept (slurm)", "kubernetes"]
    page = render_html(rows, [], "t")
    assert "<h2>Per cluster</h2>" in page
    assert re.search(r"<tr><td>campus \(slurm\)</td><td>2</td><td>2</td><td>\d+</td><td>[\d.]+</td><td>0\.750000</td>", page)
    assert re.search(r"<tr><td>dept \(slurm\)</td><td>1</td><td>1</td><td>\d+</td><td>[\d.]+</td><td>0\.125000</td>", page)
    assert re.search(r"<tr><td>kubernetes</td><td>1</td><td>1</td><td>\d+</td><td>[\d.]+</td><td>1\.000000</td>", page)


def test_cost_axis_labels_are_short_and_a_cpu_run_has_no_empty_utilization_chart():
    """Costs of a few ten-thousandths of a dollar: the histogram's x tick labels were 0.00015, 0.00020, … side by
    side (touching); now at most 6 round ticks as a mantissa with one power of ten. A run on CPU only has no GPU
    utilization: a sentence, not an empty 0–100 frame."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dagster_gpu.commands.report import MAX_BARS, readable_ticks

    costs = [0.00012 + 0.0000031 * i for i in range(50)]
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.hist(costs, bins=20)
    readable_ticks(ax.xaxis)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert 2 <= len(labels) <= 6 and all(len(x.replace("$", "").replace("\\mathdefault{", "").rstrip("}")) <= 4
                                          for x in labels), labels
    assert "10^{\u22124}" in ax.xaxis.get_offset_text().get_text(), ax.xaxis.get_offset_text().get_text()  # ×10⁻⁴
    plt.close(fig)

    cpu = {"billing/device_type": "cpu"}
    rows = [row_from(f"f{i}", "r1", {**_md(1.0, 2.0 + i / 10), **cpu}, None) for i in range(MAX_BARS + 5)]
    page = render_html(rows, [], "t")
    assert "Mean GPU utilization: no GPU measured (CPU run)" in page and "Mean GPU utilization\n" not in page
    assert page.count("<svg ") == 4  # cost, seconds, useful fraction, texts/s against rows
    gpu = [replace(rows[0], device="cuda", utilization_percent=63.0), *rows[1:]]
    assert "no GPU measured" not in render_html(gpu, [], "t")


def test_a_cpu_run_names_its_seconds_cpu_seconds_in_the_report_and_the_cli_summary():
    """Every partition measured on the CPU (``billing/device_type`` ``cpu``): the report's seconds chart and the CLI
    summary's column say CPU-seconds; one GPU partition among them: GPU-seconds."""
    from rich.console import Console

    from dagster_gpu.commands.backfill import PartitionSummary
    from dagster_gpu.commands.progress import summary_table

    rows = [row_from(f"f{i}", "r1", {**_md(1.0, 2.0), "billing/device_type": "cpu"}, None) for i in range(3)]
    page = render_html(rows, [], "t")
    assert "Measured CPU-seconds per partition" in page and "Measured GPU-seconds per partition" not in page
    assert "Measured GPU-seconds per partition" in render_html([replace(rows[0], device="NVIDIA H100"), *rows[1:]], [], "t")

    def header(device_types):
        con = Console(record=True, width=300)
        con.print(summary_table([PartitionSummary(f"f{i}", ok=True, rows=1, gpu_seconds=2.0, device_type=d)
                                 for i, d in enumerate(device_types)]))
        return con.export_text()

    assert "measured CPU-s" in header(["cpu", "cpu"]) and "GPU-s" not in header(["cpu", "cpu"])
    assert "measured GPU-s" in header(["cpu", "NVIDIA H100"])
