"""dagster_gpu.k8s.claim without a cluster: when the step pod cannot read its claim it says why."""

from __future__ import annotations

import socket

from dagster_gpu.k8s.claim import NO_TOKEN, claim_metadata


def test_outside_a_step_pod_nothing_is_reported():
    assert claim_metadata({}) == {}
    assert claim_metadata({"DAGSTER_GPU_K8S_POD": "p"}) == {}


def test_without_a_service_account_token_the_reason_names_the_setting(tmp_path):
    env = {"DAGSTER_GPU_K8S_POD": "p", "DAGSTER_GPU_K8S_NAMESPACE": "ns", "DAGSTER_GPU_K8S_SA_DIR": str(tmp_path)}
    md = claim_metadata(env)
    assert md == {"k8s/claim_unavailable_reason": NO_TOKEN}
    assert "service_account_name" in NO_TOKEN and "43-worker-rbac.yaml" in NO_TOKEN


def test_an_unreachable_api_server_is_a_reason_not_an_error(tmp_path):
    (tmp_path / "token").write_text("t0ken")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"DAGSTER_GPU_K8S_POD": "p", "DAGSTER_GPU_K8S_NAMESPACE": "ns", "DAGSTER_GPU_K8S_SA_DIR": str(tmp_path),
           "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)}
    md = claim_metadata(env)
    assert list(md) == ["k8s/claim_unavailable_reason"]
    assert md["k8s/claim_unavailable_reason"].startswith("reading the pod's ResourceClaim failed: ")
    assert "t0ken" not in md["k8s/claim_unavailable_reason"]  # never the credential
    assert len(md["k8s/claim_unavailable_reason"]) <= 500


# --- which devices a claim holds: claims and slices in tests/data/k8s ---------------------------------------
# claim_allocated_*.json: ResourceClaims as kube-scheduler leaves them (kubernetes/api v0.34.0
# resource/v1/types.go: status.allocation.devices.results[] {request, driver, pool, device}; a firstAvailable
# result names its subrequest, "gpu/mig"), hand-written and checked against the 1.34 schema with
# kubernetes-validate; slices_*.json: see tests/data/k8s/make_dra_slices.py (NVIDIA/k8s-dra-driver-gpu v25.12.0).

import json  # noqa: E402
from pathlib import Path  # noqa: E402

from dagster_gpu.k8s.dra import allocation, choice_from_json, device_choice  # noqa: E402
from dagster_gpu.k8s.pod import PodSettings  # noqa: E402
from dagster_gpu.core.request import GpuRequest  # noqa: E402
from dagster_gpu.k8s.claim import claim_facts  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "k8s"


def _load(name):
    d = json.loads((DATA / name).read_text())
    return d.get("items", d)


SLICES = _load("slices_static_mig.json") + _load("slices_dynamic_mig.json")


def test_a_static_mig_claim_names_the_mig_device_not_its_parent():
    claim = _load("claim_allocated_static_mig.json")
    md, uuids = claim_facts("dgpu-3f2a9c-embeddings-0-gpu-k7x2p", claim, SLICES)
    assert uuids == ["MIG-8b2d4f60-1a3c-5e7f-9b0d-2f4a6c8e0b10"]
    assert md == {"k8s/resource_claim": "dgpu-3f2a9c-embeddings-0-gpu-k7x2p",
                  "k8s/allocated_devices": "gpu.nvidia.com/gpu-node-1/gpu-1-mig-1g10gb-19-0",
                  "k8s/device_request": "gpu/mig", "k8s/device_uuids": "MIG-8b2d4f60-1a3c-5e7f-9b0d-2f4a6c8e0b10"}
    (dev,) = allocation(claim, SLICES)
    assert (dev.parent_uuid, dev.mig_profile) == ("GPU-3f1e9a52-7c4d-4b8e-9a61-2d5c8e0f1a02", "1g.10gb")


def test_a_whole_gpu_claim_names_the_gpu_and_its_subrequest_resolves_the_bill():
    claim = _load("claim_allocated_whole_gpu.json")
    md, uuids = claim_facts("c", claim, SLICES)
    assert uuids == ["GPU-3f1e9a52-7c4d-4b8e-9a61-2d5c8e0f1a01"] and md["k8s/device_request"] == "gpu/gpu"
    # the pod's device-request annotation (DeviceChoice.to_json) resolved by the allocated subrequest
    ann = json.loads(json.dumps(device_choice(GpuRequest(count=1, mig_ok=True), None, PodSettings()).to_json()))
    held = choice_from_json(ann).resolve(md["k8s/device_request"])
    assert (held.device_class, held.device_type, held.device_fraction) == ("gpu.nvidia.com", "default", 1.0)
    assert choice_from_json(ann).resolve("gpu/mig").device_fraction == 1 / 7


def test_a_dynamic_mig_device_has_no_uuid_until_prepared_so_its_parent_is_read():
    md, uuids = claim_facts("c", _load("claim_allocated_dynamic_mig.json"), SLICES)
    assert uuids == ["GPU-3f1e9a52-7c4d-4b8e-9a61-2d5c8e0f1a03"] and md["k8s/device_uuids"] == uuids[0]


def test_slices_not_readable_or_not_listing_the_device_is_a_reason():
    claim = _load("claim_allocated_static_mig.json")
    md, uuids = claim_facts("c", claim, None, "listing the node's ResourceSlices failed: HTTP 403 Forbidden")
    assert uuids == [] and md["k8s/device_uuids_unavailable_reason"].endswith("HTTP 403 Forbidden")
    assert md["k8s/allocated_devices"] == "gpu.nvidia.com/gpu-node-1/gpu-1-mig-1g10gb-19-0"
    md, uuids = claim_facts("c", claim, _load("slices_dynamic_mig.json"))  # another node's slices only
    assert uuids == [] and "gpu-1-mig-1g10gb-19-0" in md["k8s/device_uuids_unavailable_reason"]
