"""resources/k8s/kueue_manifests.py rewrites Kueue's webhook configurations to call the manager on 127.0.0.1.

The input is an excerpt of sigs.k8s.io/kueue v0.17.0 ``config/components/webhook/manifests.yaml`` (the pod,
ResourceFlavor and batch/Job webhooks, verbatim) and a stand-in CRD file; no cluster is needed.
"""

from __future__ import annotations

import base64
import importlib.util
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("kueue_manifests", REPO / "resources/k8s/kueue_manifests.py")
km = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(km)

WEBHOOKS = """\
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- admissionReviewVersions:
  - v1
  clientConfig:
    service:
      name: webhook-service
      namespace: system
      path: /mutate-batch-v1-job
  failurePolicy: Fail
  name: mjob.kb.io
  rules:
  - apiGroups:
    - batch
    apiVersions:
    - v1
    operations:
    - CREATE
    resources:
    - jobs
  sideEffects: None
- admissionReviewVersions:
  - v1
  clientConfig:
    service:
      name: webhook-service
      namespace: system
      path: /mutate--v1-pod
  failurePolicy: Fail
  name: mpod.kb.io
  rules:
  - apiGroups:
    - ""
    apiVersions:
    - v1
    operations:
    - CREATE
    resources:
    - pods
  sideEffects: None
- admissionReviewVersions:
  - v1
  clientConfig:
    service:
      name: webhook-service
      namespace: system
      path: /mutate-kueue-x-k8s-io-v1beta2-resourceflavor
  failurePolicy: Fail
  name: mresourceflavor.kb.io
  rules:
  - apiGroups:
    - kueue.x-k8s.io
    apiVersions:
    - v1beta2
    operations:
    - CREATE
    resources:
    - resourceflavors
  sideEffects: None
"""


@pytest.fixture()
def src(tmp_path):
    (tmp_path / "config/components/webhook").mkdir(parents=True)
    (tmp_path / "config/components/crd/bases").mkdir(parents=True)
    (tmp_path / "config/components/webhook/manifests.yaml").write_text(WEBHOOKS)
    (tmp_path / "config/components/crd/bases/kueue.x-k8s.io_workloads.yaml").write_text(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: workloads.kueue.x-k8s.io}\n")
    (tmp_path / "ca.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\nTEST\n-----END CERTIFICATE-----\n")
    return tmp_path


def test_webhooks_call_the_local_manager_with_the_cluster_ca_and_only_queued_pods(src):
    docs = km.render(str(src), "https://127.0.0.1:19443", str(src / "ca.crt"))
    crd, hooks = docs[0], docs[1]
    assert crd["metadata"]["name"] == "workloads.kueue.x-k8s.io" and len(docs) == 2
    assert hooks["metadata"]["name"] == "kueue-mutating-webhook-configuration"
    # batch/Job is not an enabled integration: its webhook is left out
    assert [w["name"] for w in hooks["webhooks"]] == ["mpod.kb.io", "mresourceflavor.kb.io"]
    pod, flavor = hooks["webhooks"]
    ca = base64.b64encode((src / "ca.crt").read_bytes()).decode()
    assert pod["clientConfig"] == {"url": "https://127.0.0.1:19443/mutate--v1-pod", "caBundle": ca}
    assert flavor["clientConfig"]["url"] == "https://127.0.0.1:19443/mutate-kueue-x-k8s-io-v1beta2-resourceflavor"
    assert pod["objectSelector"] == {"matchExpressions": [{"key": "kueue.x-k8s.io/queue-name", "operator": "Exists"}]}
    assert pod["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "kueue-system"]
    assert "objectSelector" not in flavor and pod["failurePolicy"] == "Fail"
    yaml.safe_dump_all(docs)  # what cluster.sh writes


def test_a_source_without_crds_is_refused_naming_it(tmp_path):
    with pytest.raises(SystemExit, match=f"no CRDs under {tmp_path}/config/components/crd/bases"):
        km.crds(str(tmp_path))
