"""The node agent (resources/k8s/node_agent.py) behaves as a kubelet + NVIDIA's DRA driver v25.12 where
dagster-gpu depends on it: its rules on their own, and what it published on the running control plane."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import yaml

from tests.k8s_helpers import NAMESPACE, REPO, admin_api, require_cluster

_spec = importlib.util.spec_from_file_location("node_agent", REPO / "resources" / "k8s" / "node_agent.py")
agent = sys.modules.setdefault("node_agent", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(agent)

TS = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
      "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}}
MPS = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}


def test_sharing_configs_need_the_drivers_feature_gates_off_by_default():
    """NVIDIA/k8s-dra-driver-gpu v25.12.0 pkg/featuregates/featuregates.go (both alpha, default false) and
    api/nvidia.com/resource/v1beta1/sharing.go (GpuSharing.Validate / MigDeviceSharing.Validate)."""
    off = agent.parse_feature_gates("")
    assert off == {"TimeSlicingSettings": False, "MPSSupport": False}
    assert agent.sharing_error(TS, off) == "invalid GPU sharing settings: &{TimeSlicing 0xc000a1c0f0 <nil>}"
    assert agent.sharing_error(MPS, off) == "invalid MIG device sharing settings: &{MPS <nil> <nil>}"
    on = agent.parse_feature_gates("TimeSlicingSettings=true, MPSSupport=true")
    assert agent.sharing_error(TS, on) is None and agent.sharing_error(MPS, on) is None
    assert agent.sharing_error(TS, agent.parse_feature_gates("MPSSupport=true")) is not None
    assert agent.sharing_error({**TS, "sharing": {}}, off) is None  # no sharing: nothing to validate
    assert agent.sharing_error({"apiVersion": "example.com/v1", "kind": "GpuConfig", "sharing": TS["sharing"]}, off) is None
    with pytest.raises(ValueError, match="unknown gate"):
        agent.parse_feature_gates("TimeSlicing=true")


def test_the_node_publishes_its_resourceslice_as_the_drivers_kubelet_plugin_does():
    """k8s.io/dynamic-resource-allocation/resourceslice (the plugin's controller): generated name
    <node>-gpu.nvidia.com-<random>, the Node as owner, pool = node name with a generation; v25.12 attributes."""
    require_cluster()
    from kubernetes import client

    api = admin_api()
    node = client.CoreV1Api(api).read_node("gpu-node-0")
    slices = [s for s in client.ResourceV1Api(api).list_resource_slice(field_selector="spec.nodeName=gpu-node-0").items
              if s.spec.driver == "gpu.nvidia.com"]
    assert len(slices) == 1, [s.metadata.name for s in slices]
    s = slices[0]
    assert s.metadata.name.startswith("gpu-node-0-gpu.nvidia.com-") and len(s.metadata.name) > len("gpu-node-0-gpu.nvidia.com-")
    assert [(o.kind, o.name, o.uid) for o in s.metadata.owner_references] == [("Node", "gpu-node-0", node.metadata.uid)]
    assert s.spec.pool.name == "gpu-node-0" and s.spec.pool.generation >= 1 and s.spec.pool.resource_slice_count == 1
    want = yaml.safe_load((REPO / "resources" / "k8s" / "gpu-node-0-devices.yaml").read_text())["spec"]["devices"]
    assert [d.name for d in s.spec.devices] == [d["name"] for d in want]
    gpu0 = s.spec.devices[0]
    assert gpu0.attributes["resource.kubernetes.io/pciBusID"].string == "0000:07:00.0" and "pcieBusID" not in gpu0.attributes
    assert gpu0.capacity["memory"].value == "80Gi"
    assert {d.capacity["memory"].value for d in s.spec.devices if d.attributes["type"].string == "mig"} == {"9728Mi"}


def test_the_test_namespace_enforces_pod_security_restricted():
    require_cluster()
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(admin_api())
    assert core.read_namespace(NAMESPACE).metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "not-restricted"},
           "spec": {"containers": [{"name": "c", "image": "x", "command": ["true"]}]}}
    with pytest.raises(ApiException) as e:
        core.create_namespaced_pod(NAMESPACE, pod, dry_run="All")
    msg = json.loads(e.value.body)["message"]
    assert e.value.status == 403 and 'violates PodSecurity "restricted:latest"' in msg, msg
    assert "allowPrivilegeEscalation != false" in msg and "runAsNonRoot != true" in msg, msg
