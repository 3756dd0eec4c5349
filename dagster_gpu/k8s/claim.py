"""The step pod's own DRA ResourceClaim, read by the worker: the materialization's ``k8s/*`` metadata and
the UUIDs of the allocated devices, which the GPU sampler reads.

The claim is generated from the step's ResourceClaimTemplate after the pod is created, so only the pod
can learn its name at run time: the worker reads its Pod (``status.resourceClaimStatuses``), that
ResourceClaim (``status.allocation``) and its node's ResourceSlices (each allocated device's ``uuid``)
with the pod's ServiceAccount token (get on pods and resourceclaims in the namespace, list on
resourceslices: resources/k8s/manifests/43-worker-rbac.yaml). The NVIDIA DRA driver tells the container
nothing about its devices (``NVIDIA_VISIBLE_DEVICES=void``, no ``CUDA_VISIBLE_DEVICES``), so the slices
are where the UUIDs come from. Without a token the materialization says why in
``k8s/claim_unavailable_reason``; the post-run observation still carries the claim, read by the
orchestrating process. An allocated claim does not change while its pod runs: it is read once per pod
(and a failure to read it is not retried for every partition).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

SA_DIR_ENV = "DAGSTER_GPU_K8S_SA_DIR"
DEFAULT_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
NO_TOKEN = (
    "no ServiceAccount token in the pod (set kubernetes.container_context.service_account_name to an account "
    "that may get pods and resourceclaims, e.g. dagster-gpu-worker from resources/k8s/manifests/43-worker-rbac.yaml)"
)
_RESOURCE_APIS = {"v1": "ResourceV1Api", "v1beta2": "ResourceV1beta2Api", "v1beta1": "ResourceV1beta1Api"}
_lock = threading.Lock()
_read_once: dict[tuple[str, str], tuple[dict[str, str], list[str]]] = {}


def claim_facts(claim_name: str, claim: Mapping[str, Any], slices: Sequence[Mapping[str, Any]] | None,
                slices_error: str | None = None) -> tuple[dict[str, str], list[str]]:
    """(metadata, UUIDs to sample) of an allocated claim (pure).

    Metadata: ``k8s/resource_claim``, ``k8s/allocated_devices`` (``driver/pool/device``, comma-separated),
    ``k8s/device_request`` (each result's request: ``gpu``, or ``gpu/mig`` / ``gpu/gpu`` for a
    firstAvailable request) and ``k8s/device_uuids`` (each device's ``uuid``; an abstract dynamic-MIG
    device, which has none until prepared, gives its ``parentUUID``) or, when ``slices`` is None,
    ``k8s/device_uuids_unavailable_reason`` (``slices_error``). The UUIDs are those of ``k8s/device_uuids``.
    """
    from dagster_gpu.k8s.manifests import allocation  # deferred: this module runs in a step pod without the client

    devices = allocation(claim, slices or ())
    md = {"k8s/resource_claim": claim_name,
          "k8s/allocated_devices": ",".join(f"{d.driver}/{d.pool}/{d.device}" for d in devices),
          "k8s/device_request": ",".join(d.request for d in devices)}
    if slices is None:
        md["k8s/device_uuids_unavailable_reason"] = slices_error or "the node's ResourceSlices were not read"
        return md, []
    uuids = [d.nvml_uuid for d in devices]
    if any(u is None for u in uuids):
        missing = [d.device for d, u in zip(devices, uuids) if u is None]
        md["k8s/device_uuids_unavailable_reason"] = f"no uuid or parentUUID attribute for {', '.join(missing)} in the node's ResourceSlices"
        return md, []
    md["k8s/device_uuids"] = ",".join(uuids)
    return md, list(uuids)


def _why(ex: Exception) -> str:
    status = getattr(ex, "status", None)
    return f"HTTP {status} {getattr(ex, 'reason', '')}".strip() if status else f"{type(ex).__name__}: {ex}"


def _read(e: Mapping[str, str], pod_name: str, namespace: str) -> tuple[dict[str, str], list[str]]:
    sa_dir = Path(e.get(SA_DIR_ENV) or DEFAULT_SA_DIR)
    if not (sa_dir / "token").is_file():
        return {"k8s/claim_unavailable_reason": NO_TOKEN}, []
    try:
        from kubernetes import client
        from kubernetes.config.incluster_config import InClusterConfigLoader

        from dagster_gpu.k8s.client import KubeClient  # deferred: the kubernetes client, in a step pod only
        from dagster_gpu.k8s.manifests import generated_claim_name, to_dict  # deferred: with the client above

        cfg = client.Configuration()
        InClusterConfigLoader(str(sa_dir / "token"), str(sa_dir / "ca.crt"), environ=e).load_and_set(cfg)
        api = client.ApiClient(cfg)
        kube = KubeClient(api, namespace)
        pod = kube.read_pod(pod_name)
        if pod is None:
            return {"k8s/claim_unavailable_reason": f"pod {namespace}/{pod_name} not found"}, []
        name = generated_claim_name(pod)
        if not name:
            return ({} if not pod.spec.resource_claims else {
                "k8s/claim_unavailable_reason": f"pod {namespace}/{pod_name} lists no generated ResourceClaim"}), []
        claim = kube.read_claim(name)
        if claim is None:
            return {"k8s/claim_unavailable_reason": f"ResourceClaim {namespace}/{name} not found"}, []
        slices, error = None, None
        try:
            res = getattr(client, _RESOURCE_APIS[kube.resource_api_version])(api)
            listed = res.list_resource_slice(field_selector=f"spec.nodeName={pod.spec.node_name}")
            slices = [to_dict(s) for s in listed.items]
        except Exception as ex:  # noqa: BLE001 - e.g. 403 without list on resourceslices: the UUIDs stay unknown
            error = f"listing the node's ResourceSlices failed: {_why(ex)}"[:500]
        return claim_facts(name, to_dict(claim), slices, error)
    except Exception as ex:  # noqa: BLE001 - metadata only; the reason is recorded instead
        return {"k8s/claim_unavailable_reason": f"reading the pod's ResourceClaim failed: {_why(ex)}"[:500]}, []


def _facts(env: Mapping[str, str] | None) -> tuple[dict[str, str], list[str]]:
    e = env if env is not None else os.environ
    pod_name, namespace = e.get("DAGSTER_GPU_K8S_POD"), e.get("DAGSTER_GPU_K8S_NAMESPACE")
    if not pod_name or not namespace:
        return {}, []
    key = (namespace, pod_name, e.get(SA_DIR_ENV, ""), e.get("KUBERNETES_SERVICE_HOST", ""), e.get("KUBERNETES_SERVICE_PORT", ""))
    with _lock:
        if key in _read_once:
            return _read_once[key]
    md, uuids = _read(e, pod_name, namespace)
    with _lock:  # once per pod: an allocated claim stays as it is while the pod runs, and a reason is kept
        return _read_once.setdefault(key, (md, uuids))


def claim_metadata(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The metadata of :func:`claim_facts` for this pod's claim; ``{}`` for a pod without a claim (CPU-only
    step) or outside a step pod; else ``{"k8s/claim_unavailable_reason": why}``. Never raises: the step's
    outcome does not depend on it.

    Reads the token directory ``$DAGSTER_GPU_K8S_SA_DIR`` (default the kubelet's mount,
    /var/run/secrets/kubernetes.io/serviceaccount) and the API server from KUBERNETES_SERVICE_HOST/PORT.
    """
    return dict(_facts(env)[0])


def allocated_device_uuids(env: Mapping[str, str] | None = None) -> list[str]:
    """UUIDs of the devices allocated to this pod's claim (``GPU-…``/``MIG-…``; a dynamic-MIG slice's
    parent GPU), for :class:`~dagster_gpu.telemetry.nvml.NvmlSampler`; [] when unknown (outside a step pod,
    no token, the slices not readable): the sampler then reads what NVML sees. Never raises."""
    return list(_facts(env)[1])
