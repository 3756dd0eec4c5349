"""Materialization metadata, placement markdown, step context, backend env and GPU requests."""

from __future__ import annotations

import json
import math

import dagster as dg
import pytest

from dagster_gpu.embedding.pipeline import EmbeddingResult
from dagster_gpu.policy.forced import forced_backend
from dagster_gpu.policy.placement import Alternative, Placement
from dagster_gpu.core.request import GpuRequest, GpuRequestError
from dagster_gpu.telemetry.stats import TelemetrySummary, summarize
from dagster_gpu.worker.backend_env import backend_metadata
from dagster_gpu.billing.measured import Billing, measure
from dagster_gpu.worker.context import ENV_VAR, StepContext
from dagster_gpu.worker.metadata import NonFiniteMetadata, build_metadata, placement_from_metadata, placement_markdown

PLACEMENT = Placement(
    backend="slurm",
    device="NVIDIA H100",
    product="NVIDIA H100",
    reason="cheapest feasible: slurm starts in 12 s",
    alternatives=(
        Alternative("local", device="cpu", feasible=True, start_delay_s=0.0, runtime_s=900.0, cost_usd=0.0125, note="CPU"),
        Alternative("slurm", device="NVIDIA H100", feasible=True, start_delay_s=12.0, runtime_s=60.0, cost_usd=0.035,
                    product="NVIDIA H100", device_fraction=1.0),
        Alternative("kubernetes", device=None, feasible=False, note="no ResourceSlice matches"),
    ),
)


def result(rows=10, seconds=2.0, **kw) -> EmbeddingResult:
    d = dict(rows=rows, records=12, skipped_empty_rows=2, truncated_rows=1, dim=384, seconds=seconds, output_uri="/out/p.parquet")
    d.update(kw)
    return EmbeddingResult(**d)


def cpu_metadata(**kw):
    billing = measure({"cpu": 0.05, "default": 1.0}, 3.0, "cpu", None, 0)
    args = dict(
        result=result(),
        model_name="all-MiniLM-L6-v2",
        model_device="cpu",
        telemetry=summarize([], [], unavailable_reason="no NVIDIA driver: NVML unavailable (x)"),
        billing=billing,
        backend="local",
        placement=PLACEMENT,
    )
    args.update(kw)
    return build_metadata(**args)


def test_cpu_metadata_keys_and_types():
    md = cpu_metadata()
    assert md["dagster_gpu/backend"] == "local"
    assert isinstance(md["dagster_gpu/placement"], dg.MarkdownMetadataValue)
    assert "dagster_gpu/placement_json" not in md  # one rendering; the JSON is on the launch event
    for key, value in [
        ("embedding/rows", 10), ("embedding/records_read", 12), ("embedding/skipped_empty_rows", 2),
        ("embedding/truncated_rows", 1), ("gpu/samples", 0),
    ]:
        assert md[key] == value and type(md[key]) is int, key
    assert md["embedding/dim"] == dg.MetadataValue.text("384")  # a setting: text, so the Plots tab leaves it out
    assert md["embedding/model"] == "all-MiniLM-L6-v2" and md["embedding/device"] == "cpu"
    assert md["embedding/seconds"] == 2.0
    assert md["embedding/texts_per_second"] == 5.0  # 10 rows / 2 s
    assert isinstance(md["embedding/output_uri"], dg.PathMetadataValue) and md["embedding/output_uri"].path == "/out/p.parquet"
    assert md["billing/device_type"] == "cpu"
    assert md["billing/devices"] == dg.MetadataValue.text("1")
    assert md["billing/wall_seconds"] == 3.0
    assert md["billing/gpu_seconds"] == 3.0
    assert md["billing/rate_usd_per_gpu_hour"] == dg.MetadataValue.text("0.05")
    assert md["billing/cost_usd"] == 4.167e-05  # 3 s x 0.05 USD/h = 4.1666...e-05, 4 significant digits
    assert md["billing/source"] == "measured"
    assert md["billing/what"].startswith("measured by the step worker") and "not the scheduler's bill" in md["billing/what"]
    assert md["gpu/unavailable_reason"] == "CPU-only: the model ran on CPU (no NVIDIA driver: NVML unavailable (x))"
    for key in ("gpu/utilization_mean_percent", "gpu/utilization_p95_percent", "gpu/memory_peak_mib",
                "gpu/device_fraction", "gpu/device_uuids", "gpu/product_name"):
        assert key not in md, key
    for key, v in md.items():
        if isinstance(v, float):
            assert math.isfinite(v), key
        assert not isinstance(v, bool), key


def test_measured_floats_rounded_settings_as_text():
    """The UI shows a float's repr and plots every Int/Float entry (dagster-ui AssetMaterializationGraphs.tsx,
    extractNumericData): measured floats keep 4 significant digits, settings are text, counts stay ints."""
    telemetry = summarize([87.53125, 91.0], [2048.123456], ("GPU-a",), "NVIDIA H100 80GB HBM3")
    billing = measure({"NVIDIA H100": 2.1}, 23.28464388847351, "cuda", "NVIDIA H100 80GB HBM3", 1)
    md = cpu_metadata(model_device="cuda", telemetry=telemetry, billing=billing, backend="slurm",
                      result=result(seconds=18.254321987),
                      backend_metadata={"embedding/useful_fraction": 18.254321987 / 23.28464388847351,
                                        "embedding/devices": 1, "slurm/array_task_id": 2})
    assert md["billing/wall_seconds"] == 23.28 and md["billing/gpu_seconds"] == 23.28
    assert md["billing/cost_usd"] == 0.01358  # 23.2846... s x 2.1 USD/h = 0.013582711...
    assert md["embedding/seconds"] == 18.25 and md["embedding/useful_fraction"] == 0.784
    assert md["embedding/texts_per_second"] == 0.5478  # 10 rows / 18.2543... s
    assert md["gpu/utilization_mean_percent"] == 89.27 and md["gpu/memory_peak_mib"] == 2048.0
    assert md["embedding/devices"] == dg.MetadataValue.text("1") and md["slurm/array_task_id"] == 2
    plotted = sorted(k for k, v in md.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
    assert not set(plotted) & {"embedding/dim", "embedding/devices", "billing/devices", "billing/rate_usd_per_gpu_hour",
                               "gpu/device_fraction", "embedding/torch_threads"}, plotted
    for key in plotted:
        assert isinstance(md[key], int) or float(f"{md[key]:.4g}") == md[key], (key, md[key])
    from dagster_gpu.worker.metadata import rounded
    assert (rounded(12345.678), rounded(-0.000123456), rounded(0.0), rounded(1e-12 / 3)) == (12346.0, -0.0001235, 0.0, 3.333e-13)


def test_a_non_finite_entry_from_the_unit_or_backend_names_its_key():
    with pytest.raises(NonFiniteMetadata, match="embedding/useful_fraction"):
        cpu_metadata(backend_metadata={"embedding/useful_fraction": float("nan")})


def test_settings_read_back_as_numbers():
    from dagster_gpu.commands.report import useful_fraction
    from dagster_gpu.instance.events import metadata_number

    md = cpu_metadata(billing=measure({"default": 1.2}, 70.0, "cuda", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 1))
    assert metadata_number(md, "billing/devices") == pytest.approx(1 / 7, rel=1e-5)
    assert metadata_number(md, "embedding/dim") == 384.0 and metadata_number(md, "embedding/model") is None
    assert metadata_number(md, "absent") is None and metadata_number({"b": True}, "b") is None
    # the report's measured seconds from GPU-seconds ÷ devices when no wall seconds are recorded
    no_wall = {k: v for k, v in md.items() if k not in ("billing/wall_seconds", "embedding/useful_fraction")}
    assert useful_fraction(no_wall) == pytest.approx(2.0 / 70.0, rel=1e-3)


def test_cpu_without_telemetry_reason():
    md = cpu_metadata(telemetry=TelemetrySummary(samples=0, unavailable_reason=None))
    assert md["gpu/unavailable_reason"] == "CPU-only: the model ran on CPU"


def test_gpu_metadata():
    telemetry = summarize([80, 90, 100], [1000, 2048.5], ("GPU-a", "GPU-b"), "NVIDIA H100 80GB HBM3")
    billing = measure({"NVIDIA H100": 2.1}, 60.0, "cuda", "NVIDIA H100 80GB HBM3", 2)
    md = cpu_metadata(model_device="cuda", telemetry=telemetry, billing=billing, backend="slurm",
                      backend_metadata={"slurm/job_id": "42", "slurm/array_job_id": 40, "slurm/array_task_id": 2})
    assert md["gpu/samples"] == 3
    assert md["gpu/utilization_mean_percent"] == 90.0
    assert md["gpu/utilization_p95_percent"] == 100.0
    assert md["gpu/memory_peak_mib"] == 2048.0  # 2048.5 MiB, 4 significant digits (half to even)
    assert md["gpu/device_uuids"] == "GPU-a,GPU-b"
    assert md["gpu/product_name"] == "NVIDIA H100 80GB HBM3"
    assert md["gpu/device_fraction"] == dg.MetadataValue.text("2")
    assert md["billing/gpu_seconds"] == 120.0
    assert md["billing/cost_usd"] == pytest.approx(120 * 2.1 / 3600)  # 0.07
    assert "gpu/unavailable_reason" not in md
    assert (md["slurm/job_id"], md["slurm/array_job_id"], md["slurm/array_task_id"]) == ("42", 40, 2)
    assert md["dagster_gpu/backend"] == "slurm"


def test_mig_metadata_fraction():
    billing = measure({"default": 1.2}, 70.0, "cuda", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 1)
    telemetry = summarize([], [512.0], ("MIG-x",), "NVIDIA A100-SXM4-80GB MIG 1g.10gb", "MIG device: per-instance utilization needs GPM")
    md = cpu_metadata(model_device="cuda", telemetry=telemetry, billing=billing)
    assert md["gpu/device_fraction"] == dg.MetadataValue.text("0.142857")  # 1/7 of the GPU
    assert md["gpu/memory_peak_mib"] == 512.0
    assert md["gpu/samples"] == 0
    assert "gpu/utilization_mean_percent" not in md
    assert md["gpu/unavailable_reason"].startswith("MIG device")


def test_empty_partition_metadata():
    md = cpu_metadata(result=result(rows=0, records=0, skipped_empty_rows=0, truncated_rows=0, seconds=0.01))
    assert md["embedding/rows"] == 0
    assert md["embedding/texts_per_second"] == 0.0


@pytest.mark.parametrize(
    "kw,key",
    [
        (dict(result=result(seconds=math.nan)), "embedding/seconds"),
        (dict(result=result(seconds=math.inf)), "embedding/seconds"),
        (dict(billing=Billing("cpu", 1.0, 1.0, 1.0, 0.05, math.nan)), "billing/cost_usd"),
        (dict(billing=Billing("cpu", 1.0, 1.0, math.inf, 0.05, 0.0)), "billing/gpu_seconds"),
        (dict(telemetry=TelemetrySummary(samples=1, utilization_mean_percent=math.nan, utilization_p95_percent=1.0)),
         "gpu/utilization_mean_percent"),
        (dict(telemetry=TelemetrySummary(memory_peak_mib=math.inf)), "gpu/memory_peak_mib"),
    ],
)
def test_non_finite_raises_naming_the_key(kw, key):
    with pytest.raises(NonFiniteMetadata) as e:
        cpu_metadata(**kw)
    assert repr(key) in str(e.value)


def test_metadata_opens_with_the_figures_people_look_at_first():
    telemetry = summarize([80, 90, 100], [1000], ("GPU-a",), "NVIDIA H100 80GB HBM3")
    billing = measure({"NVIDIA H100": 2.1}, 60.0, "cuda", "NVIDIA H100 80GB HBM3", 1)
    md = cpu_metadata(model_device="cuda", telemetry=telemetry, billing=billing,
                      backend_metadata={"slurm/job_id": "42", "embedding/useful_fraction": 0.5})
    assert list(md)[:8] == [
        "embedding/rows", "embedding/texts_per_second", "gpu/utilization_mean_percent", "billing/gpu_seconds",
        "billing/cost_usd", "embedding/useful_fraction", "dagster_gpu/backend", "dagster_gpu/placement",
    ]
    # on CPU the utilization is unknown: the next figures move up, nothing is invented
    assert list(cpu_metadata())[:5] == [
        "embedding/rows", "embedding/texts_per_second", "billing/gpu_seconds", "billing/cost_usd", "dagster_gpu/backend",
    ]


def test_placement_markdown_lists_alternatives():
    text = placement_markdown(PLACEMENT)
    lines = text.splitlines()
    assert lines[0] == "**slurm** on NVIDIA H100: cheapest feasible: slurm starts in 12 s"
    assert lines[2] == "| backend | device | feasible | start delay (s) | runtime (s) | cost (USD) | note |"
    assert "| local | cpu | yes | 0.0 | 900.0 | 0.012500 | CPU |" in lines
    assert "| slurm **(chosen)** | NVIDIA H100 | yes | 12.0 | 60.0 | 0.035000 |  |" in lines
    assert "| kubernetes | – | no | – | – | – | no ResourceSlice matches |" in lines
    assert sum(1 for ln in lines if ln.startswith("| ")) == 4  # header + 3 alternatives


def test_placement_markdown_leaves_out_what_says_nothing():
    p = Placement(backend="slurm", device="A100", reason="forced", alternatives=(
        Alternative("slurm", device="A100", cost_usd=0.01),
        Alternative("kubernetes", device="A100"),  # feasible, no estimate, no note: says nothing
        Alternative("local", device="cpu", feasible=False),
    ))
    lines = placement_markdown(p).splitlines()
    assert lines[2] == "| backend | device | feasible | cost (USD) |"  # delay/runtime/note unknown everywhere
    assert lines[4:] == ["| slurm **(chosen)** | A100 | yes | 0.010000 |", "| local | cpu | no | – |"]


def test_placement_markdown_local_only_is_one_line():
    p = Placement(backend="local", device="cpu", reason="forced by gpu_executor config backend: local",
                  alternatives=(Alternative("local", device="cpu", runtime_s=30.0),))
    assert placement_markdown(p) == "**local** on cpu: forced by gpu_executor config backend: local (runtime (s) 30.0)"
    bare = Placement(backend="local", reason="only backend", alternatives=(Alternative("local"),))
    assert placement_markdown(bare) == "**local**: only backend"


def test_placement_markdown_without_alternatives():
    p = Placement(backend="local", reason="in-process")
    assert placement_markdown(p) == "**local**: in-process\n\n_no alternatives considered_"


def test_placement_reads_back_from_the_launch_event_metadata():
    assert placement_from_metadata({"dagster_gpu/placement": dg.MetadataValue.json(PLACEMENT.to_json())}) == PLACEMENT
    assert placement_from_metadata({"dagster_gpu/placement": json.dumps(PLACEMENT.to_json())}) == PLACEMENT
    # a materialization carries only the Markdown rendering, which is not read back
    assert placement_from_metadata(cpu_metadata()) is None
    assert placement_from_metadata({}) is None


def test_forced_placement_reasons():
    assert forced_backend(GpuRequest(backend="slurm"), "local", ["local", "slurm"]).placement().reason == "forced by tag dagster-gpu/backend=slurm"
    p = forced_backend(GpuRequest(), "kubernetes", ["local", "kubernetes"]).placement()
    assert (p.backend, p.reason) == ("kubernetes", "forced by gpu_executor config backend: kubernetes")
    assert forced_backend(GpuRequest(), "auto", ["local"]).placement().backend == "local"
    assert forced_backend(GpuRequest(), "auto", ["local", "slurm"]) is None


# -- step context ---------------------------------------------------------------------------------
def test_step_context_env_round_trip():
    ctx = StepContext(backend="slurm", placement=PLACEMENT, rates={"NVIDIA H100": 2.1, "default": 1.2},
                      gpu_count=2, device_fraction=1 / 7, extra={"k": "v"})
    env = ctx.to_env()
    assert list(env) == [ENV_VAR]
    back = StepContext.from_env(env)
    assert back == ctx
    assert back.device_fraction == 1 / 7 and back.gpu_count == 2 and back.placement == PLACEMENT
    assert back.launched_by_executor is True


def test_step_context_in_process_default():
    ctx = StepContext.from_env({})
    assert ctx.backend == "local" and ctx.launched_by_executor is False
    assert dict(ctx.rates) == {"cpu": 0.05, "default": 1.0}
    assert ctx.gpu_count == 1 and ctx.device_fraction is None
    assert "not launched by gpu_executor" in ctx.placement.reason


# -- backend env ----------------------------------------------------------------------------------
def test_slurm_array_task_metadata():
    env = {"SLURM_JOB_ID": "1243", "SLURM_ARRAY_JOB_ID": "1240", "SLURM_ARRAY_TASK_ID": "3", "SLURM_JOB_PARTITION": "gpu"}
    assert backend_metadata("slurm", env) == {
        "slurm/job_id": "1243", "slurm/array_job_id": 1240, "slurm/array_task_id": 3, "slurm/slurm_partition": "gpu",
    }


def test_slurm_plain_job_and_bad_ids():
    assert backend_metadata("slurm", {"SLURM_JOB_ID": "77"}) == {"slurm/job_id": "77"}
    assert backend_metadata("slurm", {"SLURM_JOB_ID": "77", "SLURM_ARRAY_JOB_ID": "x", "SLURM_ARRAY_TASK_ID": ""}) == {
        "slurm/job_id": "77"
    }
    assert backend_metadata("slurm", {}) == {}


def test_k8s_metadata():
    env = {"DAGSTER_GPU_K8S_NAMESPACE": "embed", "DAGSTER_GPU_K8S_POD": "step-abc", "SLURM_JOB_ID": "9"}
    assert backend_metadata("kubernetes", env) == {"k8s/namespace": "embed", "k8s/pod": "step-abc"}
    assert backend_metadata("kubernetes", {}) == {}


def test_local_backend_has_no_backend_metadata():
    assert backend_metadata("local", {"SLURM_JOB_ID": "9", "DAGSTER_GPU_K8S_POD": "p"}) == {}


# -- GPU requests ---------------------------------------------------------------------------------
def test_request_defaults():
    r = GpuRequest.from_tags({})
    assert r == GpuRequest()
    assert (r.count, r.memory_gib, r.mig_ok, r.shared_ok, r.backend, r.service_class) == (1, None, False, False, None, "batch")
    assert r.to_tags() == {"dagster-gpu/gpu-count": "1"}


def test_request_from_tags():
    r = GpuRequest.from_tags({
        "dagster-gpu/gpu-count": " 2 ", "dagster-gpu/gpu-memory-gib": "40", "dagster-gpu/gpu-product": " NVIDIA A100 ",
        "dagster-gpu/mig-ok": "Yes", "dagster-gpu/shared-ok": "off", "dagster-gpu/deadline-seconds": "600",
        "dagster-gpu/backend": "kubernetes", "unrelated": "x",
    })
    assert r == GpuRequest(count=2, memory_gib=40.0, product="NVIDIA A100", mig_ok=True, shared_ok=False,
                           deadline_s=600.0, backend="kubernetes")
    assert r.service_class == "deadline:600"


@pytest.mark.parametrize(
    "req",
    [
        GpuRequest(),
        GpuRequest(count=0),
        GpuRequest(count=4, memory_gib=79.5, product="NVIDIA H100", mig_ok=True, shared_ok=True, deadline_s=3600.0, backend="slurm"),
        GpuRequest(count=1, memory_gib=0.1, deadline_s=0.25),
        GpuRequest(memory_gib=1234567.0, deadline_s=1209601.0),  # more than 6 significant digits
        GpuRequest(memory_gib=1 / 3, deadline_s=100000.5),
    ],
)
def test_request_tags_round_trip(req):
    tags = req.to_tags()
    assert all(isinstance(v, str) for v in tags.values())
    assert GpuRequest.from_tags(tags) == req


def test_request_tags_are_readable():
    tags = GpuRequest(memory_gib=40.0, deadline_s=600.0).to_tags()
    assert tags["dagster-gpu/gpu-memory-gib"] == "40"
    assert tags["dagster-gpu/deadline-seconds"] == "600"


@pytest.mark.parametrize(
    "tag,value",
    [
        ("dagster-gpu/gpu-count", "-1"),
        ("dagster-gpu/gpu-count", "1.5"),
        ("dagster-gpu/gpu-count", "two"),
        ("dagster-gpu/gpu-memory-gib", "nan"),
        ("dagster-gpu/gpu-memory-gib", "inf"),
        ("dagster-gpu/gpu-memory-gib", "-4"),
        ("dagster-gpu/mig-ok", "maybe"),
        ("dagster-gpu/shared-ok", "2"),
        ("dagster-gpu/deadline-seconds", "soon"),
        ("dagster-gpu/deadline-seconds", "-60"),
        ("dagster-gpu/backend", "aws"),
    ],
)
def test_request_errors_name_the_tag(tag, value):
    with pytest.raises(GpuRequestError) as e:
        GpuRequest.from_tags({tag: value})
    assert repr(tag) in str(e.value)
    assert value.strip() in str(e.value)


def test_chunk_and_lineage_metadata():
    lineage = {"fingerprint": "fp1-0123456789abcdef", "model_revision": "sha256:00ff", "prompt": "passage: ",
               "prompt_name": "document", "normalize": False, "truncate_dim": 128, "output_dtype": "float16",
               "max_seq_length": 256, "chunking": {"max_tokens": 128, "overlap": 16, "boundary": "token"},
               "pooling": {"pooling_mode_mean_tokens": True, "include_prompt": False}}
    md = cpu_metadata(result=result(rows=30, records_embedded=10, tokens=3500, record_tokens=3000, covered_tokens=2970,
                                    reused_rows=12), lineage=lineage)
    assert (md["embedding/chunks"], md["embedding/records_embedded"], md["embedding/tokens"]) == (30, 10, 3500)
    assert md["embedding/reused_rows"] == 12 and cpu_metadata()["embedding/reused_rows"] == 0
    assert md["embedding/token_coverage"] == 0.99
    assert md["embedding/fingerprint"] == "fp1-0123456789abcdef" and md["embedding/model_revision"] == "sha256:00ff"
    assert md["embedding/prompt"] == "document"  # the name when there is one
    assert md["embedding/normalize"] is False and md["embedding/truncate_dim"].value == "128"
    assert md["embedding/output_dtype"] == "float16" and md["embedding/max_seq_length"].value == "256"
    assert md["embedding/chunking"].data == lineage["chunking"] and md["embedding/pooling"].data == lineage["pooling"]
    text_only = cpu_metadata(lineage={**lineage, "prompt_name": None, "truncate_dim": None, "chunking": None})
    assert text_only["embedding/prompt"] == "passage: "
    assert "embedding/truncate_dim" not in text_only and "embedding/chunking" not in text_only
    assert "embedding/fingerprint" not in cpu_metadata()
    assert cpu_metadata()["embedding/token_coverage"] == 1.0  # 0 of 0 tokens


def test_only_configured_backend_placement_says_why_once():
    md = placement_markdown(forced_backend(GpuRequest(), "auto", ["local"]).placement())
    assert md == "**local**: auto: local is the only configured backend"
    md = placement_markdown(forced_backend(GpuRequest(backend="slurm"), "auto", ["local", "slurm"]).placement())
    assert md == "**slurm**: forced by tag dagster-gpu/backend=slurm"


def test_a_fully_reused_partition_shows_no_throughput():
    md = cpu_metadata(result=result(rows=10, seconds=0.0, reused_rows=10))
    assert "embedding/texts_per_second" not in md  # nothing reached the model: no "texts_per_second 0" on its page
    assert md["embedding/reused_rows"] == 10
    assert cpu_metadata(result=result(rows=10, seconds=2.0, reused_rows=4))["embedding/texts_per_second"] == 3.0  # the 6 texts that reached the model in 2 s
