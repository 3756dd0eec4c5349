"""A minimal kubelet stand-in for the fake GPU node (test infrastructure, NOT part of the dagster-gpu library).

It authenticates as ``system:node:<node>`` (Node authorizer + NodeRestriction apply, as for a kubelet) and:

* keeps the Node Ready: patches ``status`` (capacity, allocatable, conditions, addresses, nodeInfo) every
  ``--status-interval`` seconds and renews the Lease ``kube-node-lease/<node>`` every 10 s;
* watches pods bound to the node (``spec.nodeName``) and runs each pod's first container
  ``command + args`` as a local process (its own session) with the container's ``env``/``envFrom``
  resolved through the API (``secretKeyRef``, ``configMapKeyRef``, ``fieldRef``), ``workingDir`` if it
  exists, stdout+stderr to ``<state-dir>/logs/<namespace>_<pod>.log``; DRA: for each allocated
  ResourceClaim of the pod it sets ``NVIDIA_VISIBLE_DEVICES`` to the devices' ``uuid`` attributes
  (what NVIDIA's driver injects through CDI); a pod with a named ServiceAccount (token automounted) gets
  a pod-bound token from the TokenRequest API, written with ca.crt and namespace to a per-pod directory
  named in ``DAGSTER_GPU_K8S_SA_DIR`` (a kubelet mounts them at the standard path), plus
  ``KUBERNETES_SERVICE_HOST``/``_PORT``;
* reports phase Pending -> Running -> Succeeded/Failed with ``startTime``, conditions and
  ``containerStatuses`` (``running.startedAt``; ``terminated.{exitCode, reason, startedAt, finishedAt}``,
  and for a failed container with ``terminationMessagePolicy: FallbackToLogsOnError`` a ``message`` with the
  last lines of its log, capped as a kubelet caps it);
* on pod deletion (``deletionTimestamp``) sends SIGTERM to the process group, SIGKILL after
  ``deletionGracePeriodSeconds`` (from ``terminationGracePeriodSeconds``), reports the exit, then removes
  the pod object (delete with grace 0 and a UID precondition), exactly as a kubelet finishes a graceful delete.

Container images, volumes, probes, resources and restarts are ignored (restartPolicy is treated as Never).
ResourceClaim reservation and release are done by kube-scheduler and the resourceclaim controller, not here.

Run: ``python node_agent.py --kubeconfig node.kubeconfig --node gpu-node-0 --state-dir DIR``.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import logging
import os
import platform
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
import uuid as uuidlib
from dataclasses import dataclass, field

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

log = logging.getLogger("node-agent")
MERGE = "application/merge-patch+json"


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


class NodeAgent:
    def __init__(self, api: client.ApiClient, node: str, state_dir: str, kubelet_version: str, status_interval: float):
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
        os.makedirs(os.path.join(state_dir, "logs"), exist_ok=True)
        os.makedirs(os.path.join(state_dir, "pods"), exist_ok=True)

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
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
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
        uuids = self._allocated_uuids(pod)
        deadline = time.monotonic() + 10
        while not uuids and pod.spec.resource_claims and time.monotonic() < deadline:
            time.sleep(0.5)  # like a kubelet, prepare the claims' devices before starting (transient API errors)
            uuids = self._allocated_uuids(pod)
        if uuids:
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
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

    def _allocated_uuids(self, pod) -> list[str]:
        """UUIDs of the devices allocated to the pod's claims (best effort; empty when none)."""
        names = [s.resource_claim_name for s in (pod.status.resource_claim_statuses or []) if s.resource_claim_name]
        names += [c.resource_claim_name for c in (pod.spec.resource_claims or []) if c.resource_claim_name]
        out: list[str] = []
        for n in names:
            try:
                claim = self.resource.read_namespaced_resource_claim(n, pod.metadata.namespace)
            except ApiException:
                continue
            alloc = claim.status.allocation if claim.status else None
            for r in (alloc.devices.results if alloc and alloc.devices else []) or []:
                try:
                    sl = self.resource.list_resource_slice(field_selector=f"spec.nodeName={self.node}")
                except ApiException:
                    continue
                for s in sl.items:
                    if s.spec.driver != r.driver or s.spec.pool.name != r.pool:
                        continue
                    for d in s.spec.devices or []:
                        if d.name == r.device and d.attributes and "uuid" in d.attributes:
                            out.append(d.attributes["uuid"].string)
        return out

    def _patch_pod_status(self, p: Proc, status: dict) -> None:
        try:
            self.core.patch_namespaced_pod_status(p.name, p.namespace, {"metadata": {"uid": p.uid}, "status": status},
                                                  _content_type=MERGE)
        except ApiException as e:
            if e.status not in (404, 409, 422):
                raise
            log.info("status of %s/%s not written (%s %s)", p.namespace, p.name, e.status, e.reason)

    def _conditions(self, pod, ready: bool, reason: str = "") -> list[dict]:
        t = ts(now())
        scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": t}
        for c in pod.status.conditions or []:
            if c.type == "PodScheduled":
                scheduled["lastTransitionTime"] = ts(c.last_transition_time) if c.last_transition_time else t
        out = [scheduled,
               {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": t},
               {"type": "Initialized", "status": "True", "lastTransitionTime": t}]
        for typ in ("ContainersReady", "Ready"):
            c = {"type": typ, "status": "True" if ready else "False", "lastTransitionTime": t}
            if reason:
                c["reason"] = reason
            out.append(c)
        return out

    def start_pod(self, pod) -> None:
        md = pod.metadata
        c = pod.spec.containers[0]
        p = self.procs.get(md.uid) or Proc(uid=md.uid, namespace=md.namespace, name=md.name, container=c.name)
        self.procs[md.uid] = p
        p.pod = pod
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
            p.next_start_try = time.monotonic() + 0.5  # e.g. the Node authorizer has not yet linked the Secret
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
            if p is None or (p.popen is None and p.start_error and time.monotonic() >= p.next_start_try):
                self.start_pod(pod)
            elif p is not None:
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
        # Register readiness first so the scheduler sees allocatable pods.
        for attempt in range(60):
            try:
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
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    api = config.new_client_from_config(config_file=a.kubeconfig)
    NodeAgent(api, a.node, a.state_dir, a.kubelet_version, a.status_interval).run()


if __name__ == "__main__":
    main()
