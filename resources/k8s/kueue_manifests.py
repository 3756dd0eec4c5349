"""Kueue's CRDs and webhook configurations for a Kueue manager that runs as a process on 127.0.0.1 (test
infrastructure for resources/k8s/cluster.sh, not part of the library).

Usage:
    kueue_manifests.py render SRC URL CA_FILE OUT      write the manifests to OUT (one YAML stream)
    kueue_manifests.py --kubeconfig K wait-crds SRC    wait until every CRD of SRC is Established
    kueue_manifests.py --kubeconfig K wait-webhook     wait until a dry-run ResourceFlavor create passes
                                                       Kueue's webhooks (mresourceflavor, vresourceflavor)

SRC is the sigs.k8s.io/kueue module's source (build.sh links it as ``$KUEUE_ROOT/src``). What is rendered:

* every CRD of ``config/components/crd/bases`` as it is. Kueue's kustomization adds conversion webhooks for the
  v1beta1 <-> v1beta2 versions (``config/components/crd/patches/webhook_in_*.yaml``); they are left out: the
  manager and dagster-gpu use only v1beta2, the storage version, so nothing is converted;
* the webhooks of ``config/components/webhook/manifests.yaml`` that concern the pod integration and Kueue's own
  objects (API groups ``""`` and ``kueue.x-k8s.io``): the other integrations' are not enabled (config.yaml) and
  their CRDs are not installed. Each calls ``URL + path`` (the process's webhook server) with the cluster CA as
  ``caBundle``, instead of the in-cluster Service the kustomization names; the pod webhooks keep Kueue's
  namespaceSelector (``config/components/webhook/kustomization.yaml``: not kube-system, not kueue-system) and
  get an objectSelector on the ``kueue.x-k8s.io/queue-name`` label, so a pod that names no queue (Kueue ignores
  it: ``manageJobsWithoutQueueName: false``) is created even while the manager is stopped;
* the configurations' names get the ``kueue-`` prefix the release manifests give them
  (``config/default/kustomization.yaml`` ``namePrefix: kueue-``).
"""

from __future__ import annotations

import argparse
import base64
import glob
import os
import sys
import time
from typing import Any, Iterable

import yaml

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KEPT_GROUPS = {"", "kueue.x-k8s.io"}
SYSTEM_NAMESPACES = ["kube-system", "kueue-system"]


def crds(src: str) -> list[dict]:
    """The CRDs of ``config/components/crd/bases``, sorted by file name."""
    out = []
    for f in sorted(glob.glob(os.path.join(src, "config/components/crd/bases/*.yaml"))):
        with open(f) as fh:
            out += [d for d in yaml.safe_load_all(fh) if d]
    if not out:
        raise SystemExit(f"no CRDs under {src}/config/components/crd/bases (is SRC the kueue module?)")
    return out


def _kept(webhook: dict) -> bool:
    return all(g in KEPT_GROUPS for r in webhook.get("rules") or [] for g in r.get("apiGroups") or [])


def webhooks(docs: Iterable[dict], url: str, ca_pem: bytes) -> list[dict]:
    """The webhook configurations of ``docs`` (``config/components/webhook/manifests.yaml``) rewritten to call
    ``url`` (``https://127.0.0.1:<port>``): see the module docstring."""
    ca = base64.b64encode(ca_pem).decode()
    out = []
    for d in docs:
        if d.get("kind") not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            continue
        kept = []
        for w in d.get("webhooks") or []:
            if not _kept(w):
                continue
            path = w["clientConfig"]["service"]["path"]
            w = {**w, "clientConfig": {"url": url.rstrip("/") + path, "caBundle": ca}}
            if any("pods" in (r.get("resources") or []) for r in w.get("rules") or []):
                w["namespaceSelector"] = {"matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": SYSTEM_NAMESPACES}]}
                w["objectSelector"] = {"matchExpressions": [{"key": QUEUE_LABEL, "operator": "Exists"}]}
            kept.append(w)
        meta = {**d["metadata"], "name": "kueue-" + d["metadata"]["name"]}
        out.append({**d, "metadata": meta, "webhooks": kept})
    return out


def render(src: str, url: str, ca_file: str) -> list[dict]:
    with open(os.path.join(src, "config/components/webhook/manifests.yaml")) as fh:
        hooks = [d for d in yaml.safe_load_all(fh) if d]
    with open(ca_file, "rb") as fh:
        ca = fh.read()
    return crds(src) + webhooks(hooks, url, ca)


def wait_crds(kubeconfig: str, src: str, timeout: float) -> None:
    from kubernetes import client, config

    ext = client.ApiextensionsV1Api(config.new_client_from_config(config_file=kubeconfig))
    names = [c["metadata"]["name"] for c in crds(src)]
    deadline = time.monotonic() + timeout
    waiting = names
    while time.monotonic() < deadline:
        waiting = []
        for n in names:
            try:
                conds = ext.read_custom_resource_definition(n).status.conditions or []
            except Exception:  # noqa: BLE001 - not created yet
                conds = []
            if not any(c.type == "Established" and c.status == "True" for c in conds):
                waiting.append(n)
        if not waiting:
            return
        time.sleep(0.3)
    raise SystemExit(f"Kueue CRDs not Established within {timeout:.0f}s: {waiting}")


def wait_webhook(kubeconfig: str, timeout: float) -> None:
    """Create a ResourceFlavor with ``dryRun=All`` until it succeeds: the apiserver then called both of
    Kueue's ResourceFlavor webhooks (failurePolicy Fail), so it reaches the manager's webhook server."""
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    api = client.CustomObjectsApi(config.new_client_from_config(config_file=kubeconfig))
    body = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "webhook-probe"}}
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            api.create_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "resourceflavors", body, dry_run="All")
            return
        except ApiException as e:
            if e.status == 409:  # exists: the webhooks ran before the conflict was found
                return
            last = f"{e.status} {e.reason}: {str(e.body)[:300]}"
        time.sleep(0.5)
    raise SystemExit(f"Kueue's webhooks not reachable from the apiserver within {timeout:.0f}s: {last}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kubeconfig")
    p.add_argument("--timeout", type=float, default=60)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render")
    r.add_argument("src")
    r.add_argument("url")
    r.add_argument("ca_file")
    r.add_argument("out")
    w = sub.add_parser("wait-crds")
    w.add_argument("src")
    sub.add_parser("wait-webhook")
    a = p.parse_args(argv)
    if a.cmd == "render":
        with open(a.out, "w") as fh:
            yaml.safe_dump_all(render(a.src, a.url, a.ca_file), fh, sort_keys=False)
        print(f"rendered Kueue manifests to {a.out}", file=sys.stderr)
    elif a.cmd == "wait-crds":
        wait_crds(a.kubeconfig, a.src, a.timeout)
    else:
        wait_webhook(a.kubeconfig, a.timeout)


if __name__ == "__main__":
    main()
