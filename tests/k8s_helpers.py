"""Shared helpers for the tests that need the local Kubernetes control plane (resources/k8s/cluster.sh).

The cluster is found through ``DAGSTER_GPU_K8S_DIR`` (default ``/tmp/dagster-gpu-k8s``); tests skip with
the reason when its apiserver is not answering. ``executor_api()`` authenticates as the executor's
ServiceAccount (least privilege), ``admin_api()`` as cluster admin (only for set-up and inspection).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

K8S_DIR = Path(os.environ.get("DAGSTER_GPU_K8S_DIR", "/tmp/dagster-gpu-k8s"))
NAMESPACE = "dagster-gpu"
REPO = Path(__file__).resolve().parents[1]


def cluster_skip_reason() -> str | None:
    """None when the cluster answers /readyz, else why not (used as the skip reason)."""
    admin = K8S_DIR / "admin.kubeconfig"
    ex = K8S_DIR / "executor.kubeconfig"
    if not admin.exists() or not ex.exists():
        return f"k8s control plane not started (no kubeconfigs in {K8S_DIR}; run resources/k8s/cluster.sh start)"
    try:
        from kubernetes import config

        api = config.new_client_from_config(config_file=str(admin))
        r = api.call_api("/readyz", "GET", auth_settings=["BearerToken"], _preload_content=False, _request_timeout=3)
        body = (r[0] if isinstance(r, tuple) else r).data
        if body.strip() != b"ok":
            return f"k8s apiserver not ready: {body[:100]!r}"
    except Exception as e:  # noqa: BLE001
        return f"k8s apiserver in {K8S_DIR} not reachable ({type(e).__name__}: {str(e)[:120]}); run resources/k8s/cluster.sh start"
    return None


def require_cluster() -> None:
    reason = cluster_skip_reason()
    if reason:
        pytest.skip(reason)


def admin_api():
    from kubernetes import config

    return config.new_client_from_config(config_file=str(K8S_DIR / "admin.kubeconfig"))


def executor_api():
    from kubernetes import config

    return config.new_client_from_config(config_file=str(K8S_DIR / "executor.kubeconfig"))


def wait_for(pred, timeout: float, interval: float = 0.25, what: str = "condition"):
    """Poll ``pred()`` until it returns a truthy value (returned) or ``timeout`` seconds pass (AssertionError)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def labelled(api, selector: str) -> dict[str, list[str]]:
    """Names of pods, ResourceClaims and ResourceClaimTemplates in the namespace matching ``selector``."""
    from kubernetes import client

    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    return {
        "pods": [p.metadata.name for p in core.list_namespaced_pod(NAMESPACE, label_selector=selector).items],
        "claims": [c.metadata.name for c in res.list_namespaced_resource_claim(NAMESPACE, label_selector=selector).items],
        "templates": [t.metadata.name for t in
                      res.list_namespaced_resource_claim_template(NAMESPACE, label_selector=selector).items],
    }


@contextlib.contextmanager
def k8s_dagster_instance(pg: dict, tmp_path: Path, monkeypatch, max_runs: int = 10):
    """A fresh PostgreSQL database and DAGSTER_HOME (``max_runs`` concurrent runs), the PostgreSQL Secret in
    the namespace, and the executor's kubeconfig in the environment; yields the DagsterInstance and drops
    the database afterwards. Skips when the control plane is not running."""
    require_cluster()
    import dagster as dg
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from tests.conftest import fresh_pg_home

    admin = client.CoreV1Api(admin_api())
    secret = client.V1Secret(metadata=client.V1ObjectMeta(name="dagster-postgresql-secret"),
                             string_data={"postgresql-password": pg["DAGSTER_PG_PASSWORD"]})
    try:
        admin.create_namespaced_secret(NAMESPACE, secret)
    except ApiException as e:
        if e.status != 409:
            raise
        admin.replace_namespaced_secret("dagster-postgresql-secret", NAMESPACE, secret)
    with fresh_pg_home(pg, tmp_path, monkeypatch, max_runs=max_runs):
        monkeypatch.setenv("DAGSTER_GPU_K8S_KUBECONFIG", str(K8S_DIR / "executor.kubeconfig"))
        monkeypatch.setenv("DAGSTER_GPU_K8S_LOG", str(tmp_path / "k8s-backend.log"))
        monkeypatch.chdir(tmp_path)
        with dg.DagsterInstance.get() as instance:
            yield instance
