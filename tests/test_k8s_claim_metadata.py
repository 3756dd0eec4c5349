"""dagster_gpu.worker.k8s_claim without a cluster: when the step pod cannot read its claim it says why."""

from __future__ import annotations

import socket

from dagster_gpu.worker.k8s_claim import NO_TOKEN, claim_metadata


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
