"""Free DRA devices for the cost policy, from the fake node's real ResourceSlice manifest and claim shapes."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from dagster_gpu.k8s.inventory import allocated_device_ids, device_groups

SLICE = yaml.safe_load((Path(__file__).resolve().parents[1] / "resources/k8s/manifests/30-resourceslice-gpu-node-0.yaml").read_text())


def _claim(*devices: str, pool: str = "gpu-node-0", driver: str = "gpu.nvidia.com") -> dict:
    return {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": driver, "pool": pool, "device": d} for d in devices]}}}}


def test_pools_subtract_allocated_devices():
    claims = [_claim("gpu-1"), _claim("gpu-2-mig-1g10gb-19-0", "gpu-2-mig-1g10gb-19-4"), {"status": {}}, _claim("gpu-0", pool="other-node")]
    full, mig = device_groups([SLICE], claims, {"mig-1g.10gb": 3})
    assert (full.device, full.product, full.memory_gib, full.total, full.free, full.pending, full.mig_profile) == (
        "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", 80.0, 2, 1, 0, None)
    assert (mig.device, mig.memory_gib, mig.total, mig.free, mig.pending, mig.mig_profile) == ("mig-1g.10gb", 9.5, 7, 5, 3, "1g.10gb")
    assert abs(mig.fraction - 1 / 7) < 1e-12


def test_v1beta1_slices_and_other_drivers():
    beta = copy.deepcopy(SLICE)
    beta["spec"]["devices"] = [{"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}} for d in beta["spec"]["devices"]]
    other = copy.deepcopy(SLICE)
    other["spec"]["driver"] = "example.com/fpga"
    pools = device_groups([beta, other], [])
    assert [(p.device, p.total, p.free) for p in pools] == [("NVIDIA A100-SXM4-80GB", 2, 2), ("mig-1g.10gb", 7, 7)]
    assert allocated_device_ids([_claim("a", "b")]) == {("gpu.nvidia.com", "gpu-node-0", "a"), ("gpu.nvidia.com", "gpu-node-0", "b")}
