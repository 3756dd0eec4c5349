"""A minimal kubelet + NVIDIA DRA kubelet-plugin stand-in for the fake GPU node (test infrastructure, NOT part of
the dagster-gpu library).

It authenticates as ``system:node:<node>`` (Node authorizer + NodeRestriction apply, as for a kubelet) and
behaves like a kubelet (kubernetes/kubernetes v1.34) and NVIDIA's DRA driver (NVIDIA/k8s-dra-driver-gpu
v25.12.0) where dagster-gpu depends on it; each behaviour names the upstream file it copies:

* keeps the Node Ready: patches ``status`` (capacity, allocatable, conditions, addresses, nodeInfo) every
  ``--status-interval`` seconds and renews the Lease ``kube-node-lease/<node>`` every 10 s;
* publishes the node's ResourceSlice as the driver's kubelet plugin does through
  ``k8s.io/dynamic-resource-allocation/resourceslice`` (``resourceslicecontroller.go``): ``generateName``
  ``<node>-gpu.nvidia.com-``, the Node as ownerReference, ``pool`` = node name with a ``generation`` bumped
  (and older slices of the pool deleted) whenever the devices differ from what is published; the devices are
  ``--devices`` (a ResourceSlice YAML of what the driver publishes: ``cmd/gpu-kubelet-plugin/deviceinfo.go``
  attribute names, ``resource.kubernetes.io/pciBusID``, NVML's exact memory totals);
* records core/v1 Events as the kubelet's event recorder does (``source.component: kubelet``, one event per
  object+reason+message whose ``count``/``lastTimestamp`` grow on repeats: client-go
  ``tools/record/events_cache.go``), with the kubelet's reasons (``pkg/kubelet/events/event.go``);
* watches pods bound to the node (``spec.nodeName``); for each, in the kubelet's order
  (``pkg/kubelet/kuberuntime/kuberuntime_manager.go`` SyncPod): status Pending with the container waiting
  ``ContainerCreating``; **DRA prepare** of each allocated ResourceClaim (``pkg/kubelet/cm/dra/manager.go``
  -> the driver's NodePrepareResources): opaque ``resource.nvidia.com/v1beta1`` ``GpuConfig`` /
  ``MigDeviceConfig`` with ``sharing.strategy`` TimeSlicing or MPS are refused unless the driver's feature gate
  ``TimeSlicingSettings`` / ``MPSSupport`` is on (``--feature-gates``; both off by default as the driver
  ships them: ``pkg/featuregates/featuregates.go``; the refusal is ``api/nvidia.com/resource/v1beta1/
  sharing.go`` ``GpuSharing.Validate``'s "invalid GPU sharing settings"), and then the pod stays
  ContainerCreating with a Warning ``FailedPrepareDynamicResources`` "Failed to prepare dynamic resources:
  NodePrepareResources failed for claim <ns>/<claim>: ..." retried with back-off; **image pull**
  (``pkg/kubelet/images/image_manager.go``): Normal ``Pulling`` "Pulling image "<image>"", after
  ``--image-pull-seconds`` (``--slow-image-pull-seconds`` for an image matching ``--slow-image-regex``) Normal
  ``Pulled`` "Successfully pulled image ..."; an image present and not ``imagePullPolicy: Always`` gets
  ``Pulled`` "Container image ... already present on machine"; an image matching ``--missing-image-regex``
  fails: Warning ``Failed`` "Failed to pull image ...: ... not found", Warning ``Failed`` "Error:
  ErrImagePull" (waiting ``ErrImagePull``), then Normal ``BackOff`` "Back-off pulling image ..." (waiting
  ``ImagePullBackOff``) with the kubelet's doubling back-off (``--image-pull-backoff-seconds``, 10 s as the
  kubelet, at most 300 s); then runs the first container's ``command + args`` as a local process (its own
  session) with the container's ``env``/``envFrom`` resolved through the API (``secretKeyRef``,
  ``configMapKeyRef``, ``fieldRef``), ``workingDir`` if it exists, stdout+stderr to
  ``<state-dir>/logs/<namespace>_<pod>.log``; Normal ``Created`` / ``Started`` events;
* DRA devices reach the container as the driver's CDI spec makes them (``cmd/gpu-kubelet-plugin/cdi.go``):
  ``NVIDIA_VISIBLE_DEVICES=void`` and no ``CUDA_VISIBLE_DEVICES``; a process cannot get device nodes here,
  so a worker learns its devices as in a real pod, from its ResourceClaim's allocation and the ResourceSlice's
  ``uuid`` attributes (``dagster_gpu.k8s.claim``);
* a pod with a named ServiceAccount (token automounted) gets a pod-bound token from the TokenRequest API,
  written with ca.crt and namespace to a per-pod directory named in ``DAGSTER_GPU_K8S_SA_DIR`` (a kubelet
  mounts them at the standard path), plus ``KUBERNETES_SERVICE_HOST``/``_PORT``;
* reports phase Pending -> Running -> Succeeded/Failed with ``startTime``, conditions and
  ``containerStatuses`` (``running.startedAt``; ``terminated.{exitCode, reason, startedAt, finishedAt}``,
  and for a failed container with ``terminationMessagePolicy: FallbackToLogsOnError`` a ``message`` with the
  last lines of its log, capped as a kubelet caps it);
* on pod deletion (``deletionTimestamp``) sends SIGTERM to the process group, SIGKILL after
  ``deletionGracePeriodSeconds`` (from ``terminationGracePeriodSeconds``), reports the exit, then removes
  the pod object (delete with grace 0 and a UID precondition), exactly as a kubelet finishes a graceful delete.

Container images are not run (the command runs on this host), volumes, probes, resources, ``securityContext``
users and restarts are ignored (restartPolicy is treated as Never). Pod Security admission ("restricted" on
the test namespace) is the API server's, not this agent's. ResourceClaim reservation and release are done by
kube-scheduler and the resourceclaim controller, not here.

Run: ``python node_agent.py --kubeconfig node.kubeconfig --node gpu-node-0 --state-dir DIR --devices FILE``.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import logging
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid as uuidlib
from dataclasses import dataclass, field

import yaml
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

log = logging.getLogger("node-agent")
MERGE = "application/merge-patch+json"
#: A pod's status is written as the kubelet writes it: a strategic merge patch (pkg/util/pod PatchPodStatus,
#: types.StrategicMergePatchType), in which ``conditions`` merge by ``type``. So a condition the kubelet does
#: not own (the scheduler's or the eviction API's ``DisruptionTarget``) stays on the pod, as the status manager
#: keeps it (pkg/kubelet/status/status_manager.go mergePodStatus: "preserve where pod conditions not owned by
#: kubelet"); a JSON merge patch would replace the whole list and drop it.
STRATEGIC = "application/strategic-merge-patch+json"


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def ts(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Proc:
    uid: str
    namespace: str
    name: str
    container: str
    popen: subprocess.Popen | None = None
    started: dt.datetime | None = None
    finished: dt.datetime | None = None
    exit_code: int | None = None
    kill_deadline: float | None = None  # monotonic; set when the pod is being deleted
    deleting: bool = False
    reported: bool = False  # terminal status written
    removed: bool = False  # pod object deleted by us
    start_error: str = ""
    next_start_try: float = 0.0
    pod: object = field(default=None, repr=False)
    # before the container starts (the kubelet's SyncPod order): new -> prepare -> pull -> pulling
    # [-> backoff -> pull ...] -> start
    stage: str = "new"
    next_try: float = 0.0  # monotonic: the stage's next attempt
    prepare_backoff: float = 0.0  # seconds, doubling per failed NodePrepareResources
    pull_started: float = 0.0
    pull_until: float = 0.0
    pull_backoff: float = 0.0  # seconds, doubling per failed pull (the kubelet's image back-off)
    backoff_until: float = 0.0
    pull_error: str = ""
    start_backoff: float = 0.0


#: A kubelet's caps on a termination message taken from the container's log (terminationMessagePolicy
#: FallbackToLogsOnError): MaxContainerTerminationMessageLogLines / ...LogLength, pkg/kubelet/container/runtime.go.
FALLBACK_LOG_LINES, FALLBACK_LOG_BYTES = 80, 2048


def log_fallback_message(path: str) -> str:
    """What a kubelet writes as a failed container's termination message under ``FallbackToLogsOnError`` when
    the container wrote no message file (this agent mounts none): the last 80 lines of its log, of which the
    last 2048 bytes (the kubelet reads the tail into a 2 KiB circular buffer)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read()
    except OSError:
        return ""
    tail = b"".join(data.splitlines(keepends=True)[-FALLBACK_LOG_LINES:])[-FALLBACK_LOG_BYTES:]
    return tail.decode("utf-8", "replace")


DRIVER = "gpu.nvidia.com"
#: The driver's opaque config API group/version (api/nvidia.com/resource/v1beta1/api.go).
OPAQUE_API = "resource.nvidia.com/v1beta1"
#: Driver feature gates that allow a sharing strategy (pkg/featuregates/featuregates.go, v25.12.0: both alpha,
#: default false); GpuSharing.Validate / MigDeviceSharing.Validate (api/nvidia.com/resource/v1beta1/sharing.go)
#: accept TimeSlicing / MPS only when its gate is on.
SHARING_GATES = {"TimeSlicing": "TimeSlicingSettings", "MPS": "MPSSupport"}
DEFAULT_FEATURE_GATES = {"TimeSlicingSettings": False, "MPSSupport": False}
#: The kubelet's image pull back-off (pkg/kubelet/kubelet.go: flowcontrol.NewBackOff(backOffPeriod=10s,
#: MaxContainerBackOff=300s)).
MAX_PULL_BACKOFF_S = 300.0


def parse_feature_gates(text: str) -> dict[str, bool]:
    """``"TimeSlicingSettings=true,MPSSupport=false"`` (the driver's ``--feature-gates`` syntax) over the
    defaults; raises ValueError for an unknown gate or a value that is not true/false."""
    gates = dict(DEFAULT_FEATURE_GATES)
    for part in filter(None, (x.strip() for x in (text or "").split(","))):
        k, _, v = part.partition("=")
        if k not in gates or v.lower() not in ("true", "false"):
            raise ValueError(f"--feature-gates: unknown gate or value {part!r} (known: {sorted(gates)})")
        gates[k] = v.lower() == "true"
    return gates


def sharing_error(params: dict, gates: dict[str, bool]) -> str | None:
    """The driver's error for an opaque config it refuses at NodePrepareResources, or None.

    ``GpuConfig`` / ``MigDeviceConfig`` with ``sharing.strategy`` TimeSlicing or MPS need the feature gate
    of :data:`SHARING_GATES`; otherwise ``Validate`` returns "invalid GPU sharing settings: %v" ("invalid MIG
    device sharing settings: %v" for a MIG config), %v being Go's rendering of the *GpuSharing struct."""
    kind = params.get("kind")
    if params.get("apiVersion") != OPAQUE_API or kind not in ("GpuConfig", "MigDeviceConfig"):
        return None
    sharing = params.get("sharing") or {}
    strategy = sharing.get("strategy")
    if not strategy:
        return None
    gate = SHARING_GATES.get(strategy)
    if gate is not None and gates.get(gate):
        return None
    what = "GPU" if kind == "GpuConfig" else "MIG device"
    # Go's %v of the *GpuSharing{Strategy, TimeSlicingConfig *.., MpsConfig *..}: pointers print as addresses
    ptr = lambda key: "0xc000a1c0f0" if sharing.get(key) else "<nil>"  # noqa: E731
    return f"invalid {what} sharing settings: &{{{strategy} {ptr('timeSlicingConfig')} {ptr('mpsConfig')}}}"


class EventRecorder:
    """core/v1 Events as the kubelet records them (client-go tools/record): ``source.component`` kubelet,
    name ``<pod>.<hex unix nanos>``; a repeat of the same object+type+reason+message patches ``count`` and
    ``lastTimestamp`` instead of creating another (events_cache.go's aggregation of identical events)."""

    def __init__(self, core: client.CoreV1Api, node: str):
        self.core, self.node = core, node
        self._seen: dict[tuple, tuple[str, int]] = {}
        self._lock = threading.Lock()

    def emit(self, pod, type_: str, reason: str, message: str, field_path: str = "") -> None:
        md = pod.metadata
        key = (md.uid, type_, reason, message)
        t = ts(now())
        with self._lock:
            prev = self._seen.get(key)
        try:
            if prev is not None:
                name, count = prev
                self.core.patch_namespaced_event(name, md.namespace, {"count": count + 1, "lastTimestamp": t})
                with self._lock:
                    self._seen[key] = (name, count + 1)
                return
            name = f"{md.name}.{time.time_ns():x}"
            obj = {"kind": "Pod", "apiVersion": "v1", "namespace": md.namespace, "name": md.name, "uid": md.uid}
            if field_path:
                obj["fieldPath"] = field_path
            self.core.create_namespaced_event(md.namespace, {
                "metadata": {"name": name, "namespace": md.namespace}, "involvedObject": obj,
                "reason": reason, "message": message, "type": type_, "count": 1,
                "firstTimestamp": t, "lastTimestamp": t,
                "source": {"component": "kubelet", "host": self.node},
                "reportingComponent": "kubelet", "reportingInstance": self.node})
            with self._lock:
                self._seen[key] = (name, 1)
        except ApiException as e:
            log.warning("event %s for %s/%s not written: %s %s", reason, md.namespace, md.name, e.status, e.reason)

    def forget(self, uid: str) -> None:
        with self._lock:
            for k in [k for k in self._seen if k[0] == uid]:
                del self._seen[k]


def _device_key(d: dict) -> tuple:
    """A device as compared for republishing: name, attributes and capacity (values as strings)."""
    attrs = {k: str(next(iter(v.values()))) for k, v in (d.get("attributes") or {}).items()}
    cap = {k: str(v.get("value")) for k, v in (d.get("capacity") or {}).items()}
    return d["name"], tuple(sorted(attrs.items())), tuple(sorted(cap.items()))


class NodeAgent:
    def __init__(self, api: client.ApiClient, node: str, state_dir: str, kubelet_version: str, status_interval: float,
                 devices: list[dict] | None = None, feature_gates: dict[str, bool] | None = None,
                 image_pull_s: float = 1.0, slow_image_regex: str = "slow-pull", slow_image_pull_s: float = 8.0,
                 missing_image_regex: str = "does-not-exist", image_pull_backoff_s: float = 10.0):
        self.api = api
        self.core = client.CoreV1Api(api)
        self.coord = client.CoordinationV1Api(api)
        self.resource = client.ResourceV1Api(api)
        self.node = node
        self.state_dir = state_dir
        self.kubelet_version = kubelet_version
        self.status_interval = status_interval
        self.procs: dict[str, Proc] = {}
        self.lock = threading.RLock()
        self.stop = threading.Event()
        self.boot_id = str(uuidlib.uuid4())
        self.devices = devices or []
        self.gates = dict(feature_gates or DEFAULT_FEATURE_GATES)
        self.image_pull_s, self.slow_image_pull_s, self.image_pull_backoff_s = \
            image_pull_s, slow_image_pull_s, image_pull_backoff_s
        self.slow_image = re.compile(slow_image_regex) if slow_image_regex else None
        self.missing_image = re.compile(missing_image_regex) if missing_image_regex else None
        self.images: set[str] = set()  # images "present on the node" (pulled once)
        self.events = EventRecorder(self.core, node)
        os.makedirs(os.path.join(state_dir, "logs"), exist_ok=True)
        os.makedirs(os.path.join(state_dir, "pods"), exist_ok=True)

    # ---- ResourceSlices (the driver's kubelet plugin) -----------------------------------------
    def publish_slices(self) -> None:
        """Publish :attr:`devices` as one ResourceSlice of pool ``<node>``, as the kubelet plugin's
        resourceslice controller does (k8s.io/dynamic-resource-allocation/resourceslice/
        resourceslicecontroller.go): keep a published slice whose devices are the same; otherwise create one
        with ``generateName: <node>-gpu.nvidia.com-``, the Node as ownerReference and the pool's generation
        + 1, then delete the pool's older slices."""
        if not self.devices:
            return
        ser = self.api.sanitize_for_serialization
        sel = f"spec.nodeName={self.node}"
        mine = [x for x in self.resource.list_resource_slice(field_selector=sel).items if x.spec.driver == DRIVER]
        want = sorted(_device_key(d) for d in self.devices)
        for x in mine:
            if x.spec.pool.name == self.node and x.metadata.owner_references and \
                    sorted(_device_key(ser(d)) for d in x.spec.devices or []) == want and len(mine) == 1:
                log.info("ResourceSlice %s (pool %s generation %s) is current", x.metadata.name, self.node,
                         x.spec.pool.generation)
                return
        gen = max([x.spec.pool.generation or 0 for x in mine], default=0) + 1
        node_uid = self.core.read_node(self.node).metadata.uid
        created = self.resource.create_resource_slice({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"generateName": f"{self.node}-{DRIVER}-", "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": node_uid, "controller": True}]},
            "spec": {"driver": DRIVER, "nodeName": self.node,
                     "pool": {"name": self.node, "generation": gen, "resourceSliceCount": 1},
                     "devices": self.devices},
        })
        for x in mine:
            try:
                self.resource.delete_resource_slice(x.metadata.name)
            except ApiException as e:
                if e.status != 404:
                    raise
        log.info("published ResourceSlice %s (pool %s generation %d, %d devices; replaced %d)",
                 created.metadata.name, self.node, gen, len(self.devices), len(mine))

    # ---- node heartbeat ------------------------------------------------------------------------
    def patch_node_status(self) -> None:
        t = ts(now())
        cond = lambda typ, status, reason, msg: {  # noqa: E731
            "type": typ, "status": status, "reason": reason, "message": msg,
            "lastHeartbeatTime": t, "lastTransitionTime": t,
        }
        res = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "500Gi"}
        body = {
            "status": {
                "capacity": res,
                "allocatable": res,
                "conditions": [
                    cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "node agent has sufficient memory"),
                    cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "node agent has no disk pressure"),
                    cond("PIDPressure", "False", "KubeletHasSufficientPID", "node agent has sufficient PID"),
                    cond("Ready", "True", "KubeletReady", "dagster-gpu node agent is posting ready status"),
                ],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": self.node}],
                "nodeInfo": {
                    "machineID": "dagster-gpu-fake-node", "systemUUID": "dagster-gpu-fake-node", "bootID": self.boot_id,
                    "kernelVersion": platform.release(), "osImage": "dagster-gpu node agent (local processes)",
                    "containerRuntimeVersion": "local-process://1", "kubeletVersion": self.kubelet_version,
                    "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
                },
            }
        }
        self.core.patch_node_status(self.node, body, _content_type=MERGE)

    def renew_lease(self) -> None:
        ns, t = "kube-node-lease", now().strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        try:
            lease = self.coord.read_namespaced_lease(self.node, ns)
            lease.spec.renew_time = t
            lease.spec.holder_identity = self.node
            self.coord.replace_namespaced_lease(self.node, ns, lease)
        except ApiException as e:
            if e.status != 404:
                raise
            node = self.core.read_node(self.node)
            self.coord.create_namespaced_lease(ns, {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.node, "namespace": ns, "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": node.metadata.uid}]},
                "spec": {"holderIdentity": self.node, "leaseDurationSeconds": 40, "renewTime": t},
            })

    def heartbeat_loop(self) -> None:
        last_status = 0.0
        while not self.stop.is_set():
            try:
                if time.monotonic() - last_status >= self.status_interval:
                    self.patch_node_status()
                    last_status = time.monotonic()
                self.renew_lease()
            except Exception as e:  # noqa: BLE001 - a heartbeat must never kill the agent
                log.warning("heartbeat failed: %s", e)
            self.stop.wait(10)

    # ---- pods ---------------------------------------------------------------------------------
    def _value_from(self, pod, ref) -> str | None:
        ns = pod.metadata.namespace
        if ref.secret_key_ref is not None:
            r = ref.secret_key_ref
            try:
                s = self.core.read_namespaced_secret(r.name, ns)
            except ApiException as e:
                if e.status == 404 and r.optional:
                    return None
                raise RuntimeError(f"secret {r.name!r}: {e.status} {e.reason}") from None
            if r.key not in (s.data or {}):
                if r.optional:
                    return None
                raise RuntimeError(f"couldn't find key {r.key} in Secret {ns}/{r.name}")
            return base64.b64decode(s.data[r.key]).decode()
        if ref.config_map_key_ref is not None:
            r = ref.config_map_key_ref
            try:
                cm = self.core.read_namespaced_config_map(r.name, ns)
            except ApiException as e:
                if e.status == 404 and r.optional:
                    return None
                raise RuntimeError(f"configmap {r.name!r}: {e.status} {e.reason}") from None
            if r.key not in (cm.data or {}):
                if r.optional:
                    return None
                raise RuntimeError(f"couldn't find key {r.key} in ConfigMap {ns}/{r.name}")
            return cm.data[r.key]
        if ref.field_ref is not None:
            fp = ref.field_ref.field_path
            return {
                "metadata.name": pod.metadata.name, "metadata.namespace": ns, "metadata.uid": pod.metadata.uid,
                "spec.nodeName": pod.spec.node_name, "spec.serviceAccountName": pod.spec.service_account_name or "",
                "status.hostIP": "127.0.0.1", "status.podIP": "127.0.0.1",
            }.get(fp, "")
        return ""

    def _env(self, pod, c) -> dict[str, str]:
        env = {
            # The "image" here is this host with the agent's virtualenv: its bin directory first on PATH, as a
            # worker image's ENV PATH puts its venv (docker/Dockerfile), so a pod's bare `python` is that one.
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "HOSTNAME": pod.metadata.name,
        }
        for ef in c.env_from or []:
            prefix = ef.prefix or ""
            if ef.secret_ref is not None:
                s = self.core.read_namespaced_secret(ef.secret_ref.name, pod.metadata.namespace)
                env.update({prefix + k: base64.b64decode(v).decode() for k, v in (s.data or {}).items()})
            if ef.config_map_ref is not None:
                cm = self.core.read_namespaced_config_map(ef.config_map_ref.name, pod.metadata.namespace)
                env.update({prefix + k: v for k, v in (cm.data or {}).items()})
        for e in c.env or []:
            if e.value_from is not None:
                v = self._value_from(pod, e.value_from)
                if v is None:
                    continue
            else:
                v = e.value or ""
            env[e.name] = v
        env.update(self._service_account_env(pod))
        if pod.spec.resource_claims:
            # The driver's CDI spec for an allocated device sets NVIDIA_VISIBLE_DEVICES=void (the NVIDIA
            # container runtime then adds no devices of its own: CDI injected the device nodes) and never
            # CUDA_VISIBLE_DEVICES (cmd/gpu-kubelet-plugin/cdi.go, v25.12.0).
            env["NVIDIA_VISIBLE_DEVICES"] = "void"
        return env

    def _sa_dir(self, uid: str) -> str:
        return os.path.join(self.state_dir, "pods", uid, "serviceaccount")

    def _service_account_env(self, pod) -> dict[str, str]:
        """The pod's ServiceAccount credentials, as a kubelet projects them (empty when not automounted).

        A kubelet asks for a token bound to the pod (TokenRequest; the Node authorizer allows it for pods
        on this node) and mounts token, ca.crt and namespace at /var/run/secrets/kubernetes.io/
        serviceaccount, and sets KUBERNETES_SERVICE_HOST/PORT. This agent runs processes, not containers,
        so it writes the same three files under the pod's state directory and names that directory in
        DAGSTER_GPU_K8S_SA_DIR (which dagster-gpu's worker reads before the standard path).
        """
        # The ServiceAccount admission plugin adds the token as a projected volume (kube-api-access-*) only
        # when the pod (or its account) automounts it; the kubelet mounts what the volumes say.
        sources = [src.service_account_token for v in pod.spec.volumes or [] if v.projected is not None
                   for src in v.projected.sources or [] if src.service_account_token is not None]
        if not sources or not pod.spec.service_account_name:
            return {}
        md, tok = pod.metadata, sources[0]
        tr = self.core.create_namespaced_service_account_token(
            pod.spec.service_account_name, md.namespace, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
                audiences=[tok.audience] if tok.audience else [], expiration_seconds=tok.expiration_seconds or 3607,
                bound_object_ref=client.V1BoundObjectReference(api_version="v1", kind="Pod", name=md.name, uid=md.uid))))
        d = self._sa_dir(md.uid)
        os.makedirs(d, mode=0o700, exist_ok=True)
        with open(self.api.configuration.ssl_ca_cert, "rb") as f:
            ca = f.read()
        for name, data in (("token", tr.status.token.encode()), ("ca.crt", ca), ("namespace", md.namespace.encode())):
            fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        host = urllib.parse.urlsplit(self.api.configuration.host)
        return {"KUBERNETES_SERVICE_HOST": host.hostname or "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(host.port or 443),
                "DAGSTER_GPU_K8S_SA_DIR": d}

    def _claims(self, pod) -> list | None:
        """The pod's ResourceClaims once every one is allocated and reserved for it, else None (the kubelet
        waits: pkg/kubelet/cm/dra/manager.go reads each claim of ``status.resourceClaimStatuses``)."""
        names = [s.resource_claim_name for s in (pod.status.resource_claim_statuses or []) if s.resource_claim_name]
        names += [c.resource_claim_name for c in (pod.spec.resource_claims or []) if c.resource_claim_name]
        if len(names) < len(pod.spec.resource_claims or []):
            return None
        out = []
        for n in names:
            try:
                claim = self.resource.read_namespaced_resource_claim(n, pod.metadata.namespace)
            except ApiException:
                return None
            if not (claim.status and claim.status.allocation):
                return None
            out.append(claim)
        return out

    def _prepare_error(self, pod) -> str | None:
        """What NodePrepareResources answers for the pod's claims: None when prepared, else the kubelet's
        error (pkg/kubelet/cm/dra/manager.go: "NodePrepareResources failed for claim %s/%s: %s" around the
        driver's per-claim error; the driver wraps its own as "error preparing devices for claim %s/%s:%s: %w",
        cmd/gpu-kubelet-plugin/driver.go). Raises LookupError while a claim is not yet allocated."""
        claims = self._claims(pod)
        if claims is None:
            raise LookupError("claims not allocated yet")
        for claim in claims:
            alloc = claim.status.allocation
            for cfg in (alloc.devices.config if alloc.devices else None) or []:
                op = cfg.opaque
                if op is None or op.driver != DRIVER or not isinstance(op.parameters, dict):
                    continue
                err = sharing_error(op.parameters, self.gates)
                if err:
                    md = claim.metadata
                    return (f"NodePrepareResources failed for claim {md.namespace}/{md.name}: error preparing devices "
                            f"for claim {md.namespace}/{md.name}:{md.uid}: prepare devices failed: error applying "
                            f"GPU config: {err}")
        return None

    def _patch_pod_status(self, p: Proc, status: dict) -> None:
        for cs in status.get("containerStatuses") or []:  # a container is in one state: clear the others
            state = cs.get("state") or {}
            cs["state"] = {**{k: None for k in ("waiting", "running", "terminated")}, **state}
        # a condition merged by type keeps the fields it does not send: clear an earlier reason and message,
        # as the kubelet's two-way patch does
        if "conditions" in status:
            status["conditions"] = [{"reason": None, "message": None, **c} for c in status["conditions"]]
        try:
            self.core.patch_namespaced_pod_status(p.name, p.namespace, {"metadata": {"uid": p.uid}, "status": status},
                                                  _content_type=STRATEGIC)
        except ApiException as e:
            if e.status not in (404, 409, 422):
                raise
            log.info("status of %s/%s not written (%s %s)", p.namespace, p.name, e.status, e.reason)

    def _conditions(self, pod, ready: bool, reason: str = "", sandbox: bool = True) -> list[dict]:
        t = ts(now())
        scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": t}
        for c in pod.status.conditions or []:
            if c.type == "PodScheduled":
                scheduled["lastTransitionTime"] = ts(c.last_transition_time) if c.last_transition_time else t
        out = [scheduled,
               {"type": "PodReadyToStartContainers", "status": "True" if sandbox else "False", "lastTransitionTime": t},
               {"type": "Initialized", "status": "True", "lastTransitionTime": t}]
        for typ in ("ContainersReady", "Ready"):
            c = {"type": typ, "status": "True" if ready else "False", "lastTransitionTime": t}
            if reason:
                c["reason"] = reason
            out.append(c)
        return out

    def _waiting(self, p: Proc, reason: str, message: str = "", sandbox: bool = True) -> None:
        """Status of a pod whose container has not started: Pending, waiting ``reason`` (the kubelet's
        ContainerCreating while it prepares devices and pulls the image, pkg/kubelet/kubelet_pods.go)."""
        c = p.pod.spec.containers[0]
        waiting = {"reason": reason, **({"message": message} if message else {})}
        self._patch_pod_status(p, {
            "phase": "Pending", "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "startTime": ts(now()) if p.pod.status.start_time is None else ts(p.pod.status.start_time),
            "conditions": self._conditions(p.pod, ready=False, reason="ContainersNotReady", sandbox=sandbox),
            "containerStatuses": [{"name": c.name, "image": c.image or "", "imageID": "", "ready": False,
                                   "restartCount": 0, "started": False, "state": {"waiting": waiting}}],
        })

    def advance(self, p: Proc) -> None:
        """One step of a bound pod before its container starts, in SyncPod's order: DRA prepare, image
        pull, start (see the module docstring). Called from the watch (first sight) and the reap loop."""
        t = time.monotonic()
        if t < p.next_try or p.popen is not None or p.deleting or p.removed:
            return
        pod, c = p.pod, p.pod.spec.containers[0]
        fp = f"spec.containers{{{c.name}}}"
        if p.stage == "new":
            self._waiting(p, "ContainerCreating", sandbox=False)
            p.stage = "prepare"
        if p.stage == "prepare":
            if pod.spec.resource_claims:
                try:
                    err = self._prepare_error(pod)
                except LookupError:
                    p.next_try = t + 0.5
                    return
                if err:
                    # pkg/kubelet/kuberuntime/kuberuntime_manager.go SyncPod: the event, then the pod worker
                    # retries the sync with back-off; the pod stays ContainerCreating.
                    self.events.emit(pod, "Warning", "FailedPrepareDynamicResources",
                                     f"Failed to prepare dynamic resources: {err}")
                    p.prepare_backoff = min(max(2 * p.prepare_backoff, 1.0), 60.0)
                    p.next_try = t + p.prepare_backoff
                    return
            self._waiting(p, "ContainerCreating")
            p.stage = "pull"
        image = c.image or ""
        if p.stage == "pull":
            policy = c.image_pull_policy or "IfNotPresent"
            if image in self.images and policy != "Always":
                self.events.emit(pod, "Normal", "Pulled", f'Container image "{image}" already present on machine', fp)
                p.stage = "start"
            else:
                self.events.emit(pod, "Normal", "Pulling", f'Pulling image "{image}"', fp)
                p.pull_started = t
                if self.missing_image is not None and self.missing_image.search(image):
                    delay = min(0.3, self.image_pull_s)
                elif image in self.images:
                    delay = 0.1  # Always: the layers are present, only the manifest is checked
                elif self.slow_image is not None and self.slow_image.search(image):
                    delay = self.slow_image_pull_s
                else:
                    delay = self.image_pull_s
                p.pull_until = t + delay
                p.stage = "pulling"
                p.next_try = p.pull_until
                return
        if p.stage == "pulling":
            took = t - p.pull_started
            if self.missing_image is not None and self.missing_image.search(image):
                ref = image if "/" in image.split(":")[0] else f"docker.io/library/{image}"
                p.pull_error = (f'rpc error: code = NotFound desc = failed to pull and unpack image "{ref}": failed to '
                                f'resolve reference "{ref}": {ref}: not found')
                self.events.emit(pod, "Warning", "Failed", f'Failed to pull image "{image}": {p.pull_error}', fp)
                self.events.emit(pod, "Warning", "Failed", "Error: ErrImagePull", fp)
                self._waiting(p, "ErrImagePull", p.pull_error)
                p.pull_backoff = min(max(2 * p.pull_backoff, self.image_pull_backoff_s), MAX_PULL_BACKOFF_S)
                p.backoff_until = t + p.pull_backoff
                p.stage = "backoff"
                p.next_try = t + 1.0  # the next sync finds the image in back-off
                return
            size = 4_285_719_552 if image not in self.images else 0
            self.images.add(image)
            self.events.emit(pod, "Normal", "Pulled", f'Successfully pulled image "{image}" in {took:.3f}s '
                             f'({took:.3f}s including waiting). Image size: {size} bytes.', fp)
            p.stage = "start"
        if p.stage == "backoff":
            if t < p.backoff_until:
                msg = f'Back-off pulling image "{image}"'
                self.events.emit(pod, "Normal", "BackOff", msg, fp)
                self.events.emit(pod, "Warning", "Failed", "Error: ImagePullBackOff", fp)
                self._waiting(p, "ImagePullBackOff", f"{msg}: ErrImagePull: {p.pull_error}")
                p.next_try = min(p.backoff_until, t + 5.0)
                return
            p.stage = "pull"
            return
        if p.stage == "start":
            self.start_pod(pod)

    def start_pod(self, pod) -> None:
        md = pod.metadata
        c = pod.spec.containers[0]
        p = self.procs.get(md.uid) or Proc(uid=md.uid, namespace=md.namespace, name=md.name, container=c.name)
        self.procs[md.uid] = p
        p.pod, p.stage = pod, "start"
        argv = list(c.command or []) + list(c.args or [])
        logpath = self._log_path(md.namespace, md.name)
        if not argv:
            p.start_error = "container has no command; the node agent runs command+args, not image entrypoints"
        else:
            try:
                env = self._env(pod, c)
                p.start_error = ""
            except Exception as e:  # noqa: BLE001
                p.start_error = str(e)
        if p.start_error:
            # as a kubelet does: CreateContainerConfigError, retried until the pod is deleted
            self._patch_pod_status(p, {
                "phase": "Pending", "hostIP": "127.0.0.1", "startTime": ts(now()),
                "containerStatuses": [{"name": c.name, "image": c.image or "", "imageID": "", "ready": False,
                                       "restartCount": 0, "started": False,
                                       "state": {"waiting": {"reason": "CreateContainerConfigError",
                                                             "message": p.start_error}}}],
            })
            # retried soon (e.g. the Node authorizer has not yet linked the Secret), then with the pod worker's
            # doubling back-off (pkg/kubelet/pod_workers.go), at most 10 s here
            p.start_backoff = min(max(2 * p.start_backoff, 0.5), 10.0)
            p.next_start_try = time.monotonic() + p.start_backoff
            # pkg/kubelet/kuberuntime/kuberuntime_container.go startContainer: Warning Failed "Error: <message>"
            self.events.emit(pod, "Warning", "Failed", f"Error: {p.start_error}", f"spec.containers{{{c.name}}}")
            log.warning("pod %s/%s cannot start: %s", md.namespace, md.name, p.start_error)
            return
        cwd = c.working_dir if c.working_dir and os.path.isdir(c.working_dir) else os.path.join(
            self.state_dir, "pods", md.uid)
        os.makedirs(cwd, exist_ok=True)
        with open(logpath, "ab") as out:
            try:
                p.popen = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as e:
                p.started = p.finished = now()
                p.exit_code = 128
                p.start_error = f"failed to start {argv[0]!r}: {e}"
                self.report_exit(p, reason="StartError", message=p.start_error)
                return
        p.started = now()
        fp = f"spec.containers{{{c.name}}}"
        self.events.emit(pod, "Normal", "Created", f"Created container: {c.name}", fp)
        self.events.emit(pod, "Normal", "Started", f"Started container {c.name}", fp)
        log.info("started %s/%s pid %d: %s", md.namespace, md.name, p.popen.pid, argv[:3])
        self._patch_pod_status(p, {
            "phase": "Running", "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}], "startTime": ts(p.started),
            "conditions": self._conditions(pod, ready=True),
            "containerStatuses": [{
                "name": c.name, "image": c.image or "", "imageID": "", "ready": True, "restartCount": 0,
                "started": True, "containerID": f"local-process://{p.popen.pid}",
                "state": {"running": {"startedAt": ts(p.started)}},
            }],
        })

    def _log_path(self, namespace: str, name: str) -> str:
        return os.path.join(self.state_dir, "logs", f"{namespace}_{name}.log")

    def report_exit(self, p: Proc, reason: str = "", message: str = "") -> None:
        code = p.exit_code if p.exit_code is not None else 137
        reason = reason or ("Completed" if code == 0 else "Error")
        term = {"exitCode": code, "reason": reason, "startedAt": ts(p.started or now()),
                "finishedAt": ts(p.finished or now())}
        if p.popen is not None:
            term["containerID"] = f"local-process://{p.popen.pid}"
        if not message and code != 0 and \
                getattr(p.pod.spec.containers[0], "termination_message_policy", None) == "FallbackToLogsOnError":
            message = log_fallback_message(self._log_path(p.namespace, p.name))
        if message:
            term["message"] = message
        self._patch_pod_status(p, {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": self._conditions(p.pod, ready=False, reason="PodCompleted"),
            "containerStatuses": [{"name": p.container, "image": p.pod.spec.containers[0].image or "", "imageID": "",
                                   "ready": False, "restartCount": 0, "started": False,
                                   "containerID": term.get("containerID", ""),
                                   "state": {"terminated": term}}],
        })
        p.reported = True
        shutil.rmtree(self._sa_dir(p.uid), ignore_errors=True)  # the projected token goes with the container
        log.info("pod %s/%s finished: exit %s (%s)", p.namespace, p.name, code, reason)

    def remove_pod(self, p: Proc) -> None:
        try:
            self.core.delete_namespaced_pod(p.name, p.namespace, body=client.V1DeleteOptions(
                grace_period_seconds=0, preconditions=client.V1Preconditions(uid=p.uid)))
            log.info("removed pod %s/%s after graceful termination", p.namespace, p.name)
        except ApiException as e:
            if e.status not in (404, 409):
                raise
        p.removed = True

    def on_pod(self, etype: str, pod) -> None:
        md = pod.metadata
        with self.lock:
            p = self.procs.get(md.uid)
            if etype == "DELETED":
                if p and p.popen and p.popen.poll() is None:
                    self._signal(p, signal.SIGKILL)
                self.procs.pop(md.uid, None)
                self.events.forget(md.uid)
                return
            if md.deletion_timestamp is not None:
                if p is None or p.popen is None or p.popen.poll() is not None:
                    # never started, or already exited: nothing to kill
                    if p is None:
                        p = Proc(uid=md.uid, namespace=md.namespace, name=md.name,
                                 container=pod.spec.containers[0].name, pod=pod)
                        self.procs[md.uid] = p
                    if not p.removed:
                        self.remove_pod(p)
                    return
                if not p.deleting:
                    p.deleting = True
                    grace = md.deletion_grace_period_seconds
                    grace = 30 if grace is None else grace
                    p.kill_deadline = time.monotonic() + grace
                    log.info("pod %s/%s deleted: SIGTERM, grace %ss", md.namespace, md.name, grace)
                    self._signal(p, signal.SIGTERM if grace > 0 else signal.SIGKILL)
                return
            if pod.status.phase in ("Succeeded", "Failed"):
                return
            if p is None:
                p = Proc(uid=md.uid, namespace=md.namespace, name=md.name, container=pod.spec.containers[0].name,
                         pod=pod)
                self.procs[md.uid] = p
                if pod.status.phase == "Running":
                    # started by an earlier run of this agent, which stopped its process when it stopped (a
                    # kubelet's container would have kept running; this one did not): report the exit
                    p.started, p.finished, p.exit_code, p.stage = now(), now(), 137, "start"
                    self.report_exit(p, reason="Error", message="the node agent restarted and its process was stopped")
                    return
                self.advance(p)
            elif p.popen is None and p.stage == "start" and p.start_error and time.monotonic() >= p.next_start_try:
                self.start_pod(pod)
            else:
                p.pod = pod

    @staticmethod
    def _signal(p: Proc, sig: int) -> None:
        try:
            os.killpg(p.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def reap_loop(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                for p in list(self.procs.values()):
                    try:
                        self._reap_one(p)
                    except Exception as e:  # noqa: BLE001
                        log.warning("pod %s/%s: %s", p.namespace, p.name, e)
            self.stop.wait(0.2)

    def _reap_one(self, p: Proc) -> None:
        if p.popen is None and p.stage != "start":
            if not p.removed and not p.deleting:
                self.advance(p)
            return
        if p.popen is None:
            if p.start_error and not p.removed and time.monotonic() >= p.next_start_try and p.pod is not None:
                try:
                    pod = self.core.read_namespaced_pod(p.name, p.namespace)
                except ApiException:
                    return
                if pod.metadata.uid == p.uid and pod.metadata.deletion_timestamp is None:
                    self.start_pod(pod)
            return
        rc = p.popen.poll()
        if rc is None:
            if p.deleting and p.kill_deadline is not None and time.monotonic() >= p.kill_deadline:
                log.info("pod %s/%s: grace period over, SIGKILL", p.namespace, p.name)
                self._signal(p, signal.SIGKILL)
                p.kill_deadline = None
            return
        if not p.reported:
            p.finished = now()
            p.exit_code = rc if rc >= 0 else 128 - rc  # killed by signal N -> 128+N, as a container runtime reports
            self.report_exit(p)
        if p.deleting and not p.removed:
            self.remove_pod(p)

    def watch_loop(self) -> None:
        sel = f"spec.nodeName={self.node}"
        while not self.stop.is_set():
            try:
                lst = self.core.list_pod_for_all_namespaces(field_selector=sel)
                seen = set()
                for pod in lst.items:
                    seen.add(pod.metadata.uid)
                    self.on_pod("ADDED", pod)
                with self.lock:
                    for uid in [u for u in self.procs if u not in seen]:
                        self.on_pod("DELETED", client.V1Pod(metadata=client.V1ObjectMeta(uid=uid)))
                w = watch.Watch()
                for ev in w.stream(self.core.list_pod_for_all_namespaces, field_selector=sel,
                                   resource_version=lst.metadata.resource_version, timeout_seconds=300,
                                   allow_watch_bookmarks=True):
                    if self.stop.is_set():
                        w.stop()
                        break
                    if ev["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self.on_pod(ev["type"], ev["object"])
            except Exception as e:  # noqa: BLE001 - relist after any watch error (410 Gone, connection reset)
                if not self.stop.is_set():
                    log.warning("pod watch: %s; relisting", e)
                    time.sleep(1)

    def run(self) -> None:
        # Publish the devices, then register readiness, so the scheduler sees allocatable devices.
        for attempt in range(60):
            try:
                self.publish_slices()
                self.patch_node_status()
                break
            except ApiException as e:
                log.warning("node status: %s %s (retrying)", e.status, e.reason)
                time.sleep(1)
        threads = [threading.Thread(target=f, daemon=True, name=f.__name__)
                   for f in (self.heartbeat_loop, self.watch_loop, self.reap_loop)]
        for t in threads:
            t.start()
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop.set())
        while not self.stop.is_set():
            self.stop.wait(1)
        # Stopping the agent (cluster stop) stops its processes, like a node going away.
        with self.lock:
            for p in self.procs.values():
                if p.popen and p.popen.poll() is None:
                    self._signal(p, signal.SIGTERM)
        log.info("node agent stopped")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--node", default="gpu-node-0")
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--kubelet-version", default="v1.34.0")
    ap.add_argument("--status-interval", type=float, default=60)
    ap.add_argument("--devices", help="ResourceSlice YAML whose spec.devices the driver publishes for this node")
    ap.add_argument("--feature-gates", default="",
                    help="the driver's feature gates, e.g. TimeSlicingSettings=true,MPSSupport=true (default: all off)")
    ap.add_argument("--image-pull-seconds", type=float, default=1.0, help="first pull of an image")
    ap.add_argument("--slow-image-regex", default="slow-pull", help="images whose first pull takes --slow-image-pull-seconds")
    ap.add_argument("--slow-image-pull-seconds", type=float, default=8.0)
    ap.add_argument("--missing-image-regex", default="does-not-exist",
                    help="images the registry does not have (pull fails: ErrImagePull, ImagePullBackOff)")
    ap.add_argument("--image-pull-backoff-seconds", type=float, default=10.0, help="the kubelet's initial pull back-off")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    api = config.new_client_from_config(config_file=a.kubeconfig)
    devices = []
    if a.devices:
        with open(a.devices) as f:
            devices = yaml.safe_load(f)["spec"]["devices"]
    NodeAgent(api, a.node, a.state_dir, a.kubelet_version, a.status_interval, devices=devices,
              feature_gates=parse_feature_gates(a.feature_gates), image_pull_s=a.image_pull_seconds,
              slow_image_regex=a.slow_image_regex, slow_image_pull_s=a.slow_image_pull_seconds,
              missing_image_regex=a.missing_image_regex, image_pull_backoff_s=a.image_pull_backoff_seconds).run()


if __name__ == "__main__":
    main()
