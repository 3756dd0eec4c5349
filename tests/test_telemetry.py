"""NVML sampler (no GPU here: the real library and an injected fake) and summary statistics."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from dagster_gpu.telemetry.nvml import MIB, NvmlSampler, _visible_devices
from dagster_gpu.telemetry.stats import percentile_nearest_rank, summarize

LONG = 3600.0  # interval: the background thread never samples during a test; samples are taken by hand


class FakeNvmlError(Exception):
    pass


class FakeNvml:
    """The pynvml functions NvmlSampler uses, over scripted devices.

    ``devices``: list of dicts with ``uuid``, ``name``, ``util`` (list of percents returned in turn; the
    last repeats; an Exception instance is raised instead) and ``mem_mib`` (same, in MiB).
    """

    def __init__(self, devices, init_error=None):
        self.devices = devices
        self.init_error = init_error
        self.calls = []
        self.shutdowns = 0
        self._util_i = [0] * len(devices)
        self._mem_i = [0] * len(devices)

    def nvmlInit(self):
        self.calls.append(("init",))
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        self.calls.append(("index", i))
        if not 0 <= i < len(self.devices):
            raise FakeNvmlError(f"invalid index {i}")
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.calls.append(("uuid", uuid))
        for i, d in enumerate(self.devices):
            if d["uuid"] == uuid:
                return i
        raise FakeNvmlError(f"no device {uuid}")

    def nvmlDeviceGetUUID(self, h):
        return self.devices[h]["uuid"]

    def nvmlDeviceGetName(self, h):
        return self.devices[h]["name"].encode()  # older pynvml returns bytes

    def _next(self, h, field, idx):
        seq = self.devices[h][field]
        v = seq[min(idx[h], len(seq) - 1)]
        idx[h] += 1
        if isinstance(v, Exception):
            raise v
        return v

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self._next(h, "util", self._util_i), memory=0)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=int(self._next(h, "mem_mib", self._mem_i) * MIB), total=80 * 1024 * MIB)


def gpu(uuid, util, mem_mib, name="NVIDIA H100 80GB HBM3"):
    return {"uuid": uuid, "name": name, "util": util, "mem_mib": mem_mib}


# -- the real pynvml on this CPU-only machine ------------------------------------------------------
class NVMLError_DriverNotLoaded(FakeNvmlError):  # noqa: N801 - the name pynvml gives this error
    pass


def test_no_driver_records_reason():
    # the fact "no driver" is injected, so the test means the same on a host with a GPU
    fake = FakeNvml([gpu("GPU-a", [50], [100])], init_error=NVMLError_DriverNotLoaded("Driver Not Loaded"))
    with NvmlSampler(0.05, nvml=fake, env={}) as s:
        pass
    sm = s.summary()
    assert sm.samples == 0
    assert sm.utilization_mean_percent is None and sm.memory_peak_mib is None
    assert "NVML" in sm.unavailable_reason
    assert "no NVIDIA driver" in sm.unavailable_reason
    assert sm.unavailable_reason.endswith("(NVMLError_DriverNotLoaded: Driver Not Loaded)")
    assert fake.calls == [("init",)]  # no device was asked for


@pytest.mark.parametrize("value", ["", "-1", "NoDevFiles", " , "])
def test_cuda_visible_devices_hides_every_gpu(value):
    fake = FakeNvml([gpu("GPU-a", [50], [100])])
    with NvmlSampler(LONG, nvml=fake, env={"CUDA_VISIBLE_DEVICES": value}) as s:
        pass
    sm = s.summary()
    assert sm.samples == 0
    assert sm.unavailable_reason.startswith("CPU-only")
    assert fake.calls == []  # NVML not even initialized


def test_visible_devices_parsing():
    assert _visible_devices({}) is None
    assert _visible_devices({"CUDA_VISIBLE_DEVICES": "0, 2"}) == ["0", "2"]
    assert _visible_devices({"CUDA_VISIBLE_DEVICES": "MIG-x,GPU-y"}) == ["MIG-x", "GPU-y"]
    assert _visible_devices({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_s"):
        NvmlSampler(0.0)


# -- injected fake NVML ----------------------------------------------------------------------------
def test_sampled_statistics_by_hand():
    # Utilization calls per device: 1 probe in _open, then one per sample_once.
    # Samples: enter (1), 3 manual, exit (1) = 5 instants.
    util_a = [0, 10, 20, 90, 100, 40]  # probe, then 10 20 90 100 40
    util_b = [0, 30, 40, 70, 80, 60]  # probe, then 30 40 70 80 60
    mem_a = [1000, 1500, 3000, 2000, 1000]
    mem_b = [2000, 2500, 2500, 4096, 500]
    fake = FakeNvml([gpu("GPU-a", util_a, mem_a), gpu("GPU-b", util_b, mem_b)])
    with NvmlSampler(LONG, nvml=fake, env={}) as s:
        for _ in range(3):
            s.sample_once()
    sm = s.summary()
    # per-instant mean over the two devices: 20, 30, 80, 90, 50
    assert sm.samples == 5
    assert sm.utilization_mean_percent == pytest.approx((20 + 30 + 80 + 90 + 50) / 5)  # 54.0
    # nearest rank p95 of 5 values: rank ceil(4.75) = 5 -> the largest, 90
    assert sm.utilization_p95_percent == 90.0
    # per-instant max memory: 2000, 2500, 3000, 4096, 1000 -> peak 4096 MiB
    assert sm.memory_peak_mib == 4096.0
    assert sm.device_uuids == ("GPU-a", "GPU-b")
    assert sm.product_name == "NVIDIA H100 80GB HBM3"
    assert sm.unavailable_reason is None
    assert fake.shutdowns == 1
    assert ("index", 0) in fake.calls and ("index", 1) in fake.calls


def test_p95_over_twenty_samples():
    # 1 probe + 20 samples: 5, 10, ..., 100 -> mean 52.5, p95 = 19th of 20 = 95
    fake = FakeNvml([gpu("GPU-a", [0] + [5 * k for k in range(1, 21)], [100])])
    with NvmlSampler(LONG, nvml=fake, env={}) as s:
        for _ in range(18):
            s.sample_once()
    sm = s.summary()
    assert sm.samples == 20
    assert sm.utilization_mean_percent == pytest.approx(52.5)
    assert sm.utilization_p95_percent == 95.0
    assert sm.memory_peak_mib == 100.0


def test_mig_device_without_utilization():
    mig_uuid = "MIG-6f1b7f8a-1c2d-5e3f-9a0b-1c2d3e4f5a6b"
    fake = FakeNvml(
        [gpu(mig_uuid, [FakeNvmlError("Not Supported")], [512, 768, 640], name="NVIDIA A100-SXM4-80GB MIG 1g.10gb")]
    )
    with NvmlSampler(LONG, nvml=fake, env={"CUDA_VISIBLE_DEVICES": mig_uuid}) as s:
        s.sample_once()
    sm = s.summary()
    assert sm.samples == 0
    assert sm.utilization_mean_percent is None and sm.utilization_p95_percent is None
    assert sm.unavailable_reason.startswith("MIG device")
    assert sm.memory_peak_mib == 768.0  # memory still sampled: 512, 768, 640
    assert sm.device_uuids == (mig_uuid,)
    assert sm.product_name == "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    assert fake.calls[1] == ("uuid", mig_uuid)


def test_full_gpu_without_utilization_is_not_called_mig():
    fake = FakeNvml([gpu("GPU-a", [FakeNvmlError("Not Supported")], [10])])
    with NvmlSampler(LONG, nvml=fake, env={}) as s:
        pass
    assert s.summary().unavailable_reason == "utilization not supported: FakeNvmlError: Not Supported"


def test_devices_by_uuid_from_cuda_visible_devices():
    devs = [gpu("GPU-a", [0, 10], [100]), gpu("GPU-b", [0, 60], [200]), gpu("GPU-c", [0, 99], [300])]
    fake = FakeNvml(devs)
    with NvmlSampler(LONG, nvml=fake, env={"CUDA_VISIBLE_DEVICES": "GPU-c,GPU-a"}) as s:
        pass
    sm = s.summary()
    assert [c for c in fake.calls if c[0] in ("uuid", "index")] == [("uuid", "GPU-c"), ("uuid", "GPU-a")]
    assert sm.device_uuids == ("GPU-c", "GPU-a")
    assert sm.samples == 2
    assert sm.utilization_mean_percent == pytest.approx((99 + 10) / 2)  # same at both instants
    assert sm.memory_peak_mib == 300.0  # GPU-b (200 MiB) is not the step's


def test_devices_by_index_from_cuda_visible_devices():
    fake = FakeNvml([gpu("GPU-a", [0, 10], [100]), gpu("GPU-b", [0, 60], [200])])
    with NvmlSampler(LONG, nvml=fake, env={"CUDA_VISIBLE_DEVICES": "1"}) as s:
        pass
    assert s.summary().device_uuids == ("GPU-b",)
    assert s.summary().utilization_mean_percent == 60.0


def test_unknown_uuid_gives_a_reason():
    fake = FakeNvml([gpu("GPU-a", [10], [100])])
    with NvmlSampler(LONG, nvml=fake, env={"CUDA_VISIBLE_DEVICES": "GPU-zzz"}) as s:
        pass
    sm = s.summary()
    assert sm.samples == 0
    assert "GPU-zzz" in sm.unavailable_reason and "no device GPU-zzz" in sm.unavailable_reason


def test_init_failure_gives_a_reason():
    fake = FakeNvml([], init_error=FakeNvmlError("Driver Not Loaded"))
    with NvmlSampler(LONG, nvml=fake, env={}) as s:
        pass
    assert s.summary().unavailable_reason == "no NVIDIA driver: NVML unavailable (FakeNvmlError: Driver Not Loaded)"


def test_no_devices_seen():
    fake = FakeNvml([])
    with NvmlSampler(LONG, nvml=fake, env={}) as s:
        pass
    assert s.summary().samples == 0
    assert s.summary().unavailable_reason == "CPU-only: NVML sees no GPU on this host"


def test_background_thread_samples():
    fake = FakeNvml([gpu("GPU-a", [0, 50], [100])])
    import time

    with NvmlSampler(0.01, nvml=fake, env={}) as s:
        deadline = time.monotonic() + 5
        while len(s._util) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    sm = s.summary()
    assert sm.samples >= 5  # enter + >= 3 from the thread + exit
    assert sm.utilization_mean_percent == 50.0


# -- stats ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "values,pct,expected",
    [
        ([15, 20, 35, 40, 50], 5, 15.0),  # rank ceil(0.25) = 1
        ([15, 20, 35, 40, 50], 30, 20.0),  # rank ceil(1.5) = 2
        ([15, 20, 35, 40, 50], 40, 20.0),  # rank ceil(2.0) = 2
        ([15, 20, 35, 40, 50], 50, 35.0),  # rank ceil(2.5) = 3
        ([15, 20, 35, 40, 50], 100, 50.0),
        ([3, 6, 7, 8, 8, 10, 13, 15, 16, 20], 25, 7.0),  # rank 3
        ([3, 6, 7, 8, 8, 10, 13, 15, 16, 20], 75, 15.0),  # rank ceil(7.5) = 8
        (list(range(1, 21)), 95, 19.0),  # rank 19 exactly (no float round-up to 20)
        (list(range(1, 101)), 95, 95.0),
        ([50, 10, 40, 20, 30], 60, 30.0),  # unsorted input; rank 3
        ([7], 95, 7.0),
    ],
)
def test_percentile_nearest_rank(values, pct, expected):
    assert percentile_nearest_rank(values, pct) == expected


@pytest.mark.parametrize("pct", [0, -1, 100.5])
def test_percentile_rejects_bad_pct(pct):
    with pytest.raises(ValueError, match="pct"):
        percentile_nearest_rank([1.0], pct)


def test_percentile_rejects_empty():
    with pytest.raises(ValueError):
        percentile_nearest_rank([], 95)


def test_summarize_drops_non_finite_samples():
    sm = summarize([10, math.nan, 30, math.inf, 20], [100, math.nan, -math.inf, 250], ("GPU-a",), "NVIDIA H200")
    assert sm.samples == 3
    assert sm.utilization_mean_percent == 20.0
    assert sm.utilization_p95_percent == 30.0
    assert sm.memory_peak_mib == 250.0
    assert sm.device_uuids == ("GPU-a",) and sm.product_name == "NVIDIA H200"
    assert sm.unavailable_reason is None


def test_summarize_only_non_finite_is_unavailable_not_nan():
    sm = summarize([math.nan, math.inf], [math.nan])
    assert sm.samples == 0
    assert sm.utilization_mean_percent is None
    assert sm.utilization_p95_percent is None
    assert sm.memory_peak_mib is None
    assert sm.unavailable_reason == "no samples collected"


def test_summarize_keeps_given_reason_and_memory():
    sm = summarize([], [10, 20], unavailable_reason="MIG device: x")
    assert (sm.samples, sm.memory_peak_mib, sm.unavailable_reason) == (0, 20.0, "MIG device: x")


def test_summarize_ignores_reason_when_samples_exist():
    sm = summarize([40], [], unavailable_reason="ignored")
    assert sm.unavailable_reason is None and sm.memory_peak_mib is None
    assert sm.utilization_mean_percent == 40.0 and sm.utilization_p95_percent == 40.0


# -- MIG: utilization rates are NotSupported on MIG handles; memory and billing are unaffected ----------
class MigNvml(FakeNvml):
    """Like NVML on a MIG instance: nvmlDeviceGetUtilizationRates raises the real pynvml NotSupported error
    for MIG handles (and works for full GPUs); nvmlDeviceIsMigDeviceHandle says which is which."""

    def nvmlDeviceIsMigDeviceHandle(self, h):
        return self.devices[h].get("mig", False)

    def nvmlDeviceGetUtilizationRates(self, h):
        import pynvml

        if self.devices[h].get("mig"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return super().nvmlDeviceGetUtilizationRates(h)


@pytest.mark.parametrize("uuid", ["MIG-6f1b7f8a-1c2d-5e3f-9a0b-1c2d3e4f5a6b", "GPU-parent-index-handle"])
def test_mig_not_supported_reason_memory_and_billing(uuid):
    from dagster_gpu.embedding.pipeline import EmbeddingResult
    from dagster_gpu.policy.placement import Placement
    from dagster_gpu.billing.measured import measure
    from dagster_gpu.worker.metadata import build_metadata

    dev = {**gpu(uuid, [0], [512, 900, 640], name="NVIDIA A100-SXM4-80GB MIG 1g.10gb"), "mig": True}
    fake = MigNvml([dev])
    with NvmlSampler(LONG, nvml=fake, env={"CUDA_VISIBLE_DEVICES": "0"}) as s:
        s.sample_once()
    sm = s.summary()
    assert sm.samples == 0 and sm.utilization_mean_percent is None
    assert sm.unavailable_reason.startswith(f"MIG device {uuid}: nvmlDeviceGetUtilizationRates is not supported")
    assert "NVMLError_NotSupported" in sm.unavailable_reason
    assert sm.memory_peak_mib == 900.0  # 512, 900, 640 sampled anyway

    rates = {"NVIDIA A100-SXM4-80GB": 2.4, "default": 1.0}
    billing = measure(rates, 70.0, "cuda", sm.product_name, 1, 1 / 7)
    result = EmbeddingResult(rows=7, records=7, skipped_empty_rows=0, truncated_rows=0, dim=384, seconds=7.0, output_uri="/o")
    md = build_metadata(result=result, model_name="m", model_device="cuda", telemetry=sm, billing=billing,
                        backend="kubernetes", placement=Placement(backend="kubernetes", reason="test"))
    assert md["gpu/unavailable_reason"] == sm.unavailable_reason
    assert md["gpu/memory_peak_mib"] == 900.0 and md["gpu/samples"] == 0
    assert "gpu/utilization_mean_percent" not in md
    # The bill is the same as with utilization samples: 1/7 of a GPU for 70 s = 10 GPU-seconds at 2.40 USD/h.
    with_util = build_metadata(result=result, model_name="m", model_device="cuda",
                               telemetry=summarize([50.0], [900.0], (uuid,), sm.product_name), billing=billing,
                               backend="kubernetes", placement=Placement(backend="kubernetes", reason="test"))
    for key in ("billing/gpu_seconds", "billing/cost_usd", "billing/rate_usd_per_gpu_hour", "billing/devices"):
        assert md[key] == with_util[key]
    assert md["billing/gpu_seconds"] == pytest.approx(10.0)
    assert md["billing/cost_usd"] == pytest.approx(10.0 * 2.4 / 3600, rel=5e-4)  # 4 significant digits


# -- DRA pods: the claim names the devices; a GPU in MIG mode stands for its MIG devices ---------------------
# No GPU (let alone MIG) on CI: the real pynvml cannot run, so this fake answers the NVML calls the sampler
# makes the way nvidia-ml-py 13 does (nvmlDeviceGetMigMode -> [current, pending], NVML_DEVICE_MIG_ENABLE = 1,
# nvmlDeviceGetMigDeviceHandleByIndex raising NVMLError_NotFound for an empty index, NotSupported from
# nvmlDeviceGetUtilizationRates on a MIG handle, names "<parent> MIG <profile>").
class MigHostNvml:
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, gpus):
        """``gpus``: dicts with uuid, name, util, mem_mib and, for a GPU in MIG mode, ``migs`` (index -> dict)."""
        self.gpus = gpus
        self.opened = []

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.gpus[i]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        for g in self.gpus:
            for d in (g, *g.get("migs", {}).values()):
                if d["uuid"] == uuid:
                    self.opened.append(uuid)
                    return d
        import pynvml

        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetMigMode(self, h):
        import pynvml

        if h.get("is_mig"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [1 if "migs" in h else 0, 1 if "migs" in h else 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, i):
        import pynvml

        if i not in h["migs"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return h["migs"][i]

    def nvmlDeviceIsMigDeviceHandle(self, h):
        return bool(h.get("is_mig"))

    def nvmlDeviceGetUUID(self, h):
        return h["uuid"]

    def nvmlDeviceGetName(self, h):
        return h["name"]

    def nvmlDeviceGetUtilizationRates(self, h):
        import pynvml

        if h.get("is_mig"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=h["util"], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=int(h["mem_mib"] * MIB), total=80 * 1024 * MIB)


PARENT = "GPU-3f1e9a52-7c4d-4b8e-9a61-2d5c8e0f1a02"
MIG0 = "MIG-8b2d4f60-1a3c-5e7f-9b0d-2f4a6c8e0b10"  # tests/data/k8s/slices_static_mig.json: gpu-1-mig-1g10gb-19-0


def _mig_parent(*mig_indices):
    return {"uuid": PARENT, "name": "NVIDIA A100-SXM4-80GB", "util": 0, "mem_mib": 0, "migs": {
        i: {"uuid": MIG0 if i == 0 else f"MIG-8b2d4f60-0000-0000-0000-00000000000{i}", "is_mig": True,
            "name": "NVIDIA A100-SXM4-80GB MIG 1g.10gb", "util": 0, "mem_mib": 700 + i} for i in mig_indices}}


def test_a_dra_mig_pod_samples_its_mig_device_not_the_parent():
    """NVIDIA_VISIBLE_DEVICES=void and no CUDA_VISIBLE_DEVICES (the driver's container env): NVML shows the
    parent GPU, in MIG mode, and the MIG device the container may use."""
    fake = MigHostNvml([_mig_parent(0)])
    with NvmlSampler(LONG, nvml=fake, env={"NVIDIA_VISIBLE_DEVICES": "void"}) as s:
        s.sample_once()
    sm = s.summary()
    assert sm.device_uuids == (MIG0,) and sm.product_name == "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    assert sm.memory_peak_mib == 700.0 and sm.samples == 0
    assert sm.unavailable_reason.startswith(f"MIG device {MIG0}: nvmlDeviceGetUtilizationRates is not supported")


def test_the_claims_devices_are_sampled_and_nothing_else():
    h100s = [{"uuid": f"GPU-h100-{i}", "name": "NVIDIA H100 80GB HBM3", "util": 10 * (i + 1), "mem_mib": 100 * (i + 1)} for i in range(3)]
    fake = MigHostNvml(h100s)
    with NvmlSampler(LONG, nvml=fake, env={}, device_uuids=lambda: ["GPU-h100-1"]) as s:
        pass
    sm = s.summary()
    assert sm.device_uuids == ("GPU-h100-1",) and sm.utilization_mean_percent == 20.0 and sm.memory_peak_mib == 200.0
    # a MIG UUID from the claim opens that MIG device directly
    fake = MigHostNvml([_mig_parent(0, 1)])
    with NvmlSampler(LONG, nvml=fake, env={}, device_uuids=[MIG0]) as s:
        pass
    assert s.summary().device_uuids == (MIG0,) and fake.opened == [MIG0]


def test_a_dynamic_mig_claim_gives_the_parent_whose_mig_device_is_sampled():
    fake = MigHostNvml([_mig_parent(3)])  # the placement-3 MIG device the driver created at prepare
    with NvmlSampler(LONG, nvml=fake, env={}, device_uuids=[PARENT]) as s:
        pass
    assert s.summary().device_uuids == ("MIG-8b2d4f60-0000-0000-0000-000000000003",)


def test_a_claim_that_cannot_be_read_falls_back_to_what_nvml_sees():
    def unreadable():
        raise RuntimeError("HTTP 403")

    fake = MigHostNvml([{"uuid": "GPU-only", "name": "NVIDIA L4", "util": 55, "mem_mib": 10}])
    with NvmlSampler(LONG, nvml=fake, env={}, device_uuids=unreadable) as s:
        pass
    assert s.summary().device_uuids == ("GPU-only",) and s.summary().utilization_mean_percent == 55.0
