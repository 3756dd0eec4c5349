"""The what-if planner and CLI on a small corpus directory and a snapshot file."""

import json
from pathlib import Path

import pytest

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.corpus import CorpusSource
from dagster_gpu.policy import DeviceGroup, KubernetesState, RuntimeModel, SlurmState, Snapshot
from dagster_gpu.commands.whatif import list_partitions, whatif_main
from dagster_gpu.policy.whatif import plan, totals
from dagster_gpu.core.request import GpuRequest

A100 = "NVIDIA A100-SXM4-80GB"


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(3):
        (d / f"day{i}.jsonl").write_bytes(b"x" * (200_000 * (i + 1)))  # 1k, 2k, 3k rows at 200 B/row
    return d


@pytest.fixture
def snapfile(tmp_path):
    sn = Snapshot(
        rate_card=RateCard.load(),
        slurm=SlurmState(pools=(DeviceGroup(A100, A100, 80, 1, 1),), launch_latency_s=5, billed_overhead_s=20),
        kubernetes=KubernetesState(pools=(DeviceGroup(A100, A100, 80, 2, 2),), launch_latency_s=10,
                                   billed_overhead_s=30),
    )
    p = tmp_path / "snap.json"
    p.write_text(json.dumps(sn.to_json()))
    return p, sn


def test_list_partitions(corpus):
    assert list_partitions(CorpusSource(url=str(corpus))) == [
        ("day0.jsonl", 200_000), ("day1.jsonl", 400_000), ("day2.jsonl", 600_000)]


def test_whatif_plans_the_assets_partition_keys(tmp_path, capsys, monkeypatch):
    """The keys whatif plans are the keys the asset registers for the same corpus (CorpusSource's derivation:
    the file name, suffix kept; rewritten names hashed; sub-directories joined with ``__`` when recursive)."""
    import sys

    import dagster as dg

    from dagster_gpu import embedding_asset
    from dagster_gpu.definitions.partitions import register_corpus_files

    d = tmp_path / "mixed"
    (d / "2024").mkdir(parents=True)
    for name in ("art", "cookie.txt", "notes.tar.gz", "my file.jsonl", "2024/day0.jsonl", ".hidden", "_tmp.parquet"):
        (d / name).write_bytes(b"x" * 100)
    module = tmp_path / "whatif_defs_mod.py"
    module.write_text(
        "import dagster as dg\n"
        "from dagster_gpu import CorpusSource, embedding_asset\n"
        f"corpus = CorpusSource(url={str(d)!r}, recursive=True)\n"
        f"emb = embedding_asset(name='emb', corpus=corpus, output_url={str(tmp_path / 'out')!r}, device='cpu')\n"
        "defs = dg.Definitions(assets=[emb])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "whatif_defs_mod", raising=False)
    snapshot = str(Path(__file__).resolve().parents[1] / "resources" / "whatif-snapshot.json")
    for recursive in (False, True):
        corpus = CorpusSource(url=str(d), recursive=recursive)
        asset = embedding_asset(name="emb", corpus=corpus, output_url=str(tmp_path / "out"), device="cpu")
        with dg.instance_for_test() as instance:
            registered = register_corpus_files(instance, asset, corpus)
        argv = [str(d), "--snapshot", snapshot, "--json"] + (["--recursive"] if recursive else [])
        assert whatif_main(argv) == 0
        planned = [r["partition"] for r in json.loads(capsys.readouterr().out)["plans"]["auto"]]
        assert planned == sorted(registered)
        assert {"art", "cookie.txt", "notes.tar.gz"} <= set(planned)
        assert ("2024__day0.jsonl" in planned) is recursive
        assert [k for k in planned if k.startswith("my_file.jsonl-")]  # rewritten and hashed, as the asset does
    # -m MODULE --asset: the asset's own corpus (recursive there), no CORPUS argument needed
    assert whatif_main(["-m", "whatif_defs_mod", "--asset", "emb", "--snapshot", snapshot, "--json"]) == 0
    assert [r["partition"] for r in json.loads(capsys.readouterr().out)["plans"]["auto"]] == sorted(registered)
    assert whatif_main([str(tmp_path), "-m", "whatif_defs_mod", "--asset", "emb", "--snapshot", snapshot]) == 2
    assert "is not asset emb's corpus" in capsys.readouterr().err
    assert whatif_main(["--snapshot", snapshot]) == 2
    assert "CORPUS is required" in capsys.readouterr().err


def test_plan_queues_behind_earlier_partitions(corpus, snapfile):
    _p, sn = snapfile
    parts = list_partitions(CorpusSource(url=str(corpus)))
    model = RuntimeModel(texts_per_second=10.0)  # rows: 1000/2000/3000 -> 100/200/300 s work
    rows = plan(parts, GpuRequest(), sn, model, "slurm")
    # one Slurm GPU: the first starts now, the others queue
    # (the third: two waves of its own 320 s, the formula assumes each step ahead is as long as this one)
    assert [r.placement.chosen.start_delay_s for r in rows] == [5.0, 5.0 + 220.0, 5.0 + 2 * 320.0]
    assert sum(r.cost_usd for r in rows) == pytest.approx(1.2 * (120 + 220 + 320) / 3600)
    # with a 300 s deadline, auto sends what Slurm cannot finish in time to Kubernetes
    auto = plan(parts, GpuRequest(deadline_s=400), sn, model, "auto")
    assert [r.placement.backend for r in auto] == ["slurm", "kubernetes", "kubernetes"]


def test_totals_of_a_plan(corpus, snapfile):
    """A mode's totals: the partitions' costs summed, per-backend counts, misses of the unit's deadline, and
    for a mode that cannot place a partition the count and its reason (no total)."""
    _p, sn = snapfile
    parts = list_partitions(CorpusSource(url=str(corpus)))
    model = RuntimeModel(texts_per_second=10.0)
    t = totals(plan(parts, GpuRequest(deadline_s=400), sn, model, "auto"))
    assert t.cost_usd == pytest.approx(sum(r.cost_usd for r in plan(parts, GpuRequest(deadline_s=400), sn, model, "auto")))
    assert (t.infeasible, t.backends, t.first_error) == (0, {"slurm": 1, "kubernetes": 2}, "")
    slurm = totals(plan(parts, GpuRequest(deadline_s=400), sn, model, "slurm"))
    # one Slurm GPU: the second and third queue past 400 s (start 225 s + 220 s, 645 s + 320 s)
    assert (slurm.deadline_misses, slurm.last_finish_s) == (2, pytest.approx(5.0 + 2 * 320.0 + 320.0))
    none = totals(plan(parts, GpuRequest.from_tags({"dagster-gpu/gpu-count": "9"}), sn, model, "kubernetes"))
    assert (none.infeasible, none.backends, none.cost_usd) == (3, {}, 0.0)
    assert none.first_error.startswith("no feasible placement") and len(none.first_error) <= 80


def test_a_backfill_is_planned_in_runs_of_its_partitions_per_run_each_one_work_unit(corpus, snapfile, capsys):
    """Found by a new-user run: whatif priced every partition as its own unit (its own start-up), while the
    backfill ran the 4 files as one ranged run, one Slurm array task."""
    p, sn = snapfile
    parts = list_partitions(CorpusSource(url=str(corpus)))
    model = RuntimeModel(texts_per_second=10.0)  # 100/200/300 s of work
    one = plan(parts, GpuRequest(), sn, model, "slurm", per_run=len(parts))
    assert {r.unit for r in one} == {0} and len({id(r.placement) for r in one}) == 1  # one unit, one placement
    unit = one[0].placement.chosen
    # one Slurm start-up (20 s) + each partition's overhead and work, on the one GPU, started at once
    assert unit.start_delay_s == 5.0 and unit.runtime_s == pytest.approx(20.0 + 3 * model.per_partition_s + 600.0)
    assert sum(r.cost_usd for r in one) == pytest.approx(unit.cost_usd)  # shares add up to the unit's cost
    assert [r.share for r in one] == pytest.approx([b / sum(b for _, b in parts) for _, b in parts])
    apart = plan(parts, GpuRequest(), sn, model, "slurm", per_run=1)
    assert sum(r.cost_usd for r in one) < sum(r.cost_usd for r in apart)  # two start-ups fewer
    assert [r.unit for r in plan(parts, GpuRequest(), sn, model, "slurm", per_run=2)] == [0, 0, 1]
    with pytest.raises(ValueError, match="per_run must be at least 1"):
        plan(parts, GpuRequest(), sn, model, "slurm", per_run=0)
    # the CLI: 50 per run without -m (embedding_asset's default), --per-run to change it
    assert whatif_main([str(corpus), "--snapshot", str(p), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["partitions_per_run"] == 50 and {r["unit"] for r in doc["plans"]["auto"]} == {0}
    assert whatif_main([str(corpus), "--snapshot", str(p), "--json", "--per-run", "1"]) == 0
    assert [r["unit"] for r in json.loads(capsys.readouterr().out)["plans"]["auto"]] == [0, 1, 2]


def test_whatif_cli_prints_totals(corpus, snapfile, capsys):
    p, _sn = snapfile
    assert whatif_main([str(corpus), "--snapshot", str(p), "--tag", "dagster-gpu/deadline-seconds=400"]) == 0
    out = capsys.readouterr().out
    assert "auto (policy)" in out and "all-slurm" in out and "all-kubernetes" in out and "day1.jsonl" in out
    assert whatif_main([str(corpus), "--snapshot", str(p), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["totals_usd"]) == {"auto", "slurm", "kubernetes"}
    assert doc["totals_usd"]["auto"] <= doc["totals_usd"]["kubernetes"]


def test_whatif_cli_bad_input(tmp_path, capsys):
    assert whatif_main([str(tmp_path), "--snapshot", str(tmp_path / "missing.json")]) == 2
    assert "whatif:" in capsys.readouterr().err


# -- live state, the instance's history, saved snapshots -------------------------------------------
def test_whatif_live_local_only_saves_a_snapshot_that_plans_offline(corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    saved = tmp_path / "live.json"
    assert whatif_main([str(corpus), "--save-snapshot", str(saved), "--json"]) == 0
    live = json.loads(capsys.readouterr().out)
    snap = json.loads(saved.read_text())
    assert snap["local"]["reachable"] is True and "slurm" not in snap and "kubernetes" not in snap
    assert live["runtime_model"].startswith("fallback (no history)")
    # local is the only backend: planned there as the executor runs it (on this host's CPU when it has no GPU)
    from dagster_gpu.telemetry.nvml import list_gpus

    devices = {r["placement"]["device"] for r in live["plans"]["auto"]}
    assert devices == ({"cpu"} if not list_gpus() else {g.product for g in list_gpus()})
    if not list_gpus():  # a CPU-only host: the fallback named is the measured CPU figure, and no GPU one
        assert "CPU 46.3 texts/s (measured" in live["runtime_model"] and "GPU" not in live["runtime_model"]
        alt = live["plans"]["auto"][0]["placement"]["alternatives"][0]
        assert alt["runtime_s"] > 200_000 / 200 / 46.3  # day0: 1,000 rows at 46.3 texts/s, plus the start-up
    assert {r["placement"]["backend"] for r in live["plans"]["auto"]} == {"local"} and live["infeasible"]["auto"] == 0
    # and it says why as the executor does: no config forced it (a newcomer read "forced by gpu_executor config")
    assert {r["placement"]["reason"] for r in live["plans"]["auto"]} == {"auto: local is the only configured backend"}
    # modes whose backend is not configured have no total (not 0 USD) and count every partition infeasible
    n = len(live["plans"]["auto"])
    assert (live["totals_usd"]["slurm"], live["infeasible"]["slurm"]) == (None, n)
    assert live["totals_usd"]["auto"] > 0
    assert whatif_main([str(corpus), "--snapshot", str(saved), "--json"]) == 0
    offline = json.loads(capsys.readouterr().out)
    assert offline["plans"] == live["plans"]
    assert whatif_main([str(corpus), "--snapshot", str(saved), "--save-snapshot", str(saved)]) == 2
    assert "cannot be combined" in capsys.readouterr().err


def test_whatif_missing_snapshot_says_what_to_do(corpus, tmp_path, capsys):
    assert whatif_main([str(corpus), "--snapshot", str(tmp_path / "snapshot.json")]) == 2
    err = capsys.readouterr().err
    assert "leave --snapshot out to plan on live state" in err and "resources/whatif-snapshot.json" in err


def test_shipped_example_snapshot_plans(corpus, capsys):
    example = Path(__file__).resolve().parents[1] / "resources" / "whatif-snapshot.json"
    assert whatif_main([str(corpus), "--snapshot", str(example), "--tag", "dagster-gpu/mig-ok=true", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # a MIG slice on Kubernetes is cheaper than a whole A100 on Slurm for these small partitions
    assert {r["placement"]["device"] for r in doc["plans"]["auto"]} == {"mig-1g.10gb"}
    assert doc["totals_usd"]["auto"] < doc["totals_usd"]["slurm"]


def test_whatif_reads_the_assets_history_from_the_instance(corpus, capsys, monkeypatch):
    import dagster as dg

    with dg.instance_for_test() as instance:  # sets DAGSTER_HOME
        for tps in (100.0, 300.0, 200.0):
            instance.report_runless_asset_event(dg.AssetMaterialization(
                "emb", partition="p", metadata={"embedding/rows": 1000, "embedding/texts_per_second": tps,
                                                "gpu/product_name": A100}))
        assert whatif_main([str(corpus), "--asset", "emb", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["runtime_model"] == (
            "history of 3 materialization(s): GPU median 200 texts/s (3 on a GPU); 200 bytes/row")


def test_whatif_asks_the_live_slurm_cluster(corpus, tmp_path, capsys, monkeypatch):
    import yaml

    from tests.slurm_helpers import cluster_unavailable_reason, slurm_conf

    reason = cluster_unavailable_reason()
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv("SLURM_CONF", slurm_conf())
    cfg = tmp_path / "executor.yaml"
    cfg.write_text(yaml.safe_dump({"execution": {"config": {"backend": "auto", "slurm": {"account": "research"}}}}))
    saved = tmp_path / "live.json"
    assert whatif_main([str(corpus), "--executor-config", str(cfg), "--save-snapshot", str(saved), "--json"]) == 0
    snap = json.loads(saved.read_text())
    assert snap["slurm"]["reachable"] is True, snap["slurm"]["reason"]
    pools = snap["slurm"]["pools"]
    assert [(p["device"], p["total"]) for p in pools] == [(A100, 4)]  # resources/slurm: 4 GPU GRES
    doc = json.loads(capsys.readouterr().out)
    assert {r["placement"]["backend"] for r in doc["plans"]["auto"]} == {"slurm"}


def test_console_script_imports_the_code_location_from_the_working_directory(tmp_path):
    """``.venv/bin/dagster-gpu whatif -m pipelines.definitions`` run from the repository root (as the README
    shows): the console script's sys.path lacks the working directory, the CLI adds it."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    d = tmp_path / "fortunes"
    d.mkdir()
    for name in ("art", "cookie.txt"):
        (d / name).write_text("one\n%\ntwo\n%\n")
    script = Path(sys.executable).parent / "dagster-gpu"
    env = {**os.environ, "DAGSTER_GPU_CORPUS_URL": str(d)}
    env.pop("DAGSTER_HOME", None)
    cp = subprocess.run(
        [str(script), "whatif", "-m", "pipelines.definitions", "-a", "fortune_embeddings", "--json",
         "--snapshot", str(repo / "resources" / "whatif-snapshot.json")],
        cwd=repo, env=env, capture_output=True, text=True, timeout=300,
    )
    assert cp.returncode == 0, cp.stderr
    assert [r["partition"] for r in json.loads(cp.stdout)["plans"]["auto"]] == ["art", "cookie.txt"]


def test_whatif_and_report_name_a_dagster_home_that_is_not_a_directory(corpus, tmp_path, capsys, monkeypatch):
    from dagster_gpu.commands.report import report_main

    for home, why in ((str(tmp_path / "no-such-home"), "which is not an existing directory"),
                      ("relative/home", "which is not an absolute path")):
        monkeypatch.setenv("DAGSTER_HOME", home)
        for prog, code in (("whatif", lambda: whatif_main([str(corpus)])),
                           ("dagster-gpu report", lambda: report_main(["-a", "x", "--last", "1",
                                                                       "-o", str(tmp_path / "r.html")]))):
            assert code() == 2
            err = capsys.readouterr().err
            assert err.startswith(f"{prog}: $DAGSTER_HOME is {home!r}, {why}.") and err.count("\n") == 1, err
            assert "Traceback" not in err


def test_whatif_over_a_fleet_totals_per_cluster_and_skips_an_unreachable_one(corpus, tmp_path, capsys, monkeypatch):
    """Two named clusters on the live Slurm 22.05 cluster (priced apart) and a Kubernetes cluster that cannot be
    reached: every partition goes to the cheaper Slurm cluster, each cluster alone is totalled, the unreachable one
    is planned around with its reason."""
    import yaml

    from tests.slurm_helpers import cluster_unavailable_reason, slurm_conf

    reason = cluster_unavailable_reason()
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv("SLURM_CONF", slurm_conf())
    cfg = tmp_path / "executor.yaml"
    cfg.write_text(yaml.safe_dump({"local": {"enabled": False}, "clusters": {
        "dept": {"slurm": {"account": "research"}, "rates": {"default": 0.6}},
        "campus": {"slurm": {"account": "research"}, "rates": {"default": 1.2}},
        "cloud": {"kubernetes": {"kubeconfig": str(tmp_path / "no-kubeconfig")}}}}, sort_keys=False))
    assert whatif_main([str(corpus), "--executor-config", str(cfg), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(c["cluster"], c["kind"], c["reachable"]) for c in doc["fleet"]] == [
        ("dept", "slurm", True), ("campus", "slurm", True), ("cloud", "kubernetes", False)]
    n = len(doc["plans"]["auto"])
    assert {r["cluster"] for r in doc["plans"]["auto"]} == {"dept"} and list(doc["totals_by_cluster"]["auto"]) == ["dept"]
    assert doc["totals_by_cluster"]["auto"]["dept"]["partitions"] == n
    dept, campus = doc["totals_by_cluster"]["dept"]["dept"], doc["totals_by_cluster"]["campus"]["campus"]
    assert campus["cost_usd"] == pytest.approx(2 * dept["cost_usd"])  # same work, twice the rate
    assert doc["infeasible"]["cloud"] == n and "cloud" in doc["unreachable"]
    assert "cloud (kubernetes): unreachable: " in doc["plans"]["auto"][0]["placement"]["reason"]
