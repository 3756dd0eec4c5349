"""Sanity of the local Kubernetes 1.34 control plane (resources/k8s/cluster.sh) the kubernetes backend is tested on.

Real components: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the node agent.
Everything namespaced is done as the executor's ServiceAccount, not as admin.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.k8s_helpers import NAMESPACE, admin_api, executor_api, labelled, require_cluster, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.e2e]


@pytest.fixture(scope="module")
def apis():
    require_cluster()
    return admin_api(), executor_api()


def _template(name: str, labels: dict, device_class: str, expr: str | None) -> dict:
    req = {"deviceClassName": device_class}
    if expr:
        req["selectors"] = [{"cel": {"expression": expr}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "labels": labels},
        # spec.metadata: copied onto every ResourceClaim the controller generates from the template
        "spec": {"metadata": {"labels": labels}, "spec": {"devices": {"requests": [{"name": "gpu", "exactly": req}]}}},
    }


def _pod(name: str, labels: dict, template: str | None, command: list[str], env=None, grace: int = 30) -> dict:
    c = {"name": "main", "image": "local", "command": command, "env": env or []}
    # the namespace enforces Pod Security "restricted" (resources/k8s/manifests/00-namespace.yaml)
    c["securityContext"] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    spec = {"restartPolicy": "Never", "terminationGracePeriodSeconds": grace, "containers": [c],
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}}
    if template:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
        c["resources"] = {"claims": [{"name": "gpu"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}


def test_apiserver_serves_dra_v1(apis):
    admin, _ = apis
    v = client.VersionApi(admin).get_code()
    assert v.major == "1" and v.minor == "34", v
    groups = {g.name: [x.version for x in g.versions] for g in client.ApisApi(admin).get_api_versions().groups}
    assert "v1" in groups["resource.k8s.io"]
    res = client.ResourceV1Api(admin)
    classes = {d.metadata.name for d in res.list_device_class().items}
    assert {"gpu.nvidia.com", "mig.nvidia.com"} <= classes
    devices = [d for s in res.list_resource_slice(field_selector="spec.driver=gpu.nvidia.com").items
               for d in s.spec.devices]
    kinds = [d.attributes["type"].string for d in devices]
    assert kinds.count("gpu") == 2 and kinds.count("mig") == 7
    assert all(d.attributes["productName"].string == "NVIDIA A100-SXM4-80GB" for d in devices)
    assert {d.attributes["profile"].string for d in devices if d.attributes["type"].string == "mig"} == {"1g.10gb"}
    node = client.CoreV1Api(admin).read_node("gpu-node-0")
    assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)


def test_executor_service_account_is_least_privilege(apis):
    _, ex = apis
    core = client.CoreV1Api(ex)
    core.list_namespaced_pod(NAMESPACE)  # allowed
    res = client.ResourceV1Api(ex)
    assert len(res.list_resource_slice().items) >= 1  # read-only device inventory for the cost policy
    res.list_resource_claim_for_all_namespaces()
    for call in (lambda: core.list_namespaced_secret(NAMESPACE), lambda: core.list_node(),
                 lambda: core.list_namespaced_pod("default"),
                 lambda: res.delete_collection_resource_slice(),
                 lambda: res.create_namespaced_resource_claim("default", {"metadata": {"name": "x"}, "spec": {}})):
        with pytest.raises(ApiException) as e:
            call()
        assert e.value.status == 403


def test_worker_service_account_reads_only_pods_and_claims(apis):
    """dagster-gpu-worker (43-worker-rbac.yaml), the step pods' account: get pods and resourceclaims, nothing else."""
    admin, _ = apis
    tr = client.CoreV1Api(admin).create_namespaced_service_account_token(
        "dagster-gpu-worker", NAMESPACE, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)))
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert = admin.configuration.host, admin.configuration.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {tr.status.token}"}
    worker = client.ApiClient(cfg)
    core, res = client.CoreV1Api(worker), client.ResourceV1Api(worker)
    for allowed in (lambda: core.read_namespaced_pod("no-such-pod", NAMESPACE),
                    lambda: res.read_namespaced_resource_claim("no-such-claim", NAMESPACE)):
        with pytest.raises(ApiException) as e:
            allowed()
        assert e.value.status == 404  # authorized; the object does not exist
    for denied in (lambda: core.list_namespaced_pod(NAMESPACE), lambda: core.list_namespaced_secret(NAMESPACE),
                   lambda: core.read_namespaced_secret("dagster-postgresql-secret", NAMESPACE),
                   lambda: core.delete_namespaced_pod("x", NAMESPACE),
                   lambda: res.list_namespaced_resource_claim(NAMESPACE),
                   lambda: core.read_namespaced_pod("x", "default")):
        with pytest.raises(ApiException) as e:
            denied()
        assert e.value.status == 403


def test_claim_from_template_is_allocated_by_scheduler_and_released(apis, tmp_path):
    admin, ex = apis
    core, res = client.CoreV1Api(ex), client.ResourceV1Api(ex)
    name = f"sanity-{uuid.uuid4().hex[:8]}"
    labels = {"dagster-gpu/test": name}
    # A Secret (created by admin: the executor may not read or write secrets) reaches the pod by reference.
    client.CoreV1Api(admin).create_namespaced_secret(NAMESPACE, client.V1Secret(
        metadata=client.V1ObjectMeta(name=name, labels=labels), string_data={"password": "s3cret"}))
    out = tmp_path / "out.txt"
    os.chmod(tmp_path, 0o777)
    res.create_namespaced_resource_claim_template(NAMESPACE, _template(
        name, labels, "mig.nvidia.com", "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"))
    script = f'echo "$PW|$NVIDIA_VISIBLE_DEVICES|$POD" > {out}; exit 3'
    env = [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": name, "key": "password"}}},
           {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    t0 = time.monotonic()
    core.create_namespaced_pod(NAMESPACE, _pod(name, labels, name, ["sh", "-c", script], env))
    try:
        pod = wait_for(lambda: (p := core.read_namespaced_pod(name, NAMESPACE)).status.phase in ("Succeeded", "Failed")
                       and p, 60, what="pod to finish")
        assert pod.status.phase == "Failed"
        term = pod.status.container_statuses[0].state.terminated
        assert term.exit_code == 3 and term.started_at and term.finished_at
        claim_name = pod.status.resource_claim_statuses[0].resource_claim_name
        assert claim_name.startswith(f"{name}-gpu-")
        pw, uuids, podname = out.read_text().strip().split("|")
        assert pw == "s3cret" and podname == name and uuids == "void"  # the driver's CDI spec: NVIDIA_VISIBLE_DEVICES=void
        # The resourceclaim controller deletes the generated claim once the pod is done.
        wait_for(lambda: not labelled(ex, f"dagster-gpu/test={name}")["claims"] and
                 not [c for c in res.list_namespaced_resource_claim(NAMESPACE).items if c.metadata.name == claim_name],
                 30, what="claim deletion")
        print(f"create->finished {time.monotonic() - t0:.2f}s")
    finally:
        core.delete_namespaced_pod(name, NAMESPACE)
        res.delete_namespaced_resource_claim_template(name, NAMESPACE)
        client.CoreV1Api(admin).delete_namespaced_secret(name, NAMESPACE)


def test_allocation_names_device_and_graceful_delete_kills_process(apis, tmp_path):
    _, ex = apis
    core, res = client.CoreV1Api(ex), client.ResourceV1Api(ex)
    name = f"sanity-{uuid.uuid4().hex[:8]}"
    labels = {"dagster-gpu/test": name}
    os.chmod(tmp_path, 0o777)
    marker = tmp_path / "term.txt"
    res.create_namespaced_resource_claim_template(NAMESPACE, _template(
        name, labels, "gpu.nvidia.com",
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('79Gi')) >= 0"))
    script = f"trap 'echo TERM > {marker}; exit 143' TERM; while true; do sleep 0.1; done"
    core.create_namespaced_pod(NAMESPACE, _pod(name, labels, name, ["bash", "-c", script], grace=20))
    wait_for(lambda: core.read_namespaced_pod(name, NAMESPACE).status.phase == "Running", 60, what="Running")
    pod = core.read_namespaced_pod(name, NAMESPACE)
    claim = res.read_namespaced_resource_claim(pod.status.resource_claim_statuses[0].resource_claim_name, NAMESPACE)
    results = claim.status.allocation.devices.results
    assert [(r.driver, r.pool) for r in results] == [("gpu.nvidia.com", "gpu-node-0")]
    assert results[0].device in ("gpu-0", "gpu-1")
    assert [r.name for r in claim.status.reserved_for] == [name]
    assert claim.metadata.owner_references[0].name == name
    core.delete_namespaced_pod(name, NAMESPACE)  # graceful (default grace from the pod spec)
    wait_for(lambda: not labelled(ex, f"dagster-gpu/test={name}")["pods"], 30, what="pod removal")
    assert marker.read_text().strip() == "TERM"
    wait_for(lambda: not [c for c in res.list_namespaced_resource_claim(NAMESPACE).items
                          if c.metadata.name == claim.metadata.name], 30, what="claim deletion")
    res.delete_namespaced_resource_claim_template(name, NAMESPACE)


def test_impossible_request_stays_pending_with_scheduler_message(apis):
    _, ex = apis
    core, res = client.CoreV1Api(ex), client.ResourceV1Api(ex)
    name = f"sanity-{uuid.uuid4().hex[:8]}"
    labels = {"dagster-gpu/test": name}
    res.create_namespaced_resource_claim_template(NAMESPACE, _template(
        name, labels, "gpu.nvidia.com",
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('200Gi')) >= 0"))
    core.create_namespaced_pod(NAMESPACE, _pod(name, labels, name, ["true"]))
    try:
        def unschedulable():
            p = core.read_namespaced_pod(name, NAMESPACE)
            return [c for c in p.status.conditions or [] if c.type == "PodScheduled" and c.reason == "Unschedulable"]
        cond = wait_for(unschedulable, 30, what="Unschedulable")[0]
        assert "cannot allocate all claims" in cond.message, cond.message
        evs = core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={name}").items
        assert any(e.reason == "FailedScheduling" for e in evs)
    finally:
        core.delete_namespaced_pod(name, NAMESPACE)
        res.delete_namespaced_resource_claim_template(name, NAMESPACE)
    wait_for(lambda: not any(labelled(ex, f"dagster-gpu/test={name}").values()), 30, what="cleanup")
