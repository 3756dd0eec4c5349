"""Free DRA devices for the cost policy, from the fake node's real ResourceSlice manifest and claim shapes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml

from dagster_gpu.k8s.inventory import allocated_device_ids, device_groups

SLICE = yaml.safe_load((Path(__file__).resolve().parent / "data/k8s/slice_gpu_node_0.yaml").read_text())


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


DATA = Path(__file__).resolve().parent / "data" / "k8s"
DYNAMIC = json.loads((DATA / "slices_dynamic_mig.json").read_text())["items"]  # see data/k8s/make_dra_slices.py


def _by_device(pools):
    return {p.device: (p.total, p.free) for p in pools}


def test_dynamic_mig_counts_what_the_shared_counters_allow():
    """NVIDIA/k8s-dra-driver-gpu v25.12.0 dynamic MIG (partitions.go): one A100-80GB publishes itself plus 7+2+1
    abstract placements, all consuming gpu-1-counter-set; at most 7 1g.10gb, 2 3g.40gb, 1 7g.80gb or the GPU."""
    pools = device_groups(DYNAMIC, [])
    assert _by_device(pools) == {"NVIDIA A100-SXM4-80GB": (1, 1), "mig-1g.10gb": (7, 7), "mig-3g.40gb": (2, 2), "mig-7g.80gb": (1, 1)}
    # one 1g.10gb at placement 0 (memory slice 0) leaves 6 of them, the 3g.40gb at placement 4, nothing whole
    taken = device_groups(DYNAMIC, [_claim("gpu-1-mig-1g10gb-19-0", pool="gpu-node-2")])
    assert _by_device(taken) == {"NVIDIA A100-SXM4-80GB": (1, 0), "mig-1g.10gb": (7, 6), "mig-3g.40gb": (2, 1), "mig-7g.80gb": (1, 0)}
    # the whole GPU allocated: no placement is free
    whole = device_groups(DYNAMIC, [_claim("gpu-1", pool="gpu-node-2")])
    assert {d: f for d, (_, f) in _by_device(whole).items()} == {"NVIDIA A100-SXM4-80GB": 0, "mig-1g.10gb": 0, "mig-3g.40gb": 0, "mig-7g.80gb": 0}


def test_counters_in_a_separate_slice_of_the_pool():
    """From Kubernetes 1.35 the driver publishes the counter sets in their own slice of the pool (driver.go)."""
    counters, devices = copy.deepcopy(DYNAMIC[0]), copy.deepcopy(DYNAMIC[0])
    del counters["spec"]["devices"], devices["spec"]["sharedCounters"]
    for s in (counters, devices):
        s["spec"]["pool"]["resourceSliceCount"] = 2
    taken = device_groups([counters, devices], [_claim("gpu-1-mig-3g40gb-9-0", pool="gpu-node-2")])
    assert _by_device(taken)["mig-1g.10gb"] == (7, 3) and _by_device(taken)["mig-3g.40gb"] == (2, 1)


def test_only_the_newest_generation_of_a_pool_counts():
    """kubernetes/api v0.34.0 resource/v1/types.go: "A consumer must only use ResourceSlices with the highest
    generation number and ignore all others" (a slice being republished: both generations are listed)."""
    old = copy.deepcopy(SLICE)
    new = copy.deepcopy(SLICE)
    new["metadata"]["name"] += "-b"
    new["spec"]["pool"]["generation"] = 2
    new["spec"]["devices"] = [d for d in new["spec"]["devices"] if d["name"] != "gpu-1"]  # gpu-1 went away
    pools = device_groups([old, new], [])
    assert _by_device(pools) == {"NVIDIA A100-SXM4-80GB": (1, 1), "mig-1g.10gb": (7, 7)}
    assert _by_device(device_groups([new, old], [_claim("gpu-0")])) == {"NVIDIA A100-SXM4-80GB": (1, 0), "mig-1g.10gb": (7, 7)}
