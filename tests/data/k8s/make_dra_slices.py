"""Writes slices_*.json: ResourceSlices shaped as NVIDIA/k8s-dra-driver-gpu v25.12.0 publishes them.

* ``slices_static_mig.json`` (static MIG, the default mode; ``cmd/gpu-kubelet-plugin/deviceinfo.go``
  ``GpuInfo.GetDevice`` / ``MigDeviceInfo.GetDevice``): node ``gpu-node-1`` with an H100 80GB HBM3 as
  ``gpu-0`` (``memory`` = NVML's total, 81559Mi as nvidia-smi shows it) and an A100-SXM4-80GB in MIG mode
  (it publishes only its MIG devices) split into two 1g.10gb (9728Mi = the GPU-instance profile's
  MemorySizeMB, ``nvidia-smi mig -lgip`` 9.50 GiB; device name
  ``gpu-<minor>-mig-<profile without dots>-<profileId>-<placementStart>``, ``mig.go`` ToCanonicalName) and one
  3g.40gb (40192Mi). Pool = node name, generated slice name, the Node as owner.
* ``slices_dynamic_mig.json`` (dynamic MIG, ``partitions.go``): one A100-SXM4-80GB ``gpu-1`` with counter set
  ``gpu-1-counter-set`` (the 7g.80gb profile's capacities as counters, ``camelToDNSName``'d, plus
  ``memory-slice-0..7`` of value 1); the full GPU consumes all of it; abstract MIG devices (no ``uuid``) for
  every placement of 1g.10gb (profile 19, starts 0..6, 1 slice), 3g.40gb (9, starts 0 and 4, 4 slices) and
  7g.80gb (0, start 0, 8 slices), each consuming its capacities and its memory slices. One slice holds
  counters and devices, as the driver does below Kubernetes 1.35 (``driver.go``).
Profile figures: A100-SXM4-80GB ``nvidia-smi mig -lgip`` (SMs 14/42/98, memory 9.50/39.25/79.00 GiB).
Run: ``python tests/data/k8s/make_dra_slices.py``.
"""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
GI = 1024 ** 3
MI = 1024 ** 2
A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"


def common(product, arch, cc, bus):
    return {"productName": {"string": product}, "brand": {"string": "Nvidia"}, "architecture": {"string": arch},
            "cudaComputeCapability": {"version": cc}, "driverVersion": {"version": "580.95.5"},
            "cudaDriverVersion": {"version": "13.0.0"}, "resource.kubernetes.io/pciBusID": {"string": bus}}


def meta(node, suffix):
    return {"name": f"{node}-gpu.nvidia.com-{suffix}", "generateName": f"{node}-gpu.nvidia.com-",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": "7d0c5a1e-1b2c-4d3e-8f00-00000000a001",
                                 "controller": True}]}


PROFILES = {  # profile: (profile id, SMs, copy engines, decoders, jpeg, ofa, memory MiB, slices, placement starts)
    "1g.10gb": (19, 14, 1, 0, 0, 0, 9728, 1, range(7)),
    "3g.40gb": (9, 42, 3, 2, 0, 0, 40192, 4, (0, 4)),
    "7g.80gb": (0, 98, 7, 5, 1, 1, 80896, 8, (0,)),
}


def caps(p):
    pid, sm, ce, dec, jpg, ofa, mem, _, _ = PROFILES[p]
    return {"multiprocessors": sm, "copyEngines": ce, "decoders": dec, "encoders": 0, "jpegEngines": jpg,
            "ofaEngines": ofa, "memory": mem * MI}


def dns(name):
    return "".join("-" + c.lower() if c.isupper() else c for c in name)


def counters(cap, start, size):
    out = {dns(k): {"value": str(v)} for k, v in cap.items()}
    out.update({f"memory-slice-{i}": {"value": "1"} for i in range(start, start + size)})
    return out


def static():
    mig = common(A100, "Ampere", "8.0.0", "0000:17:00.0")
    devices = [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "GPU-3f1e9a52-7c4d-4b8e-9a61-2d5c8e0f1a01"},
                                                **common(H100, "Hopper", "9.0.0", "0000:07:00.0")},
                "capacity": {"memory": {"value": str(81559 * MI)}}}]
    for i, (p, start) in enumerate((("1g.10gb", 0), ("1g.10gb", 1), ("3g.40gb", 4))):
        pid = PROFILES[p][0]
        c = {k: {"value": str(v)} for k, v in caps(p).items()}
        devices.append({"name": f"gpu-1-mig-{p.replace('.', '')}-{pid}-{start}", "attributes": {
            "type": {"string": "mig"}, "uuid": {"string": f"MIG-8b2d4f60-1a3c-5e7f-9b0d-2f4a6c8e0b1{i}"},
            "parentUUID": {"string": "GPU-3f1e9a52-7c4d-4b8e-9a61-2d5c8e0f1a02"}, "profile": {"string": p}, **mig},
            "capacity": c})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "items": [{
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": meta("gpu-node-1", "x7k2q"),
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "gpu-node-1",
                 "pool": {"name": "gpu-node-1", "generation": 1, "resourceSliceCount": 1}, "devices": devices}}]}


def dynamic():
    attrs = common(A100, "Ampere", "8.0.0", "0000:27:00.0")
    full_cap = caps("7g.80gb")
    cset = "gpu-1-counter-set"
    devices = [{"name": "gpu-1", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "GPU-3f1e9a52-7c4d-4b8e-9a61-2d5c8e0f1a03"}, **attrs},
                "capacity": {k: {"value": str(v)} for k, v in full_cap.items()},
                "consumesCounters": [{"counterSet": cset, "counters": counters(full_cap, 0, 8)}]}]
    for p, (pid, *_, size, starts) in PROFILES.items():
        for start in starts:
            devices.append({"name": f"gpu-1-mig-{p.replace('.', '')}-{pid}-{start}", "attributes": {
                "type": {"string": "mig"}, "parentUUID": {"string": "GPU-3f1e9a52-7c4d-4b8e-9a61-2d5c8e0f1a03"},
                "profile": {"string": p}, **attrs},
                "capacity": {k: {"value": str(v)} for k, v in caps(p).items()},
                "consumesCounters": [{"counterSet": cset, "counters": counters(caps(p), start, size)}]})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "items": [{
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": meta("gpu-node-2", "m4r8t"),
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "gpu-node-2",
                 "pool": {"name": "gpu-node-2", "generation": 3, "resourceSliceCount": 1},
                 "sharedCounters": [{"name": cset, "counters": counters(full_cap, 0, 8)}], "devices": devices}}]}


if __name__ == "__main__":
    for name, doc in (("slices_static_mig.json", static()), ("slices_dynamic_mig.json", dynamic())):
        (HERE / name).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
