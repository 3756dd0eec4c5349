"""Rate card (dagster_gpu/data/ratecard.yaml), metering, and the worker's measured billing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dagster_gpu.billing.metering import cost_usd, gpu_seconds
from dagster_gpu.billing.ratecard import DEFAULT_RATE_CARD, RateCard, RateCardError, mig_fraction, rate_from_table
from dagster_gpu.billing.measured import billed_device, measure

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def card() -> RateCard:
    return RateCard.load()


def test_default_card_is_package_data(card):
    assert DEFAULT_RATE_CARD == REPO / "dagster_gpu" / "data" / "ratecard.yaml"
    # the documented example in resources/ is the same file
    assert (REPO / "resources" / "ratecard.yaml").resolve() == DEFAULT_RATE_CARD.resolve()
    assert card.source == str(DEFAULT_RATE_CARD)
    assert set(card.rates) == {"local", "slurm", "kubernetes"}
    assert dict(card.table("local")) == {"cpu": 0.05, "default": 1.00}


@pytest.mark.parametrize(
    "backend,device,rate",
    [
        # exact
        ("slurm", "NVIDIA A100-SXM4-80GB", 1.20),
        ("kubernetes", "NVIDIA A100-SXM4-80GB", 2.40),
        ("kubernetes", "NVIDIA H200", 4.50),
        ("slurm", "cpu", 0.05),
        ("kubernetes", "cpu", 0.10),
        # longest prefix
        ("slurm", "NVIDIA H100 80GB HBM3", 2.10),
        ("kubernetes", "NVIDIA H100 NVL", 3.90),
        ("kubernetes", "NVIDIA H200 NVL", 4.50),
        # default
        ("slurm", "Tesla T4", 1.20),
        ("kubernetes", "NVIDIA A100-PCIE-40GB", 2.40),  # not a prefix of "NVIDIA A100-SXM4-80GB"
        ("local", "NVIDIA H100 80GB HBM3", 1.00),
    ],
)
def test_rate_lookup(card, backend, device, rate):
    assert card.rate(backend, device) == rate


def test_longest_prefix_wins():
    table = {"NVIDIA": 1.0, "NVIDIA H100": 2.0, "NVIDIA H100 80GB": 3.0, "default": 9.0}
    assert rate_from_table(table, "NVIDIA H100 80GB HBM3") == 3.0
    assert rate_from_table(table, "NVIDIA H100 NVL") == 2.0
    assert rate_from_table(table, "NVIDIA L4") == 1.0
    assert rate_from_table(table, "AMD MI300X") == 9.0


def test_mig_rate_is_a_seventh_of_the_parent(card):
    assert card.rate("slurm", "mig-1g.10gb", "NVIDIA A100-SXM4-80GB") == pytest.approx(1.20 / 7)
    assert card.rate("kubernetes", "mig-1g.10gb", "NVIDIA A100-SXM4-80GB") == pytest.approx(2.40 / 7)
    assert card.rate("kubernetes", "mig-3g.40gb", "NVIDIA A100-SXM4-80GB") == pytest.approx(2.40 * 3 / 7)
    assert card.rate("kubernetes", "mig-7g.80gb", "NVIDIA A100-SXM4-80GB") == pytest.approx(2.40)
    assert card.rate("kubernetes", "mig-1g.12gb", "NVIDIA H100 80GB HBM3") == pytest.approx(3.90 / 7)
    # no parent given: the backend's default
    assert card.rate("slurm", "mig-2g.20gb") == pytest.approx(1.20 * 2 / 7)


@pytest.mark.parametrize(
    "profile,fraction",
    [("1g.10gb", 1 / 7), ("mig-1g.10gb", 1 / 7), ("1g.10gb+me", 1 / 7), ("2g.20gb", 2 / 7), ("3g.40gb", 3 / 7), ("4g.40gb", 4 / 7), ("7g.80gb", 1.0)],
)
def test_mig_fraction(profile, fraction):
    assert mig_fraction(profile) == pytest.approx(fraction)


@pytest.mark.parametrize("bad", ["1g", "gpu", "1g.10gb+", "mig-", "g.10gb"])
def test_mig_fraction_rejects(bad):
    with pytest.raises(RateCardError, match="not a MIG profile"):
        mig_fraction(bad)


def test_unknown_backend_names_it(card):
    with pytest.raises(RateCardError) as e:
        card.rate("aws", "cpu")
    assert "'aws'" in str(e.value) and str(DEFAULT_RATE_CARD) in str(e.value)


def test_no_match_without_default_names_device():
    c = RateCard.from_dict({"backends": {"slurm": {"NVIDIA H100": 2.0}}}, source="inline.yaml")
    with pytest.raises(RateCardError) as e:
        c.rate("slurm", "Tesla T4")
    assert "'Tesla T4'" in str(e.value) and "inline.yaml" in str(e.value) and "slurm" in str(e.value)


@pytest.mark.parametrize(
    "text,needle",
    [
        ("currency: USD\n", "'backends' mapping"),
        ("", "'backends' mapping"),
        ("- a\n- b\n", "'backends' mapping"),
        ("backends: [1, 2]\n", "'backends' mapping"),
        ("backends:\n  slurm: 1.5\n", "backend 'slurm' must map"),
        ("backends:\n  slurm:\n    cpu: cheap\n", "slurm/cpu: rate must be a finite number >= 0, got 'cheap'"),
        ("backends:\n  slurm:\n    cpu: -1\n", "slurm/cpu: rate must be a finite number >= 0, got -1"),
        ("backends:\n  slurm:\n    cpu: .nan\n", "slurm/cpu: rate must be"),
        ("backends:\n  slurm:\n    cpu: .inf\n", "slurm/cpu: rate must be"),
        ("backends:\n  slurm:\n    cpu:\n", "slurm/cpu: rate must be a finite number >= 0, got None"),
        ("backends: {slurm: {cpu: 1\n", "cannot read"),  # YAML syntax error
    ],
)
def test_malformed_cards_name_the_file(tmp_path, text, needle):
    p = tmp_path / "bad card.yaml"
    p.write_text(text)
    with pytest.raises(RateCardError) as e:
        RateCard.load(p)
    assert str(p) in str(e.value)
    assert needle in str(e.value)


def test_missing_card_names_the_file(tmp_path):
    p = tmp_path / "nope.yaml"
    with pytest.raises(RateCardError, match="nope.yaml: cannot read"):
        RateCard.load(p)


def test_numeric_strings_are_accepted(tmp_path):
    p = tmp_path / "card.yaml"
    p.write_text("backends:\n  local:\n    cpu: '0.25'\n    default: 3\n")
    c = RateCard.load(p)
    assert c.rate("local", "cpu") == 0.25 and c.rate("local", "NVIDIA L4") == 3.0


# -- metering -------------------------------------------------------------------------------------
def test_gpu_seconds_and_cost():
    assert gpu_seconds(2, 90.5) == 181.0
    assert gpu_seconds(1 / 7, 70.0) == pytest.approx(10.0)
    assert gpu_seconds(0, 100) == 0.0
    assert cost_usd(3600, 1.20) == pytest.approx(1.20)
    assert cost_usd(181.0, 2.40) == pytest.approx(0.120666666, rel=1e-7)  # 181 * 2.4 / 3600
    assert cost_usd(0.0, 4.5) == 0.0


@pytest.mark.parametrize("args", [(math.nan, 1.0), (1.0, math.nan), (-1.0, 1.0), (1.0, -0.5), (math.inf, 1.0)])
def test_gpu_seconds_rejects(args):
    with pytest.raises(ValueError, match="must be finite and >= 0"):
        gpu_seconds(*args)


@pytest.mark.parametrize("args", [(math.nan, 1.0), (1.0, math.nan), (-1.0, 1.0), (1.0, -2.0), (1.0, math.inf)])
def test_cost_rejects(args):
    with pytest.raises(ValueError, match="must be finite and >= 0"):
        cost_usd(*args)


# -- worker billing -------------------------------------------------------------------------------
def test_measure_cpu(card):
    b = measure(card.table("local"), 36.0, "cpu", None, 0)
    assert (b.device_type, b.devices, b.wall_seconds, b.gpu_seconds) == ("cpu", 1.0, 36.0, 36.0)
    assert b.rate_usd_per_gpu_hour == 0.05
    assert b.cost_usd == pytest.approx(36.0 * 0.05 / 3600)  # 0.0005
    assert b.cost_usd == pytest.approx(0.0005)
    assert b.source == "measured"


def test_measure_cuda_without_product_bills_cpu(card):
    b = measure(card.table("local"), 10.0, "cuda", None, 1)
    assert (b.device_type, b.rate_usd_per_gpu_hour) == ("cpu", 0.05)


def test_measure_full_gpu(card):
    b = measure(card.table("slurm"), 120.0, "cuda", "NVIDIA H100 80GB HBM3", 1)
    assert (b.device_type, b.devices, b.gpu_seconds) == ("NVIDIA H100 80GB HBM3", 1.0, 120.0)
    assert b.rate_usd_per_gpu_hour == 2.10
    assert b.cost_usd == pytest.approx(0.07)  # 120 * 2.10 / 3600


def test_measure_two_gpus(card):
    b = measure(card.table("kubernetes"), 90.0, "cuda:0", "NVIDIA A100-SXM4-80GB", 2)
    assert (b.devices, b.gpu_seconds, b.rate_usd_per_gpu_hour) == (2.0, 180.0, 2.40)
    assert b.cost_usd == pytest.approx(0.12)  # 180 * 2.40 / 3600


def test_measure_mig_slice(card):
    b = measure(card.table("slurm"), 70.0, "cuda", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 1)
    assert b.device_type == "mig-1g.10gb"
    assert b.devices == pytest.approx(1 / 7)
    assert b.gpu_seconds == pytest.approx(10.0)  # 70 s on 1/7 of a GPU
    assert b.rate_usd_per_gpu_hour == 1.20  # whole-GPU rate of the parent
    assert b.cost_usd == pytest.approx(10.0 * 1.20 / 3600)
    # the same as paying the slice's own rate (1/7 of the parent's) for its 70 s
    assert b.cost_usd == pytest.approx(70.0 * card.rate("slurm", "mig-1g.10gb", "NVIDIA A100-SXM4-80GB") / 3600)


def test_measure_mig_parent_by_prefix(card):
    b = measure(card.table("kubernetes"), 700.0, "cuda", "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 1)
    assert b.device_type == "mig-3g.40gb"
    assert b.gpu_seconds == pytest.approx(300.0)  # 700 * 3/7
    assert b.rate_usd_per_gpu_hour == 3.90
    assert b.cost_usd == pytest.approx(300.0 * 3.90 / 3600)


def test_measure_shared_fraction(card):
    b = measure(card.table("kubernetes"), 100.0, "cuda", "NVIDIA A100-SXM4-80GB", 1, device_fraction=0.25)
    assert (b.devices, b.gpu_seconds, b.rate_usd_per_gpu_hour) == (0.25, 25.0, 2.40)
    assert b.cost_usd == pytest.approx(25.0 * 2.40 / 3600)


def test_billed_device():
    assert billed_device("cpu", "NVIDIA H100", 1, None) == ("cpu", None, 1.0)
    assert billed_device("cuda", "NVIDIA H100", 0, None) == ("NVIDIA H100", None, 1.0)
    assert billed_device("cuda", "NVIDIA H100", 4, 0.5) == ("NVIDIA H100", None, 2.0)
    dt, parent, dev = billed_device("cuda", "NVIDIA A100-SXM4-80GB MIG 2g.20gb", 2, None)
    assert (dt, parent) == ("mig-2g.20gb", "NVIDIA A100-SXM4-80GB") and dev == pytest.approx(4 / 7)


def test_measure_rejects_negative_wall(card):
    with pytest.raises(ValueError):
        measure(card.table("local"), -1.0, "cpu", None, 0)


def test_measure_without_rate_names_device():
    with pytest.raises(RateCardError, match="'NVIDIA L4'"):
        measure({"NVIDIA H100": 2.0}, 1.0, "cuda", "NVIDIA L4", 1)


def test_a_mig_slice_is_priced_the_same_by_the_policy_the_worker_and_the_pod_interval(card):
    """The same 1g.10gb slice of an H100 (kubernetes: 3.90 USD/GPU-h by prefix, not the 2.40 default) for the
    same seconds: the policy's estimate, the worker's measured bill and the pod-interval bill agree."""
    import datetime as dt

    from kubernetes.client import V1ObjectMeta

    from dagster_gpu.contracts import StepLaunch
    from dagster_gpu.k8s.billing import pod_interval_metadata
    from dagster_gpu.k8s import manifests as m
    from dagster_gpu.policy import DeviceGroup, GpuRequest, KubernetesState, RuntimeModel, Snapshot, StepSize, decide

    parent = "NVIDIA H100 80GB HBM3"
    pool = DeviceGroup("mig-1g.10gb", parent, 10.0, free=7, total=7, mig_profile="1g.10gb")
    placement = decide(GpuRequest(mig_ok=True, memory_gib=10), StepSize(rows=100_000),
                       Snapshot(rate_card=card, kubernetes=KubernetesState(pools=(pool,))),
                       model=RuntimeModel(texts_per_second=1000.0, n_history=3))
    est = placement.alternatives[0]
    assert (placement.device, placement.product) == ("mig-1g.10gb", parent)
    secs = est.runtime_s
    expected = secs / 7 * 3.90 / 3600  # 1/7 of a GPU for secs seconds at the H100's GPU-hour rate
    assert est.cost_usd == pytest.approx(expected, rel=1e-12)

    rates = card.table("kubernetes")
    worker = measure(rates, secs, "cuda:0", f"{parent} MIG 1g.10gb", 1)
    assert (worker.device_type, worker.rate_usd_per_gpu_hour) == ("mig-1g.10gb", 3.90)
    assert worker.cost_usd == pytest.approx(expected, rel=1e-12)

    launch = StepLaunch(run_id="r", step_key="embed", partition_keys=("a.txt",), attempt=0, argv=("python",), env={},
                        request=GpuRequest(mig_ok=True, memory_gib=10), placement=placement)
    pod, _, _ = m.step_objects(launch, m.PodSettings(secret_env=()))
    pod.metadata = V1ObjectMeta(**{**pod.metadata.to_dict(), "uid": "u1", "namespace": "ns",
                                   "creation_timestamp": dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)})
    handle = m.handle_from_pod(pod)  # what a process that did not launch the pod bills from
    md = pod_interval_metadata(handle, 1000.0, 1000.0 + secs, "claim", [], rates)
    assert (md["billing/device_type"], md["billing/rate_usd_per_gpu_hour"]) == ("mig-1g.10gb", 3.90)
    assert md["billing/gpu_seconds"] == pytest.approx(worker.gpu_seconds, rel=1e-12)
    assert md["billing/cost_usd"] == pytest.approx(expected, rel=1e-12)
