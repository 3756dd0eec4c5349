"""Unit tests (no cluster): the manifests the kubernetes backend makes validate against Kubernetes 1.34."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from dagster_gpu.contracts import StepLaunch
from dagster_gpu.k8s import manifests as m
from dagster_gpu.k8s import names
from dagster_gpu.policy.placement import Placement
from dagster_gpu.core.request import GpuRequest

K8S_VERSION = "1.34.0"
REPO = Path(__file__).resolve().parents[1]


def _launch(request: GpuRequest, device: str | None = None, pk: str | None = "doc-001.txt", attempt: int = 0) -> StepLaunch:
    return StepLaunch(
        run_id="0b5c3c5e-8a8e-4f5b-9d7e-1c2d3e4f5a6b",
        step_key="embeddings",
        partition_keys=(pk,) if pk is not None else (),
        attempt=attempt,
        argv=("/opt/venv/bin/python", "-m", "dagster", "api", "execute_step"),
        env={"DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS": "eJx...", "DAGSTER_GPU_STEP_CONTEXT": "{}"},
        request=request,
        placement=Placement(backend="kubernetes", reason="test", device=device),
    )


def validate(obj) -> dict:
    d = m.to_dict(obj) if not isinstance(obj, dict) else obj
    kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    return d


CASES = {
    "a100-80g": (GpuRequest(count=1, memory_gib=79, product="NVIDIA A100"), None),
    "two-gpus": (GpuRequest(count=2, memory_gib=40), None),
    "mig-ok": (GpuRequest(count=1, mig_ok=True), None),
    "mig-placed": (GpuRequest(count=1), "mig-1g.10gb"),
    "shared": (GpuRequest(count=1, shared_ok=True), None),
    "shared-mig": (GpuRequest(count=1, shared_ok=True, mig_ok=True), None),
    "impossible": (GpuRequest(count=1, memory_gib=200), None),
    "cpu-only": (GpuRequest(count=0), None),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("sharing", [None, "TimeSlicing", "MPS"])
def test_every_manifest_validates_against_1_34(case, sharing):
    req, device = CASES[case]
    settings = m.PodSettings(sharing_strategy=sharing, container_context={
        "env_vars": ["FOO=bar"], "env_secrets": ["extra-env"], "image_pull_policy": "IfNotPresent",
        "volumes": [{"name": "data", "emptyDir": {}}], "volume_mounts": [{"name": "data", "mountPath": "/data"}],
        "labels": {"team": "search"}, "resources": {"limits": {"memory": "4Gi"}}})
    pod, template, choice = m.step_objects(_launch(req, device), settings)
    pod_d = validate(pod)
    if req.count == 0:
        assert template is None and choice is None and "resourceClaims" not in pod_d["spec"]
        return
    t = validate(template)
    for version in ("v1beta2", "v1beta1"):
        validate(m.claim_template_for_version(t, version))
    assert pod_d["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": template.metadata.name}]
    assert pod_d["spec"]["containers"][0]["resources"]["claims"] == [{"name": "gpu"}]
    reqs = t["spec"]["spec"]["devices"]["requests"]
    assert len(reqs) == 1 and set(reqs[0]) == {"name", "firstAvailable" if choice.alternatives else "exactly"}
    cfg = t["spec"]["spec"]["devices"].get("config")
    if sharing and req.shared_ok:
        for c, alt in zip(cfg, choice.alternatives or (choice,)):
            params = c["opaque"]["parameters"]
            assert c["opaque"]["driver"] == "gpu.nvidia.com" and params["sharing"]["strategy"] == sharing
            assert params["kind"] == ("MigDeviceConfig" if alt.mig_profile else "GpuConfig")
    else:
        assert cfg is None


def test_selectors_and_fractions():
    s = m.PodSettings()
    c = m.device_choice(GpuRequest(count=1, memory_gib=79, product="NVIDIA A100"), None, s)
    assert c.device_class == "gpu.nvidia.com" and c.device_fraction == 1.0
    assert c.selectors == (
        "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA A100')",
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('75233Mi')) >= 0",  # 93 % of 79 GiB
    )
    mig = m.device_choice(GpuRequest(count=1, mig_ok=True), "mig-1g.10gb", s)
    assert mig.device_class == "mig.nvidia.com" and mig.mig_profile == "1g.10gb"
    assert mig.device_fraction == pytest.approx(1 / 7) and mig.device_type == "mig-1g.10gb"
    assert mig.selectors == ("device.attributes['gpu.nvidia.com'].profile == '1g.10gb'",)
    assert m.device_choice(GpuRequest(count=1, mig_ok=True), None, m.PodSettings(mig_profile=None)).device_class == "gpu.nvidia.com"
    assert m.device_choice(GpuRequest(count=2), None, s).device_fraction == 2.0
    # a quote in a product name cannot break out of the CEL string literal
    assert m.product_selector("x') || true || ('") == \
        "device.attributes['gpu.nvidia.com'].productName.startsWith('x\\') || true || (\\'')"
    with pytest.raises(m.ManifestError):
        m.device_choice(GpuRequest(count=1), "mig-big", s)


def test_labels_are_valid_and_distinct():
    weird = ["doc 1/ä.txt", "a" * 100, "a" * 100 + "b", "-x-", "ok-key"]
    vals = [m.sanitize_label_value(k) for k in weird]
    assert vals[-1] == "ok-key"
    assert len(set(vals)) == len(vals)
    for v in vals:
        assert len(v) <= 63 and names._LABEL_OK.match(v), v
    pod, template, _ = m.step_objects(_launch(GpuRequest(), pk="s3://bucket/doc 1.txt"), m.PodSettings())
    assert pod.metadata.labels[m.LABEL_PARTITION] == m.sanitize_label_value("s3://bucket/doc 1.txt")
    assert pod.metadata.annotations[m.ANNOTATION_PARTITION_KEY] == "s3://bucket/doc 1.txt"
    assert template.spec.metadata.labels == template.metadata.labels  # generated claims carry the run labels
    assert m.object_name("r", "s", 0) != m.object_name("r", "s", 1) != m.object_name("r2", "s", 1)
    assert len(m.object_name("r" * 36, "s" * 200, 12)) <= 63


def test_no_secret_value_in_pod_spec():
    launch = _launch(GpuRequest())
    pod, _, _ = m.step_objects(launch, m.PodSettings())
    env = {e["name"]: e for e in m.to_dict(pod)["spec"]["containers"][0]["env"]}
    assert env["DAGSTER_PG_PASSWORD"] == {"name": "DAGSTER_PG_PASSWORD", "valueFrom": {
        "secretKeyRef": {"name": "dagster-postgresql-secret", "key": "postgresql-password"}}}
    assert env["DAGSTER_GPU_K8S_POD"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    bad = StepLaunch(**{**launch.__dict__, "env": {**launch.env, "DAGSTER_PG_PASSWORD": "hunter2"}})
    with pytest.raises(m.ManifestError, match="clear text"):
        m.step_objects(bad, m.PodSettings())
    spec = m.to_dict(pod)["spec"]
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in spec  # the namespace's default account, no token
    named, _, _ = m.step_objects(launch, m.PodSettings(container_context={"service_account_name": "dagster-gpu-worker"}))
    spec = m.to_dict(named)["spec"]
    assert spec["serviceAccountName"] == "dagster-gpu-worker" and spec["automountServiceAccountToken"] is True


def test_served_version_and_allocation_parsing():
    assert m.served_version(["resource.k8s.io/v1", "resource.k8s.io/v1beta2"]) == "v1"
    assert m.served_version(["apps/v1", "resource.k8s.io/v1beta1"]) == "v1beta1"
    with pytest.raises(m.ManifestError, match="no usable"):
        m.served_version(["apps/v1"])
    claim = {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-node-0", "device": "gpu-2-mig-1g10gb-19-3"}]}}}}
    assert m.allocated_devices(claim) == ["gpu.nvidia.com/gpu-node-0/gpu-2-mig-1g10gb-19-3"]
    assert m.allocated_devices({"status": {}}) == []


def test_generated_claim_name_is_the_gpu_requests_claim():
    from kubernetes.client import V1Pod, V1PodResourceClaimStatus, V1PodStatus

    def pod(*statuses):
        return V1Pod(status=V1PodStatus(resource_claim_statuses=[V1PodResourceClaimStatus(name=n, resource_claim_name=c)
                                                                 for n, c in statuses] or None))

    assert m.generated_claim_name(pod(("other", "x-other-1"), (m.REQUEST_NAME, "p-gpu-7xk2q"))) == "p-gpu-7xk2q"
    assert m.generated_claim_name(pod((m.REQUEST_NAME, None))) is None  # not generated yet
    assert m.generated_claim_name(pod()) is None


@pytest.mark.parametrize("path", sorted(glob.glob(str(REPO / "resources/k8s/manifests/*.yaml"))))
def test_cluster_manifests_validate(path):
    for doc in yaml.safe_load_all(Path(path).read_text()):
        if doc:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_pod_env_json_roundtrip_contains_no_model_objects():
    pod, template, _ = m.step_objects(_launch(GpuRequest(mig_ok=True)), m.PodSettings())
    json.dumps(m.to_dict(pod))
    ann = json.loads(template.metadata.annotations[m.ANNOTATION_DEVICE_REQUEST])
    assert ann["migProfile"] == "1g.10gb"


def test_handle_from_pod_recovers_what_the_launcher_knew():
    pod, template, choice = m.step_objects(_launch(GpuRequest(mig_ok=True), pk="doc 1/ä.txt"), m.PodSettings())
    pod.metadata.uid = "u-1"
    h = m.handle_from_pod(pod)
    assert h.pod == pod.metadata.name and h.template == template.metadata.name and h.pod_uid == "u-1"
    assert h.device_type == "mig-1g.10gb" and h.device_fraction == pytest.approx(1 / 7)
    assert h.partition_key == "doc 1/ä.txt"
    cpu_pod, _, _ = m.step_objects(_launch(GpuRequest(count=0)), m.PodSettings())
    assert (m.handle_from_pod(cpu_pod).device_type, m.handle_from_pod(cpu_pod).template) == ("cpu", "")


def test_container_context_is_merged_as_dagster_k8s_does():
    """User fields pass through (node selector, tolerations, a sidecar, security context); lists are
    concatenated; the step's own fields win; a user env var shadowing the step's or a Secret's is dropped."""
    settings = m.PodSettings(secret_env=(m.SecretEnv("DAGSTER_PG_PASSWORD", "pg", "password"),), container_context={
        "env_vars": ["FOO=bar", "DAGSTER_PG_PASSWORD=leaked", "DAGSTER_GPU_STEP_CONTEXT=other"],
        "volumes": [{"name": "data", "emptyDir": {}}], "volume_mounts": [{"name": "data", "mountPath": "/data"}],
        "resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "4Gi"}},
        "run_k8s_config": {
            "container_config": {"security_context": {"run_as_non_root": True}, "working_dir": "/work", "args": ["x"]},
            "pod_spec_config": {"node_selector": {"gpu": "a100"}, "tolerations": [{"key": "gpu", "operator": "Exists"}],
                                "restart_policy": "Always", "priority_class_name": "batch",
                                "containers": [{"name": "sidecar", "image": "busybox"}]},
            "pod_template_spec_metadata": {"labels": {"team": "search"}, "annotations": {"owner": "search"}}},
    })
    pod, template, _ = m.step_objects(_launch(GpuRequest(count=1)), settings)
    d = validate(pod)
    spec, (step, sidecar) = d["spec"], d["spec"]["containers"]
    assert spec["nodeSelector"] == {"gpu": "a100"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                                   {"key": "gpu", "operator": "Exists"}]  # the GPU taint's, then the user's
    assert spec["priorityClassName"] == "batch" and spec["restartPolicy"] == "Never"
    assert sidecar == {"name": "sidecar", "image": "busybox"}
    assert step["name"] == "step" and step["command"][:3] == ["/opt/venv/bin/python", "-m", "dagster"] and "args" not in step
    assert step["securityContext"] == {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                                       "capabilities": {"drop": ["ALL"]}}  # the user's key on the defaults
    assert step["workingDir"] == "/work"
    assert step["resources"] == {"requests": {"cpu": "100m", "memory": "2Gi"}, "limits": {"memory": "4Gi"},
                                 "claims": [{"name": "gpu"}]}
    env = {e["name"]: e for e in step["env"]}
    assert env["FOO"]["value"] == "bar" and env["DAGSTER_GPU_STEP_CONTEXT"]["value"] == "{}"
    assert env["DAGSTER_PG_PASSWORD"] == {"name": "DAGSTER_PG_PASSWORD",
                                          "valueFrom": {"secretKeyRef": {"name": "pg", "key": "password"}}}
    assert "leaked" not in json.dumps(d)
    assert d["metadata"]["labels"]["team"] == "search" and d["metadata"]["annotations"]["owner"] == "search"


def test_step_container_falls_back_to_its_log_for_the_termination_message_unless_the_user_says_otherwise():
    """FallbackToLogsOnError: the kubelet puts a failed worker's last log lines in ``terminated.message``,
    which the backend reads into the step failure; a user's own policy in container_context is kept."""
    pod, _, _ = m.step_objects(_launch(GpuRequest(count=1)), m.PodSettings())
    assert validate(pod)["spec"]["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"
    pod, _, _ = m.step_objects(_launch(GpuRequest(count=1)), m.PodSettings(container_context={
        "run_k8s_config": {"container_config": {"termination_message_policy": "File"}}}))
    assert validate(pod)["spec"]["containers"][0]["terminationMessagePolicy"] == "File"


def test_a_bad_container_context_names_the_setting():
    with pytest.raises(m.ManifestError, match="container_context"):
        m.step_objects(_launch(GpuRequest(count=1)), m.PodSettings(container_context={"no_such_field": 1}))
    with pytest.raises(m.ManifestError, match="container_context: .*node_selectr"):
        m.step_objects(_launch(GpuRequest(count=1)), m.PodSettings(container_context={
            "run_k8s_config": {"pod_spec_config": {"node_selectr": {"a": "b"}}}}))


def test_partition_labels_stay_valid_and_distinct():
    base = "k" * 40
    keys = [
        (base + "-alpha",), (base + "-beta",),                    # differ only after character 40
        (base + "x" * 30 + "1",), (base + "x" * 30 + "2",),       # over 63 characters, differ at the end
        ("a-b", "c"), ("a", "b-c"), ("a", "b", "c"),              # join to the same string
        (base + "1", "z"), (base + "2", "z"),                     # ranges whose first keys differ after 20
        ("doc 1/ä.txt", "doc 2/ä.txt"),
    ]
    labels = [names.partition_label(k) for k in keys]
    for v in labels:
        assert len(v) <= 63 and names._LABEL_OK.match(v), v
    assert len(set(labels)) == len(labels), labels
    assert names.partition_label(("doc-001.txt",)) == "doc-001.txt"  # a single valid key stays readable
    with pytest.raises(ValueError):
        names.partition_label(())


def test_step_pod_is_pod_security_restricted_compliant_by_default():
    """The fields k8s.io/pod-security-admission's restricted checks read (check_runAsNonRoot.go,
    check_allowPrivilegeEscalation.go, check_capabilities_restricted.go, check_seccompProfile_restricted.go,
    check_runAsUser.go); the test namespace enforces the profile, so an e2e pod proves admission too."""
    d = validate(m.step_objects(_launch(GpuRequest(count=1)), m.PodSettings())[0])
    assert d["spec"]["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                            "seccompProfile": {"type": "RuntimeDefault"}}
    assert d["spec"]["containers"][0]["securityContext"] == {"allowPrivilegeEscalation": False,
                                                             "capabilities": {"drop": ["ALL"]}}
    own = validate(m.step_objects(_launch(GpuRequest(count=1)), m.PodSettings(run_as_user=None, container_context={
        "run_k8s_config": {"pod_spec_config": {"security_context": {"fs_group": 2000, "run_as_user": 4242}}}}))[0])
    assert own["spec"]["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"},
                                              "fsGroup": 2000, "runAsUser": 4242}
    off = validate(m.step_objects(_launch(GpuRequest(count=1)), m.PodSettings(restricted_security_context=False))[0])
    assert "securityContext" not in off["spec"] and "securityContext" not in off["spec"]["containers"][0]
    with pytest.raises(m.ManifestError, match="run_as_user"):
        m.PodSettings(run_as_user=0)


def test_gpu_steps_tolerate_the_gpu_taint_cpu_steps_do_not_and_tolerations_are_configurable():
    gpu = validate(m.step_objects(_launch(GpuRequest(count=1)), m.PodSettings())[0])
    assert gpu["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    cpu = validate(m.step_objects(_launch(GpuRequest(count=0)), m.PodSettings())[0])
    assert "tolerations" not in cpu["spec"]
    mine = ({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute", "tolerationSeconds": 60},)
    own = validate(m.step_objects(_launch(GpuRequest(count=1)), m.PodSettings(tolerations=mine))[0])
    assert own["spec"]["tolerations"] == list(mine)  # camelCase as in YAML, replacing the default
