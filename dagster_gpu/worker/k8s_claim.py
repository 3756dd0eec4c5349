"""The step pod's own DRA ResourceClaim, read by the worker for the materialization's ``k8s/*`` metadata.

The claim is generated from the step's ResourceClaimTemplate after the pod is created, so only the pod
can learn its name at run time: the worker reads its Pod (``status.resourceClaimStatuses``) and that
ResourceClaim (``status.allocation``) with the pod's ServiceAccount token (get on pods and
resourceclaims in the namespace: resources/k8s/manifests/43-worker-rbac.yaml). Without a token the
materialization says why in ``k8s/claim_unavailable_reason``; the post-run observation still carries the
claim, read by the orchestrating process.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

SA_DIR_ENV = "DAGSTER_GPU_K8S_SA_DIR"
DEFAULT_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
NO_TOKEN = (
    "no ServiceAccount token in the pod (set kubernetes.container_context.service_account_name to an account "
    "that may get pods and resourceclaims, e.g. dagster-gpu-worker from resources/k8s/manifests/43-worker-rbac.yaml)"
)


def claim_metadata(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``k8s/resource_claim`` (name) and ``k8s/allocated_devices`` (``driver/pool/device``, comma-separated)
    of this pod's claim; ``{}`` for a pod without a claim (CPU-only step) or outside a step pod; else
    ``{"k8s/claim_unavailable_reason": why}``. Never raises: the step's outcome does not depend on it.

    Reads the token directory ``$DAGSTER_GPU_K8S_SA_DIR`` (default the kubelet's mount,
    /var/run/secrets/kubernetes.io/serviceaccount) and the API server from KUBERNETES_SERVICE_HOST/PORT.
    """
    e = env if env is not None else os.environ
    pod_name, namespace = e.get("DAGSTER_GPU_K8S_POD"), e.get("DAGSTER_GPU_K8S_NAMESPACE")
    if not pod_name or not namespace:
        return {}
    sa_dir = Path(e.get(SA_DIR_ENV) or DEFAULT_SA_DIR)
    if not (sa_dir / "token").is_file():
        return {"k8s/claim_unavailable_reason": NO_TOKEN}
    try:
        from kubernetes import client
        from kubernetes.config.incluster_config import InClusterConfigLoader

        from dagster_gpu.k8s.client import KubeClient
        from dagster_gpu.k8s.manifests import allocated_devices, generated_claim_name

        cfg = client.Configuration()
        InClusterConfigLoader(str(sa_dir / "token"), str(sa_dir / "ca.crt"), environ=e).load_and_set(cfg)
        kube = KubeClient(client.ApiClient(cfg), namespace)
        pod = kube.read_pod(pod_name)
        if pod is None:
            return {"k8s/claim_unavailable_reason": f"pod {namespace}/{pod_name} not found"}
        name = generated_claim_name(pod)
        if not name:
            return {} if not pod.spec.resource_claims else {
                "k8s/claim_unavailable_reason": f"pod {namespace}/{pod_name} lists no generated ResourceClaim"}
        claim = kube.read_claim(name)
        if claim is None:
            return {"k8s/claim_unavailable_reason": f"ResourceClaim {namespace}/{name} not found"}
        return {"k8s/resource_claim": name, "k8s/allocated_devices": ",".join(allocated_devices(claim))}
    except Exception as ex:  # noqa: BLE001 - metadata only; the reason is recorded instead
        status = getattr(ex, "status", None)
        what = f"HTTP {status} {getattr(ex, 'reason', '')}".strip() if status else f"{type(ex).__name__}: {ex}"
        return {"k8s/claim_unavailable_reason": f"reading the pod's ResourceClaim failed: {what}"[:500]}
