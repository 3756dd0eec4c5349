"""The DRA device request a step gets: it follows the policy's placement, falls back from a MIG slice to a
whole GPU with ``firstAvailable`` when nothing was placed, and judges memory the way a user means it.

Request shapes: kubernetes/api v0.34.0 ``resource/v1/types.go`` (DeviceRequest = one of ``exactly`` /
``firstAvailable``; DeviceSubRequest; results and config name a subrequest ``<request>/<subrequest>``),
checked with kubernetes-validate against the 1.34 schema. Devices: tests/data/k8s/slices_static_mig.json,
shaped as NVIDIA/k8s-dra-driver-gpu v25.12.0 publishes them (see tests/data/k8s/make_dra_slices.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import kubernetes_validate
import pytest
from kubernetes.utils import parse_quantity

from dagster_gpu.core.device_memory import memory_fits, min_memory_mib
from dagster_gpu.k8s import dra
from dagster_gpu.k8s.pod import PodSettings
from dagster_gpu.core.request import GpuRequest

DATA = Path(__file__).resolve().parent / "data" / "k8s"
DEVICES = {d["name"]: d for s in json.loads((DATA / "slices_static_mig.json").read_text())["items"] for d in s["spec"]["devices"]}
H100 = DEVICES["gpu-0"]  # NVIDIA H100 80GB HBM3, memory 81559Mi (NVML's total)
MIG_1G = DEVICES["gpu-1-mig-1g10gb-19-0"]  # 1g.10gb slice of an A100-80GB, memory 9728Mi


def _memory_ok(selectors, device) -> bool:
    """Evaluates our own memory selector shape (``memory.compareTo(quantity('<n>Mi')) >= 0``) on a device."""
    have = parse_quantity(device["capacity"]["memory"]["value"])
    for e in selectors:
        m = re.fullmatch(r"device\.capacity\['gpu\.nvidia\.com'\]\.memory\.compareTo\(quantity\('(\d+Mi)'\)\) >= 0", e)
        if m and have < parse_quantity(m.group(1)):
            return False
    return True


def _template(choice) -> dict:
    t = dra.to_dict(dra.claim_template("step-1", "dagster-gpu", {}, choice))
    kubernetes_validate.validate(t, "1.34.0", strict=True)
    for version in ("v1beta2", "v1beta1"):
        kubernetes_validate.validate(dra.claim_template_for_version(t, version), "1.34.0", strict=True)
    return t


def test_a_whole_gpu_placement_gets_a_whole_gpu_even_when_mig_is_ok():
    choice = dra.device_choice(GpuRequest(count=1, mig_ok=True), "NVIDIA H100 80GB HBM3", PodSettings())
    req = _template(choice)["spec"]["spec"]["devices"]["requests"][0]
    assert req["exactly"]["deviceClassName"] == "gpu.nvidia.com" and "firstAvailable" not in req
    assert choice.device_type == "NVIDIA H100 80GB HBM3" and choice.device_fraction == 1.0


def test_without_a_placement_mig_ok_asks_for_the_slice_first_then_a_whole_gpu():
    choice = dra.device_choice(GpuRequest(count=1, mig_ok=True, memory_gib=10), None, PodSettings())
    t = _template(choice)
    (req,) = t["spec"]["spec"]["devices"]["requests"]
    assert req["name"] == "gpu" and "exactly" not in req
    mig, gpu = req["firstAvailable"]
    assert (mig["name"], mig["deviceClassName"], gpu["name"], gpu["deviceClassName"]) == ("mig", "mig.nvidia.com", "gpu", "gpu.nvidia.com")
    assert "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'" in [s["cel"]["expression"] for s in mig["selectors"]]
    # memory: a 1g.10gb slice (9728Mi) satisfies memory_gib 10, so does the H100
    assert _memory_ok([s["cel"]["expression"] for s in mig["selectors"]], MIG_1G)
    assert _memory_ok([s["cel"]["expression"] for s in gpu["selectors"]], H100)
    # what the step holds: the slice, until the allocation (results[].request) says it got a whole GPU
    assert choice.device_type == "mig-1g.10gb" and choice.device_fraction == pytest.approx(1 / 7)
    assert choice.resolve("gpu/gpu").device_type == "default" and choice.resolve("gpu/gpu").device_fraction == 1.0
    assert choice.resolve("gpu/mig").device_type == "mig-1g.10gb" and choice.resolve("gpu/mig").device_fraction == pytest.approx(1 / 7)
    assert choice.resolve(None) is choice
    assert [a["subrequest"] for a in choice.to_json()["firstAvailable"]] == ["mig", "gpu"]


def test_first_available_sharing_configs_name_their_subrequests():
    choice = dra.device_choice(GpuRequest(count=1, mig_ok=True, shared_ok=True), None, PodSettings(sharing_strategy="MPS"))
    cfg = _template(choice)["spec"]["spec"]["devices"]["config"]
    assert [(c["requests"], c["opaque"]["parameters"]["kind"]) for c in cfg] == [
        (["gpu/mig"], "MigDeviceConfig"), (["gpu/gpu"], "GpuConfig")]


def test_a_slice_too_small_for_the_memory_is_not_offered():
    choice = dra.device_choice(GpuRequest(count=1, mig_ok=True, memory_gib=20), None, PodSettings())
    assert choice.alternatives == () and choice.device_class == "gpu.nvidia.com"


def test_memory_gib_80_matches_an_80gb_h100_and_10_a_1g10gb_slice():
    for gib, device in ((80, H100), (10, MIG_1G)):
        choice = dra.device_choice(GpuRequest(count=1, memory_gib=gib), None, PodSettings(mig_profile=None))
        assert _memory_ok(choice.selectors, device), (gib, choice.selectors)
    # and not a smaller marketed size: 81559Mi does not satisfy 94 (H100 NVL), 9728Mi not 20
    assert not _memory_ok([dra.memory_selector(94)], H100) and not _memory_ok([dra.memory_selector(20)], MIG_1G)


@pytest.mark.parametrize("marketed,reported_mib", [(80, 81559), (24, 23034), (16, 15360), (10, 9728), (5, 4864), (80, 81920)])
def test_every_recorded_total_satisfies_its_marketed_size_and_not_the_next(marketed, reported_mib):
    assert memory_fits(reported_mib / 1024, marketed)
    nxt = {80: 94, 24: 32, 16: 20, 10: 12, 5: 6}[marketed]
    assert not memory_fits(reported_mib / 1024, nxt)
    assert min_memory_mib(marketed) <= reported_mib


def test_mig_profile_pattern_is_public():
    assert dra.is_mig_profile("1g.10gb") and not dra.is_mig_profile("1g10gb")
    assert dra.MIG_PROFILE.match("3g.40gb").groups() == ("3", "40")


# Kueue v0.17.0 pkg/dra/claims.go (countDevicesPerClass) refuses a claim with firstAvailable ("FirstAvailable
# device selection is not supported"), CEL selectors ("CEL selectors are not supported") or device config
# ("device config is not supported"): a queued step's template has one `exactly` request, a class and a count.
def _queued_request(request, placement, **settings):
    choice = dra.device_choice(request, placement, PodSettings(queue_name="batch", **settings))
    t = _template(choice)
    (req,) = t["spec"]["spec"]["devices"]["requests"]
    assert "firstAvailable" not in req and "config" not in t["spec"]["spec"]["devices"]
    return choice, req


def test_a_queued_mig_ok_request_without_placement_asks_exactly_for_its_profiles_class():
    choice, req = _queued_request(GpuRequest(count=1, mig_ok=True, memory_gib=10, shared_ok=True), None,
                                  sharing_strategy="MPS")
    assert req == {"name": "gpu", "exactly": {"deviceClassName": "1g.10gb.mig.nvidia.com",
                                              "allocationMode": "ExactCount", "count": 1}}
    assert choice.device_type == "mig-1g.10gb" and choice.device_fraction == pytest.approx(1 / 7)
    assert choice.sharing is None and "firstAvailable" not in choice.to_json()


def test_a_queued_placement_keeps_its_flavor_mig_slice_or_whole_gpu():
    _, mig = _queued_request(GpuRequest(count=1, mig_ok=True), "mig-1g.10gb")
    assert mig["exactly"] == {"deviceClassName": "1g.10gb.mig.nvidia.com", "allocationMode": "ExactCount", "count": 1}
    choice, gpu = _queued_request(GpuRequest(count=2, mig_ok=True, memory_gib=80), "NVIDIA A100-SXM4-80GB")
    assert gpu["exactly"] == {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2}
    assert choice.device_type == "NVIDIA A100-SXM4-80GB" and choice.device_fraction == 2.0


def test_mig_device_class_refuses_a_malformed_profile():
    assert dra.mig_device_class("3g.40gb") == "3g.40gb.mig.nvidia.com"
    with pytest.raises(dra.ManifestError, match="'3g40gb' is not a MIG profile"):
        dra.mig_device_class("3g40gb")
