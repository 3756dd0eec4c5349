"""I/O with the Kubernetes API for the kubernetes backend (pods, ResourceClaimTemplates, ResourceClaims, events).

Every call has a request timeout and is retried with backoff on transient errors (:func:`api_retry`);
errors surface as :class:`kubernetes.client.rest.ApiException` (HTTP
status in ``.status``) or urllib3 connection errors, except where a method documents otherwise
(``read_*`` return None on 404, ``delete_*`` ignore 404). The ``resource.k8s.io`` version used is
discovered once (v1 on Kubernetes 1.34; v1beta2/v1beta1 where only those are served).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from dagster_gpu.k8s.manifests import (
    allocated_devices,
    allocated_requests,
    claim_template_for_version,
    served_version,
    to_dict,
)

TIMEOUT = (5, 30)  # connect, read (seconds)

#: HTTP statuses the API server (or a proxy in front of it) returns for a request it did not carry out.
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})


def transient(e: BaseException, mutation: bool) -> bool:
    """Whether a failed call may be retried: a :data:`TRANSIENT_STATUSES` answer, or no connection at all;
    for a read (``mutation`` False) also a dropped connection or a read timeout. A create/patch/delete whose
    request may have reached the server is not retried (it may have been applied: a retry would then see
    409/404 and mislead the caller)."""
    if isinstance(e, ApiException):
        return e.status in TRANSIENT_STATUSES
    if isinstance(e, urllib3.exceptions.MaxRetryError) and e.reason is not None:
        return transient(e.reason, mutation)
    if isinstance(e, (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError)):
        return True
    return not mutation and isinstance(e, (urllib3.exceptions.ProtocolError, urllib3.exceptions.ReadTimeoutError))


def api_retry(fn: Callable[..., Any], *args: Any, mutation: bool, attempts: int = 4, **kwargs: Any) -> Any:
    """Call ``fn(*args, _request_timeout=TIMEOUT, **kwargs)``; on a :func:`transient` error retry with
    exponential backoff (0.2 s doubling, at most 2 s between tries) up to ``attempts`` tries, then raise
    the last error as is (an ApiException keeps its ``status``)."""
    retrying = Retrying(stop=stop_after_attempt(max(1, attempts)), wait=wait_exponential(multiplier=0.2, max=2.0),
                        retry=retry_if_exception(lambda e: transient(e, mutation)), reraise=True)
    return retrying(fn, *args, _request_timeout=TIMEOUT, **kwargs)

#: Kueue's on-demand visibility API (sigs.k8s.io/kueue v0.17.0 ``pkg/visibility/server.go`` installs v1beta1 and
#: v1beta2; v1beta1 is the one every release since 0.9 serves)
VISIBILITY_GROUP, VISIBILITY_VERSION = "visibility.kueue.x-k8s.io", "v1beta1"

_RESOURCE_APIS = {
    "v1": client.ResourceV1Api,
    "v1beta2": client.ResourceV1beta2Api,
    "v1beta1": client.ResourceV1beta1Api,
}


def load_api_client(kubeconfig: str | None = None, context: str | None = None, in_cluster: bool = False) -> client.ApiClient:
    """An ApiClient from a kubeconfig file (``kubeconfig`` or $KUBECONFIG/~/.kube/config) or the in-cluster
    service-account token. Raises ``kubernetes.config.ConfigException`` when neither is usable."""
    if in_cluster:
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        return client.ApiClient(cfg)
    return config.new_client_from_config(config_file=kubeconfig, context=context)


class KubeClient:
    """Thin wrapper over the kubernetes client for one namespace.

    Args:
        api: an authenticated ApiClient (see :func:`load_api_client`).
        namespace: where pods, templates and claims live.
        resource_api_version: force a ``resource.k8s.io`` version (``v1``/``v1beta2``/``v1beta1``); default:
            discover from the API server on first use.
        attempts: tries of each call on transient errors (:func:`api_retry`).
    """

    def __init__(self, api: client.ApiClient, namespace: str, resource_api_version: str | None = None, attempts: int = 4):
        self.attempts = attempts
        self.api = api
        self.namespace = namespace
        self.core = client.CoreV1Api(api)
        self._version = resource_api_version
        self._lock = threading.Lock()

    # -- discovery --------------------------------------------------------------------------------
    @property
    def resource_api_version(self) -> str:
        """The ``resource.k8s.io`` version in use (discovered once). Raises ManifestError if DRA is not served."""
        with self._lock:
            if self._version is None:
                groups = self._read(client.ApisApi(self.api).get_api_versions)
                self._version = served_version([v.group_version for g in groups.groups for v in g.versions])
            return self._version

    def _res(self):
        return _RESOURCE_APIS[self.resource_api_version](self.api)

    # -- calls with retry ----------------------------------------------------------------------------
    def _read(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` with the request timeout, retried on transient errors (:func:`transient`)."""
        return api_retry(fn, *args, mutation=False, attempts=self.attempts, **kwargs)

    def _write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Like :meth:`_read` for a create/patch/delete: retried only when the server cannot have applied it."""
        return api_retry(fn, *args, mutation=True, attempts=self.attempts, **kwargs)

    # -- device inventory (cluster-scoped reads: see resources/k8s/manifests/42-executor-inventory.yaml)
    def inventory(self, label_selector: str) -> tuple[list[dict], list[dict], list[dict]]:
        """(ResourceSlices, ResourceClaims of all namespaces, our Pending pods) as plain API dicts."""
        res = self._res()
        ser = self.api.sanitize_for_serialization
        slices = [ser(x) for x in self._read(res.list_resource_slice).items]
        claims = [ser(x) for x in self._read(res.list_resource_claim_for_all_namespaces).items]
        pending = [
            ser(p) for p in self._read(self.core.list_namespaced_pod, self.namespace, label_selector=label_selector,
                                       field_selector="status.phase=Pending").items
        ]
        return slices, claims, pending

    # -- Kueue (kueue.x-k8s.io/v1beta2; resources/k8s/manifests/40-executor-rbac.yaml, 42-executor-inventory.yaml)
    def pod_workloads(self, pod_uid: str) -> list[dict]:
        """The Workloads Kueue made for the pod with ``pod_uid`` (label ``kueue.x-k8s.io/job-uid``), API dicts."""
        custom = client.CustomObjectsApi(self.api)
        out = self._read(custom.list_namespaced_custom_object, "kueue.x-k8s.io", "v1beta2", self.namespace,
                         "workloads", label_selector=f"kueue.x-k8s.io/job-uid={pod_uid}")
        return list(out.get("items") or [])

    def read_local_queue(self, name: str) -> dict | None:
        """The LocalQueue ``name`` of the namespace (API dict), None when it does not exist."""
        return self._read_custom(client.CustomObjectsApi(self.api).get_namespaced_custom_object, self.namespace,
                                 "localqueues", name)

    def read_cluster_queue(self, name: str) -> dict | None:
        """The ClusterQueue ``name`` (API dict), None when it does not exist."""
        return self._read_custom(client.CustomObjectsApi(self.api).get_cluster_custom_object, "clusterqueues", name)

    def list_cluster_queues(self) -> list[dict]:
        """Every ClusterQueue (API dicts): a queue's cohort lends the others' unused quota."""
        out = self._read(client.CustomObjectsApi(self.api).list_cluster_custom_object, "kueue.x-k8s.io", "v1beta2",
                         "clusterqueues")
        return list(out.get("items") or [])

    def read_pending_workloads(self, cluster_queue: str) -> dict | None:
        """The pending workloads of ClusterQueue ``cluster_queue`` from Kueue's on-demand visibility API
        (``GET /apis/visibility.kueue.x-k8s.io/v1beta1/clusterqueues/<name>/pendingworkloads``: a
        ``PendingWorkloadsSummary``, sigs.k8s.io/kueue v0.17.0 ``apis/visibility/v1beta1/types.go``, served by the
        Kueue manager through an APIService when its ``VisibilityOnDemand`` gate is on). None when it is not
        served here (404: no such API group; 503: the APIService is registered but its server does not answer;
        403: this service account may not read it): the caller falls back to the LocalQueue's status. One try,
        no retry: the snapshot must not wait on an optional API."""
        try:
            return api_retry(self.api.call_api, f"/apis/{VISIBILITY_GROUP}/{VISIBILITY_VERSION}/clusterqueues/{{name}}"
                             "/pendingworkloads", "GET", path_params={"name": cluster_queue},
                             header_params={"Accept": "application/json"}, response_types_map={200: "object"},
                             auth_settings=["BearerToken"], _return_http_data_only=True, mutation=False, attempts=1)
        except ApiException as e:
            if e.status in (403, 404, 503):
                return None
            raise

    def _read_custom(self, fn: Callable[..., Any], *args: Any) -> dict | None:
        try:
            return self._read(fn, "kueue.x-k8s.io", "v1beta2", *args)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    # -- pods --------------------------------------------------------------------------------------
    def create_pod(self, pod: dict | client.V1Pod) -> client.V1Pod:
        """Create the pod; raises ApiException (409 if it already exists)."""
        return self._write(self.core.create_namespaced_pod, self.namespace, pod)

    def read_pod(self, name: str) -> client.V1Pod | None:
        try:
            return self._read(self.core.read_namespaced_pod, name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def list_pods(self, label_selector: str) -> list[client.V1Pod]:
        return self._read(self.core.list_namespaced_pod, self.namespace, label_selector=label_selector).items

    def delete_pod(self, name: str, uid: str | None = None) -> bool:
        """Graceful delete (the pod's own terminationGracePeriodSeconds; never a forced grace of 0).

        With ``uid`` only that incarnation is deleted. Returns False when the pod was already gone.
        """
        body = client.V1DeleteOptions(propagation_policy="Background",
                                      preconditions=client.V1Preconditions(uid=uid) if uid else None)
        try:
            self._write(self.core.delete_namespaced_pod, name, self.namespace, body=body)
            return True
        except ApiException as e:
            if e.status in (404, 409):  # gone, or replaced by another incarnation (uid precondition)
                return False
            raise

    def pod_events(self, pod_name: str) -> list[dict]:
        """The core/v1 Events about the pod (scheduler and kubelet: ``FailedScheduling``, ``Pulling``,
        ``Pulled``, ``Failed``, ``BackOff``, ``FailedMount``, ``FailedPrepareDynamicResources``...) as API JSON
        dicts, oldest first. The executor's Role grants ``list`` on ``events``."""
        evs = self._read(self.core.list_namespaced_event, self.namespace,
                         field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod_name}").items
        evs = sorted(evs, key=lambda e: (e.last_timestamp or e.event_time or e.metadata.creation_timestamp))
        return [self.api.sanitize_for_serialization(e) for e in evs]

    def scheduling_events(self, pod_name: str) -> list[dict]:
        """``FailedScheduling`` events of the pod (API JSON), oldest first."""
        return [e for e in self.pod_events(pod_name) if e.get("reason") == "FailedScheduling"]

    # -- DRA -----------------------------------------------------------------------------------------
    def create_claim_template(self, template_v1: dict) -> Any:
        """Create a ResourceClaimTemplate given in the v1 shape (converted to the served version).

        Sent as YAML (compact JSON is YAML), which the API server converts to canonical JSON: the opaque
        config's ``parameters`` are a ``runtime.RawExtension`` kept byte for byte, and the python client's JSON
        (``json.dumps`` with ", " separators) would store them with spaces that any later patch re-encodes
        without, so the owner-reference patch (:meth:`set_template_owner`) failed with 422 "spec: field is
        immutable" for a template with a sharing config (measured on kube-apiserver v1.34.12)."""
        body = claim_template_for_version(template_v1, self.resource_api_version)
        text = json.dumps(body if isinstance(body, dict) else to_dict(body), separators=(",", ":"), sort_keys=True)
        return self._write(self._res().create_namespaced_resource_claim_template, self.namespace, text,
                           _headers={"Content-Type": "application/yaml"})

    def set_template_owner(self, name: str, owner_patch: dict) -> None:
        """Merge-patch the template's ownerReferences (see ``manifests.owner_reference``)."""
        self._write(self._res().patch_namespaced_resource_claim_template, name, self.namespace, owner_patch,
                    _content_type="application/merge-patch+json")

    def delete_claim_template(self, name: str) -> bool:
        try:
            self._write(self._res().delete_namespaced_resource_claim_template, name, self.namespace)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    def read_claim(self, name: str) -> Any | None:
        try:
            return self._read(self._res().read_namespaced_resource_claim, name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def list_claims(self, label_selector: str) -> list[Any]:
        return self._read(self._res().list_namespaced_resource_claim, self.namespace, label_selector=label_selector).items

    def list_claim_templates(self, label_selector: str) -> list[Any]:
        return self._read(self._res().list_namespaced_resource_claim_template, self.namespace,
                          label_selector=label_selector).items

    def delete_claim(self, name: str) -> bool:
        """Delete a ResourceClaim; the API server keeps it until its pod releases it (delete protection)."""
        try:
            self._write(self._res().delete_namespaced_resource_claim, name, self.namespace)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise


class ListWatch:
    """A daemon thread that lists objects, then watches them from that list's resourceVersion, relisting after
    any error (410 Gone, timeouts, connection resets); a subclass says what to list (:meth:`_list_call`) and
    handles each object (:meth:`_on`, with the watch event's type: ``ADDED`` for listed ones)."""

    thread_name = "dagster-gpu-watch"
    #: Extra keyword arguments of the watch stream (not of the list).
    stream_kwargs: dict[str, Any] = {}

    def __init__(self):
        self._lock = threading.Lock()
        self._started = False
        self._stop = threading.Event()
        self._synced = threading.Event()

    def start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        threading.Thread(target=self._run, name=self.thread_name, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    def _list_call(self) -> tuple[Callable[..., Any], tuple, dict[str, Any]]:
        """(list function, its positional arguments, its keyword arguments)."""
        raise NotImplementedError

    def _on(self, event_type: str, obj: Any) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                fn, args, kwargs = self._list_call()
                lst = fn(*args, _request_timeout=TIMEOUT, **kwargs)
                for o in lst.items:
                    self._on("ADDED", o)
                self._synced.set()
                w = watch.Watch()
                for ev in w.stream(fn, *args, resource_version=lst.metadata.resource_version, timeout_seconds=240,
                                   _request_timeout=(5, 300), **kwargs, **self.stream_kwargs):
                    if self._stop.is_set():
                        w.stop()
                        return
                    self._on(ev["type"], ev["object"])
            except Exception:  # noqa: BLE001 - relist after 410 Gone, timeouts, connection resets
                self._stop.wait(1.0)


class ClaimWatcher(ListWatch):
    """Remembers each dagster-gpu ResourceClaim's allocation by owning pod UID, from a list+watch.

    The resourceclaim controller deallocates and deletes a generated claim as soon as its pod ends, so a
    read after the pod finished usually finds nothing; the watch sees the allocation when the scheduler
    writes it. Runs in a daemon thread, relisting after any error; :meth:`get` is thread-safe.

    Entries: ``{"claim": name, "devices": ["driver/pool/device", ...], "requests": [result's request, ...],
    "allocated_at": epoch s}`` (a request is ``gpu``, or ``gpu/<subrequest>`` for a firstAvailable claim).
    """

    thread_name = "dagster-gpu-claim-watch"
    # the client maps V1ResourceClaimList to a non-existent V1ResourceClaim model (it is
    # ResourceV1ResourceClaim): take the watch's JSON as is
    stream_kwargs = {"deserialize": False}

    def __init__(self, kube: KubeClient, label_selector: str):
        super().__init__()
        self.kube = kube
        self.label_selector = label_selector
        self._by_pod: dict[str, dict[str, Any]] = {}

    def get(self, pod_uid: str) -> dict[str, Any] | None:
        with self._lock:
            e = self._by_pod.get(pod_uid)
            return dict(e) if e else None

    def record(self, claim: Any) -> None:
        """Record one claim (a model or dict) if it is allocated and owned by a pod."""
        d = claim if isinstance(claim, dict) else to_dict(claim)
        devices = allocated_devices(d)
        owners = [o for o in (d.get("metadata") or {}).get("ownerReferences") or [] if o.get("kind") == "Pod"]
        if not devices or not owners:
            return
        with self._lock:
            for o in owners:
                if o["uid"] not in self._by_pod:
                    self._by_pod[o["uid"]] = {"claim": d["metadata"]["name"], "devices": devices,
                                              "requests": allocated_requests(d), "allocated_at": time.time()}

    def _list_call(self):
        return self.kube._res().list_namespaced_resource_claim, (self.kube.namespace,), {"label_selector": self.label_selector}

    def _on(self, event_type: str, obj: Any) -> None:
        if event_type in ("ADDED", "MODIFIED"):
            self.record(obj)


class PodWatcher(ListWatch):
    """Hands every version of each dagster-gpu pod (V1Pod), as a list+watch sees it, to ``on_pod``: the pod's
    last status before it goes away (its container's ``terminated`` interval, a ``DisruptionTarget``
    condition) arrives even when the kubelet removes the pod right after, as it does at the end of a
    graceful delete (a preemption's, an eviction's), between two reads of a poll."""

    thread_name = "dagster-gpu-pod-watch"

    def __init__(self, kube: KubeClient, label_selector: str, on_pod: Callable[[Any], None]):
        super().__init__()
        self.kube = kube
        self.label_selector = label_selector
        self.on_pod = on_pod

    def _list_call(self):
        return self.kube.core.list_namespaced_pod, (self.kube.namespace,), {"label_selector": self.label_selector}

    def _on(self, event_type: str, obj: Any) -> None:
        if event_type in ("ADDED", "MODIFIED", "DELETED"):
            self.on_pod(obj)
