"""Slurm outputs of the versions sites run (22.05 recorded here, 23.11–25.11 from upstream source or the
24.11 cluster): GPUs in use, start estimates, job states, the wait-limit schema. No cluster needed: the
client runs stand-in ``sinfo``/``squeue`` scripts that print recorded (or source-derived) output."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from dagster._config import process_config
import pytest

from dagster_gpu.contracts import WorkerStatus
from dagster_gpu.slurm import gres as G
from dagster_gpu.slurm import parse as P
from dagster_gpu.slurm.client import SlurmClient, SubmittedJob
from dagster_gpu.slurm.client import gpu_count as client_gpu_count
from dagster_gpu.slurm.states import parse_state, wait_class

DATA = Path(__file__).resolve().parent / "data" / "slurm"
UP = DATA / "upstream"


def fake_slurm(tmp_path: Path, monkeypatch, outputs: dict[str, Path]) -> Path:
    """Stand-in Slurm commands on PATH: each prints its recorded file (and logs its argv)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for prog, path in outputs.items():
        f = bindir / prog
        to = " >&2" if path.name.endswith(".stderr.txt") else ""
        f.write_text(f"#!/bin/sh\necho \"$0 $*\" >> {tmp_path}/argv.log\ncat {path}{to}\n")
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "argv.log"


# ----------------------------------------------------------------------------------- GPUs in use
def test_gpus_in_use_22_05_counts_gpus_jobs(tmp_path, monkeypatch):
    # recorded on 22.05.8 (record_gres_fixtures.py): --gres=gpu:2 and --gpus=1 running, one pending;
    # squeue's %b of the --gpus job is N/A, sinfo's GresUsed counts all 3
    fake_slurm(tmp_path, monkeypatch, {"sinfo": DATA / "sinfo_gres_used_busy.txt", "squeue": DATA / "squeue_gres_busy.txt"})
    c = SlurmClient()
    assert c.gpu_queue("gpu") == (3, 1)
    assert c.gpus_in_partition("gpu") == 4
    assert c.gpu_capacity("gpu").free == 1


def test_gpus_in_use_24_11_typed_and_unavailable_nodes(tmp_path, monkeypatch):
    fake_slurm(tmp_path, monkeypatch, {"sinfo": UP / "sinfo_gres_used_typed_24.11.txt", "squeue": UP / "squeue_gres_24.11.txt"})
    c = SlurmClient()
    busy, pending = c.gpu_queue(None)
    # usable: a100n1 (2 of 4 used), h100n1 (8 of 8), mign1 (idle~: power save, 0 of 7), plain1 (1 of 2);
    # drained a100n2, not responding a100n3 and draining a100n4 are not available
    assert (busy, pending) == (2 + 8 + 0 + 1, 2)
    assert c.pending_jobs(None, "a100") == 1 and c.pending_jobs(None, "h100") == 2  # untyped ones may take either
    cap = c.gpu_capacity(None)
    assert (cap.total, cap.usable, cap.used, cap.used_all, cap.free) == (4 * 4 + 8 + 7 + 2, 21, 11, 12, 10)
    a100 = c.gpu_capacity(None, "a100")
    assert (a100.total, a100.usable, a100.used, a100.free) == (16, 4, 2, 2)
    assert c.gpus_in_partition(None) == 21


def test_gres_texts_of_every_version():
    assert G.gpu_count("gres:gpu:1") == 1  # squeue %b, 22.05
    assert G.gpu_count("gres/gpu:a100:1") == 1 and G.gpu_count("gres/gpu:1") == 1  # >= 23.11
    assert client_gpu_count("gres/gpu:a100:1") == 1 and client_gpu_count("gpu:(null):2(IDX:0-1)") == 2
    assert G.gpu_count("gres/gpu:2,gres/shard:1") == 2 and G.gpu_count("gres/shard:1") == 0
    assert G.gpu_count("gpu:(null):2(IDX:0-1)") == 2 and G.gpu_count("gpu:a100:2(IDX:0,2),gpu:h100:1(IDX:0)") == 3
    assert G.gpu_count("gpu:a100:2(IDX:0,2),gpu:h100:1(IDX:0)", "h100") == 1
    assert G.parse_gres("shard:(null):2(1/4,1/4,0/4,0/4)") == [G.GresItem("shard", None, 2)]
    assert G.parse_gres("gpu:1g.10gb:7(S:0)") == [G.GresItem("gpu", "1g.10gb", 7)]
    assert G.gpu_count("N/A") == 0 and G.gpu_count("(null)") == 0 and G.gpu_count("") == 0
    for state, ok in [("idle", True), ("mixed", True), ("allocated", True), ("idle~", True), ("mixed-", True),
                      ("planned", True), ("drained", False), ("draining", False), ("down*", False), ("idle*", False),
                      ("fail", False), ("maint", False), ("reserved", False), ("idle+drain", False), ("inval", False)]:
        assert G.node_usable(state) is ok, state


# ------------------------------------------------------------------------------ start estimates
def test_test_only_every_version():
    t = P.parse_test_only((DATA / "sbatch_test_only.stderr.txt").read_text())  # 22.05 recorded
    assert (t.processors, t.nodes, t.slurm_partition, t.cluster) == (1, "vm", "gpu", None)
    t = P.parse_test_only((UP / "sbatch_test_only_25.05.stderr.txt").read_text())
    assert (t.job_id, t.start, t.cluster, t.processors, t.nodes, t.slurm_partition) == (
        4242, datetime(2026, 12, 1, 21, 30), "gpu2", 8, "a100n1", "gpu")
    t = P.parse_test_only("sbatch: Job 9 to start at 2026-12-01T21:30:00 a using 1 processors on nodes vm in partition gpu")
    assert (t.job_id, t.cluster, t.nodes) == (9, None, "vm")  # 25.05 on a single cluster
    t = P.parse_test_only((UP / "sbatch_test_only_multicluster.stderr.txt").read_text())
    assert (t.job_id, t.processors, t.nodes, t.slurm_partition) == (77, 2, "a100n[1-2]", None)


# ----------------------------------------------------------------------------------- job states
def test_expediting_is_a_requeue():
    st = parse_state("EXPEDITING")
    assert st.status == WorkerStatus.REQUEUED and not st.final and wait_class(st.name) == "pending"


def test_unknown_state_is_that_rows_unknown_not_the_polls_failure():
    rows = P.parse_squeue((UP / "squeue_expediting_25.11.txt").read_text())
    assert [(r.id.raw, r.state.name, r.state.status) for r in rows] == [
        ("101_0", "RUNNING", WorkerStatus.RUNNING),
        ("101_1", "EXPEDITING", WorkerStatus.REQUEUED),
        ("101_2", "UNKNOWN", WorkerStatus.UNKNOWN),
    ]
    assert rows[2].state.raw == "FROBNICATING"
    acct = P.parse_sacct("7_1|8|FROBNICATING|0:0|0:0|00:00:05|5|billing=1,cpu=1,gres/gpu=1|normal|gpu|"
                         "2026-12-01T20:00:00|2026-12-01T20:00:01|Unknown|vm|x\n")
    assert acct[0].state.status == WorkerStatus.UNKNOWN and not acct[0].state.final


# ------------------------------------------------------------------------------ settings schema
def test_wait_limit_runaway_is_in_the_schema():
    from dagster_gpu.slurm.backend import SlurmSettings, config_field
    from dagster_gpu.slurm.status import WaitLimits

    field = config_field()
    res = process_config(field.config_type, {"wait_limits_seconds": {"runaway": 600.0, "held": 60.0}})
    assert res.success, res.errors
    assert SlurmSettings.from_section({"wait_limits_seconds": {"runaway": 600.0}}).wait_limits.runaway == 600.0
    schema = field.config_type.fields["wait_limits_seconds"].config_type.fields
    assert set(schema) == {f for f in WaitLimits.__dataclass_fields__}
    assert "default 1800" in schema["runaway"].description and WaitLimits().runaway == 1800.0
    assert not process_config(field.config_type, {"wait_limits_seconds": {"bogus": 1.0}}).success
    typed = process_config(field.config_type, {"gpu_types": [{"product": "NVIDIA A30", "gres": "1g.6gb", "memory_gib": 6}]})
    assert typed.success, typed.errors
    t = SlurmSettings.from_section(typed.value).gpu_types[0]
    assert (t.product, t.gres, t.mig_profile, t.fraction, t.device) == ("NVIDIA A30", "1g.6gb", "1g.6gb", 0.25, "mig-1g.6gb")


# ------------------------------------------------------------------ bills without gres/gpu accounting
def _env(**request) -> dict[str, str]:
    import json

    ctx = {"rates": {"NVIDIA A100-SXM4-80GB": 3.6, "default": 3.6}, "gpu_count": 1, "device_fraction": None}
    if request:
        ctx["slurm_request"] = request
    return {"DAGSTER_GPU_STEP_CONTEXT": json.dumps(ctx)}


def test_config_is_asked_once_and_missing_gpu_tres_warns_once(tmp_path, monkeypatch, caplog):
    log = fake_slurm(tmp_path, monkeypatch, {"scontrol": UP / "scontrol_show_config_no_gpu_tres.txt"})
    c = SlurmClient()
    with caplog.at_level("WARNING", logger="dagster_gpu.slurm.client"):
        assert [c.gpu_tres_tracked() for _ in range(3)] == [False, False, False]
    assert len(log.read_text().splitlines()) == 1  # one scontrol show config per client
    assert sum("AccountingStorageTRES" in r.getMessage() for r in caplog.records) == 1
    assert not c.gpu_usage_tracked()
    assert P.gpu_tres_tracked(P.parse_show_config((DATA / "scontrol_show_config.txt").read_text()))  # 22.05 here


def test_bill_without_gpu_tres_counts_requested_gres():
    from dagster_gpu.slurm.accounting import task_bill

    rows = P.parse_sacct((UP / "sacct_no_gpu_tres_24.11.txt").read_text())
    assert rows[0].gpus == 0 and rows[0].elapsed_s == 120  # what sacct says: no GPU at all
    bill = task_bill(_env(gres="--gres=gpu:2", gpus=2.0, product="NVIDIA A100-SXM4-80GB", fraction_per_gpu_gres=1.0),
                     rows, shards_per_gpu=4, gpu_tres_tracked=False)
    assert bill.gpu_seconds == 240.0 and bill.metadata["billing/source"] == "sacct-requested"
    assert "gres/gpu" in bill.metadata["billing/note"] and bill.metadata["slurm/requested_gres"] == "--gres=gpu:2"
    tracked = task_bill(_env(), rows, shards_per_gpu=4, gpu_tres_tracked=True)
    assert tracked.gpu_seconds == 0.0 and tracked.metadata["billing/source"] == "sacct"
    # a step context written before slurm_request existed: gpu_count x device fraction
    assert task_bill(_env(), rows, shards_per_gpu=4, gpu_tres_tracked=False).gpu_seconds == 120.0


def test_gpuutil_and_gpumem_of_the_steps_go_on_the_bill():
    from dagster_gpu.slurm.accounting import step_gpu_usage, task_bill

    steps = P.parse_sacct_steps((UP / "sacct_gpuutil_24.11.txt").read_text())
    assert [s.id.raw for s in steps] == ["101_0.batch", "101_0.extern", "101_1.batch"]
    usage = step_gpu_usage([s for s in steps if s.id.task_id == 0])
    assert usage == {"slurm/gpuutil_ave_percent": 87.0, "slurm/gpumem_max_bytes": 3072 * 1024**2}
    assert step_gpu_usage([s for s in steps if s.id.task_id == 1]) == {}  # no GPU usage recorded
    rows = P.parse_sacct((DATA / "sacct_all.txt").read_text())[:1]
    bill = task_bill(_env(), rows, shards_per_gpu=4, step_usage=usage)
    assert bill.metadata["slurm/gpuutil_ave_percent"] == 87.0


# --------------------------------------------------------------------------------- array limits
def test_array_limits_read_from_config():
    lim = P.array_limits(P.parse_show_config((DATA / "scontrol_show_config.txt").read_text()))  # 22.05 recorded
    assert (lim.max_array_size, lim.max_array_tasks, lim.disabled, lim.tasks_per_array) == (1001, None, False, 1001)
    lim = P.array_limits(P.parse_show_config((UP / "scontrol_show_config_no_gpu_tres.txt").read_text()))
    assert (lim.max_array_size, lim.max_array_tasks, lim.disabled, lim.tasks_per_array) == (0, 200, True, 0)
    lim = P.array_limits({"MaxArraySize": "100001", "SchedulerParameters": "bf_continue,max_array_tasks=1000"})
    assert lim.tasks_per_array == 1000  # slurm.conf(5)'s own example
    with pytest.raises(P.SlurmParseError):
        P.array_limits({"MaxArraySize": "1001", "SchedulerParameters": "max_array_tasks=lots"})


@dataclass
class _Sbatch(SlurmClient):
    """sbatch that hands out job ids 701, 702, … under a controller whose MaxArraySize is ``cap``."""

    cap: int = 1001
    submitted: list[list[str]] = field(default_factory=list)

    def submit_job(self, script, options, *, script_args=(), attempts=None):
        self.submitted.append(list(options))
        return SubmittedJob(700 + len(self.submitted))

    def max_array_size(self) -> int:
        return self.cap


def _launch(co, key: str):
    from dagster_gpu.slurm.coalescer import TaskRequest

    return co.submit(TaskRequest(options=("--gres=gpu:1",), throttle=2, argv=("true",), env={}, run_id="r",
                                 step_key="s", partition_keys=(key,)))


def test_arrays_disabled_fail_with_what_the_site_must_set(tmp_path):
    from dagster_gpu.slurm.coalescer import ArrayCoalescer, SubmissionRejected
    from dagster_gpu.slurm.spool import Spool
    from dagster_gpu.slurm.window import WindowRule

    client = _Sbatch(cap=0)
    co = ArrayCoalescer(Spool(tmp_path / "spool"), client, python="python3", rule=WindowRule(0.0, 0.0, 0.0), max_wait_s=10)
    with pytest.raises(SubmissionRejected) as e:
        _launch(co, "2026-01-01")
    assert "MaxArraySize=0" in str(e.value) and "MaxArraySize in slurm.conf" in str(e.value) and "2026-01-01" in str(e.value)
    assert client.submitted == []  # never an sbatch Slurm would refuse


def test_arrays_sized_below_max_array_tasks(tmp_path):
    from dagster_gpu.slurm.coalescer import ArrayCoalescer
    from dagster_gpu.slurm.spool import Spool
    from dagster_gpu.slurm.window import WindowRule
    from tests.test_slurm_window import _queue

    client = _Sbatch(cap=P.array_limits({"MaxArraySize": "1001", "SchedulerParameters": "max_array_tasks=3"}).tasks_per_array)
    spool = Spool(tmp_path / "spool")
    co = ArrayCoalescer(spool, client, python="python3", rule=WindowRule(2.0, 15.0, 120.0))
    for i in range(7):
        _queue(spool, ("--gres=gpu:1",), 0.0, f"k{i}")
    assert co.flush_due() == 3
    arrays = [next(o for o in c if o.startswith("--array=")) for c in client.submitted]
    assert arrays == ["--array=0-2%4", "--array=0-2%4", "--array=0%4"]


# ------------------------------------------------------------------------ typed GRES and MIG slices
def test_mig_slices_per_parent():
    from dagster_gpu.slurm.gpu_types import mig_fraction, mig_slices

    # NVIDIA MIG User Guide, Supported MIG Profiles: A100/H100 7 compute slices, A30 4
    assert mig_fraction("1g.10gb", "NVIDIA A100-SXM4-80GB") == pytest.approx(1 / 7)
    assert mig_fraction("3g.40gb", "NVIDIA H100 80GB HBM3") == pytest.approx(3 / 7)
    assert mig_fraction("1g.6gb", "NVIDIA A30") == 0.25 and mig_fraction("2g.12gb", "NVIDIA A30") == 0.5
    assert mig_fraction("2g.12gb") == 0.5  # an A30-only profile, parent unknown
    assert mig_fraction("4g.24gb", "NVIDIA A30") == 1.0 and mig_slices("1g.18gb", "NVIDIA H200") == 7


def _backend(tmp_path, **kw):
    from dagster_gpu.slurm.backend import SlurmBackend, SlurmSettings

    types = [{"product": "NVIDIA A100-SXM4-80GB", "gres": "a100", "memory_gib": 80},
             {"product": "NVIDIA H100 80GB HBM3", "gres": "h100", "constraint": "nvlink", "memory_gib": 80},
             {"product": "NVIDIA A100-SXM4-80GB", "gres": "1g.10gb", "memory_gib": 10},
             {"product": "NVIDIA A30", "gres": "2g.12gb", "memory_gib": 12}]
    return SlurmBackend(SlurmSettings(spool_dir=str(tmp_path / "spool"), gpu_types=types, **kw), client=SlurmClient())


def _req(**kw):
    from types import SimpleNamespace

    from dagster_gpu.core.request import GpuRequest

    return SimpleNamespace(request=GpuRequest(**kw))


def test_typed_request_becomes_typed_gres_or_constraint(tmp_path):
    from dagster_gpu.slurm.gpu_types import GpuTypeError

    b = _backend(tmp_path)
    assert b.gres_options(_req(count=2, product="NVIDIA A100")) == (["--gres=gpu:a100:2"], None)
    assert b.gres_options(_req(count=1, product="NVIDIA H100")) == (["--gres=gpu:h100:1", "--constraint=nvlink"], None)
    assert b.gres_options(_req(count=1)) == (["--gres=gpu:1"], None)  # untyped: any GPU
    opts, frac = b.gres_options(_req(count=1, memory_gib=10, mig_ok=True))
    assert opts == ["--gres=gpu:1g.10gb:1"] and frac == pytest.approx(1 / 7)
    opts, frac = b.gres_options(_req(count=1, memory_gib=11, mig_ok=True))
    assert opts == ["--gres=gpu:2g.12gb:1"] and frac == 0.5  # an A30 slice: 2 of its 4
    assert b.gres_options(_req(count=1, memory_gib=10)) == (["--gres=gpu:a100:1"], None)  # no MIG unless mig-ok
    with pytest.raises(GpuTypeError, match="gpu-product='NVIDIA L4'"):
        b.gres_options(_req(count=1, product="NVIDIA L4"))
    with pytest.raises(Exception, match="not a Slurm name"):
        _backend(tmp_path, gpu_product="x").settings.__class__(gpu_types=[{"product": "p", "gres": "a100 --uid=0"}])


def test_mig_gres_is_billed_as_its_fraction_of_the_parent():
    from dagster_gpu.slurm.accounting import task_bill

    rows = [r for r in P.parse_sacct((DATA / "sacct_all.txt").read_text()) if r.gpus == 1 and r.elapsed_s > 0][:1]
    assert rows, "a recorded task with gres/gpu=1"
    whole = task_bill(_env(), rows, shards_per_gpu=4)
    mig = task_bill(_env(gres="--gres=gpu:2g.12gb:1", gpus=0.5, product="NVIDIA A30", fraction_per_gpu_gres=0.5), rows, shards_per_gpu=4)
    assert mig.gpu_seconds == whole.gpu_seconds * 0.5 and mig.device_type == "NVIDIA A30"


def test_policy_state_pools_per_gpu_type(tmp_path, monkeypatch):
    log = fake_slurm(tmp_path, monkeypatch, {"sinfo": UP / "sinfo_gres_used_typed_24.11.txt", "squeue": UP / "squeue_gres_24.11.txt",
                                             "sbatch": UP / "sbatch_test_only_25.05.stderr.txt"})
    st = _backend(tmp_path, slurm_partition="gpu").policy_state()
    pools = {p.device: p for p in st.pools}
    assert {d: (p.free, p.total, p.pending) for d, p in pools.items()} == {
        "NVIDIA A100-SXM4-80GB": (2, 4, 1), "NVIDIA H100 80GB HBM3": (0, 8, 2), "mig-1g.10gb": (7, 7, 1), "mig-2g.12gb": (0, 0, 1)}
    assert pools["mig-1g.10gb"].mig_profile == "1g.10gb" and pools["mig-1g.10gb"].memory_gib == 10
    assert pools["NVIDIA A100-SXM4-80GB"].start_estimate_s is None  # 2 free > 1 pending (the untyped job)
    assert pools["NVIDIA H100 80GB HBM3"].start_estimate_s is not None  # the 25.05 estimate parsed
    assert "--gres=gpu:h100:1 --constraint=nvlink" in log.read_text()
    assert st.running_tasks == 11

    from dagster_gpu.slurm.backend import SlurmBackend, SlurmSettings

    plain = SlurmBackend(SlurmSettings(spool_dir=str(tmp_path / "spool2")), client=SlurmClient()).policy_state()
    assert [(p.device, p.free, p.total, p.pending) for p in plain.pools] == [("NVIDIA A100-SXM4-80GB", 10, 21, 2)]


# ------------------------------------------------------------------- recorded on the real 24.11.5 cluster
V2411 = DATA / "v24.11"


def test_gpus_in_use_recorded_on_24_11(tmp_path, monkeypatch):
    # tests/data/slurm/v24.11/record_v24_11_fixtures.py: 4 GPUs held (--gres=gpu:2, --gpus=1, an array task
    # with --gres=gpu:1), two jobs pending; %b is gres/gpu:N and N/A for the --gpus job
    assert (V2411 / "VERSION").read_text().split()[-1].startswith("24.11")
    fake_slurm(tmp_path, monkeypatch, {"sinfo": V2411 / "sinfo_gres_used_busy.txt", "squeue": V2411 / "squeue_gres_busy.txt"})
    c = SlurmClient()
    assert c.gpu_queue(None) == (4, 2)
    cap = c.gpu_capacity(None)
    assert (cap.usable, cap.used, cap.free) == (4, 4, 0)
    t = P.parse_test_only((V2411 / "sbatch_test_only_busy.stderr.txt").read_text())
    assert (t.processors, t.nodes, t.slurm_partition, t.cluster) == (1, "vm", "gpu", None)
    rows = P.parse_squeue((V2411 / "squeue_gres_busy_full.txt").read_text())
    assert sum(G.gpu_count(r.tres_per_node) for r in rows if r.state.name == "RUNNING") == 3  # the --gpus job's is N/A


def test_accounting_config_and_steps_recorded_on_24_11(tmp_path, monkeypatch):
    from dagster_gpu.slurm.accounting import step_gpu_usage

    log = fake_slurm(tmp_path, monkeypatch, {"scontrol": V2411 / "scontrol_show_config.txt"})
    c = SlurmClient()
    # 24.11 lists gres/gpumem and gres/gpuutil by itself once gres/gpu is tracked
    assert c.gpu_tres_tracked() and c.gpu_usage_tracked() and len(log.read_text().splitlines()) == 1
    assert P.array_limits(c.config()).tasks_per_array == 1001
    # the recorder's step format has more columns: JobID, TRESUsageInAve, TRESUsageInMax are 0, 4 and 5
    lines = ["|".join(ln.split("|")[i] for i in (0, 4, 5)) for ln in (V2411 / "sacct_steps.txt").read_text().splitlines()]
    steps = P.parse_sacct_steps("\n".join(lines))
    assert steps and all(s.id.step == "batch" for s in steps)
    assert steps[0].usage_ave == {"energy": 0.0}
    assert step_gpu_usage(steps) == {}  # the test cluster's GPUs are device nodes without NVML: nothing measured
    acct = P.parse_sacct((V2411 / "sacct_all.txt").read_text())
    assert acct and {r.state.status for r in acct} <= set(WorkerStatus) and any(r.gpus == 2 for r in acct)


def test_launch_records_what_sbatch_asks_and_the_bill_prices_it(tmp_path):
    import json
    from types import SimpleNamespace

    from dagster_gpu.slurm.accounting import task_bill
    from dagster_gpu.core.request import GpuRequest
    from dagster_gpu.slurm.coalescer import TaskAssignment

    b = _backend(tmp_path, throttle=2)
    seen = []
    b.coalescer.submit = lambda req: seen.append(req) or TaskAssignment(900, 0, "b", 1.0, 1, str(tmp_path / "0.out"))
    env = _env()
    launch = SimpleNamespace(request=GpuRequest(count=2, memory_gib=10, mig_ok=True), env=env, argv=["true"], run_id="r",
                             step_key="s", attempt=0, launches_to_come=None, partition_keys=("p",))
    h = b.launch(launch)
    assert h["job_id"] == "900_0" and "--gres=gpu:1g.10gb:2" in seen[0].options
    ctx = json.loads(seen[0].env["DAGSTER_GPU_STEP_CONTEXT"])
    assert ctx["slurm_request"]["gpus"] == pytest.approx(2 / 7) and ctx["device_fraction"] == pytest.approx(1 / 7)
    assert ctx["slurm_request"]["product"] == "NVIDIA A100-SXM4-80GB"
    # sacct: the two slices are gres/gpu=2 for 60 s; billed as 2/7 of a GPU, whether Slurm accounts GPUs or not
    row = P.parse_sacct("900_0|900|COMPLETED|0:0|0:0|00:01:00|60|billing=21,cpu=1,gres/gpu=2,node=1|normal|gpu|"
                        "2026-12-01T20:00:00|2026-12-01T20:00:01|2026-12-01T20:01:01|a100n1|x\n")
    for tracked in (True, False):
        bill = task_bill(seen[0].env, row, shards_per_gpu=4, gpu_tres_tracked=tracked)
        assert bill.gpu_seconds == pytest.approx(60 * 2 / 7) and bill.device_type == "NVIDIA A100-SXM4-80GB"
