"""Small admin helper for resources/k8s/cluster.sh (test infrastructure, not part of the library).

Usage (all take ``--kubeconfig``):
    kubetool.py wait-ready                 wait until /readyz is ok and resource.k8s.io/v1 is served
    kubetool.py apply FILE...              server-side apply every document of the YAML files
    kubetool.py sa-kubeconfig NS SECRET OUT
                                           wait for the service-account token controller to fill the
                                           token Secret, then write a kubeconfig that uses that token
    kubetool.py wait-node NAME             wait until the node agent reports the node Ready

Exit status 0 on success, 1 with a message on stderr otherwise.
"""

from __future__ import annotations

import argparse
import base64
import sys
import time

import yaml
from kubernetes import client, config, dynamic
from kubernetes.client.rest import ApiException


def _api(kubeconfig: str) -> client.ApiClient:
    return config.new_client_from_config(config_file=kubeconfig)


def wait_ready(api: client.ApiClient, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            r = api.call_api("/readyz", "GET", auth_settings=["BearerToken"], _preload_content=False, _request_timeout=3)
            body = (r[0] if isinstance(r, tuple) else r).data
            groups = client.ApisApi(api).get_api_versions()
            versions = {v.group_version for g in groups.groups for v in g.versions}
            if body.strip() == b"ok" and "resource.k8s.io/v1" in versions:
                return
            last = f"readyz={body[:80]!r} resource.k8s.io/v1 served={'resource.k8s.io/v1' in versions}"
        except Exception as e:  # noqa: BLE001 - keep polling until the deadline
            last = str(e)[:200]
        time.sleep(0.5)
    raise SystemExit(f"apiserver not ready after {timeout:.0f}s: {last}")


def apply(api: client.ApiClient, files: list[str]) -> None:
    dyn = dynamic.DynamicClient(api)
    for f in files:
        with open(f) as fh:
            docs = [d for d in yaml.safe_load_all(fh) if d]
        for d in docs:
            res = dyn.resources.get(api_version=d["apiVersion"], kind=d["kind"])
            md = d["metadata"]
            for attempt in range(30):
                try:
                    res_ns = md.get("namespace") if res.namespaced else None
                    dyn.server_side_apply(
                        res, body=d, name=md["name"], namespace=res_ns,
                        field_manager="dagster-gpu-cluster", force_conflicts=True,
                    )
                    break
                except ApiException as e:
                    # namespace or default SA not there yet right after start: retry briefly
                    if attempt == 29 or e.status not in (403, 404, 409, 500, 503):
                        raise SystemExit(f"apply {f}: {d['kind']}/{md['name']}: {e.status} {e.reason}: {e.body}")
                    time.sleep(0.5)
            print(f"applied {d['kind']}/{md['name']}", file=sys.stderr)


def sa_kubeconfig(api: client.ApiClient, kubeconfig: str, ns: str, secret: str, out: str, timeout: float) -> None:
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    token = None
    while time.monotonic() < deadline:
        s = core.read_namespaced_secret(secret, ns)
        if s.data and s.data.get("token"):
            token = base64.b64decode(s.data["token"]).decode()
            break
        time.sleep(0.3)
    if not token:
        raise SystemExit(f"secret {ns}/{secret} got no token within {timeout:.0f}s (is the token controller running?)")
    with open(kubeconfig) as fh:
        admin = yaml.safe_load(fh)
    cluster = admin["clusters"][0]
    sa_name = s.metadata.annotations["kubernetes.io/service-account.name"]
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": sa_name, "user": {"token": token}}],
        "contexts": [{"name": sa_name, "context": {"cluster": cluster["name"], "user": sa_name, "namespace": ns}}],
        "current-context": sa_name,
    }
    import os

    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump(cfg, fh)


def wait_node(api: client.ApiClient, name: str, timeout: float) -> None:
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            n = core.read_node(name)
            ready = [c for c in (n.status.conditions or []) if c.type == "Ready" and c.status == "True"]
            if ready and (n.status.allocatable or {}).get("pods"):
                return
        except ApiException:
            pass
        time.sleep(0.3)
    raise SystemExit(f"node {name} not Ready within {timeout:.0f}s (see the node agent's log)")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--timeout", type=float, default=60)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("wait-ready")
    a = sub.add_parser("apply")
    a.add_argument("files", nargs="+")
    s = sub.add_parser("sa-kubeconfig")
    s.add_argument("namespace")
    s.add_argument("secret")
    s.add_argument("out")
    w = sub.add_parser("wait-node")
    w.add_argument("name")
    args = p.parse_args(argv)
    api = _api(args.kubeconfig)
    if args.cmd == "wait-ready":
        wait_ready(api, args.timeout)
    elif args.cmd == "apply":
        apply(api, args.files)
    elif args.cmd == "sa-kubeconfig":
        sa_kubeconfig(api, args.kubeconfig, args.namespace, args.secret, args.out, args.timeout)
    elif args.cmd == "wait-node":
        wait_node(api, args.name, args.timeout)


if __name__ == "__main__":
    main()
