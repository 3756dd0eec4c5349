"""The step's Pod (pure): its settings, the pod built from them, and the handle read back from a pod.

The Pod (``restartPolicy: Never``) references the step's ResourceClaimTemplate (:mod:`dagster_gpu.k8s.dra`)
through ``spec.resourceClaims``; the resourceclaim controller creates the ResourceClaim (owned by the pod, so
it goes away with it) and kube-scheduler allocates it. The template is owned by the pod too (owner reference
added right after the pod exists, see :func:`owner_reference`). The container gets the worker's argv and env,
the Dagster PostgreSQL password as a ``secretKeyRef`` (never a value) and the pod's name/namespace through the
downward API. The user's ``container_context`` (dagster-k8s ``K8sContainerContext`` fields) is merged the way
dagster-k8s's ``construct_dagster_k8s_job`` merges it: its container and pod spec config pass through, lists
(env, envFrom, volumes, volume mounts, image pull secrets) are concatenated, and what the step needs (name,
command, its env, the claim, ``restartPolicy: Never``, grace period) wins.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from kubernetes import client

from dagster_gpu.contracts import StepLaunch
from dagster_gpu.core.extras import require_extra
from dagster_gpu.k8s.dra import (
    REQUEST_NAME,
    SHARING_STRATEGIES,
    DeviceChoice,
    ManifestError,
    claim_template,
    device_choice,
    is_mig_profile,
)
from dagster_gpu.k8s.handle import PodHandle
from dagster_gpu.k8s.names import (
    ANNOTATION_DEVICE_REQUEST,
    ANNOTATION_PARTITION_KEY,
    ANNOTATION_PLACEMENT_DEVICE,
    ANNOTATION_STEP_KEY,
    ENV_NAMESPACE,
    ENV_POD,
    object_name,
    step_labels,
)

CONTAINER_NAME = "step"

#: The taint GPU node pools commonly carry (GKE and AKS GPU node pools, NVIDIA GPU Operator guides:
#: ``nvidia.com/gpu=present:NoSchedule``); a GPU step tolerates it by default, a CPU-only step does not.
GPU_TAINT_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

#: The worker image's user and group (docker/Dockerfile ``USER 1000:1000``).
WORKER_UID = 1000


def restricted_security_contexts(run_as_user: int | None) -> tuple[dict, dict]:
    """(pod, container) ``securityContext`` (snake_case) that the Pod Security "restricted" profile admits
    (k8s.io/pod-security-admission/policy: check_runAsNonRoot.go, check_allowPrivilegeEscalation.go,
    check_capabilities_restricted.go, check_seccompProfile_restricted.go, check_runAsUser.go): runAsNonRoot,
    seccompProfile RuntimeDefault; no privilege escalation, every capability dropped; ``run_as_user`` (not 0)
    as runAsUser and runAsGroup when given, else the image's numeric USER (the kubelet refuses a
    non-numeric one under runAsNonRoot)."""
    pod: dict[str, Any] = {"run_as_non_root": True, "seccomp_profile": {"type": "RuntimeDefault"}}
    if run_as_user is not None:
        pod.update(run_as_user=run_as_user, run_as_group=run_as_user)
    container = {"allow_privilege_escalation": False, "capabilities": {"drop": ["ALL"]}}
    return pod, container


def _snake(d: Any) -> Any:
    """Keys of a Kubernetes object (camelCase as in YAML, or snake_case) in the client models' snake_case."""
    if isinstance(d, Mapping):
        return {re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), str(k)): _snake(v)
                for k, v in d.items()}
    if isinstance(d, list):
        return [_snake(x) for x in d]
    return d


@dataclass(frozen=True)
class SecretEnv:
    """An environment variable taken from a Secret key (``valueFrom.secretKeyRef``)."""

    env: str
    secret: str
    key: str


#: The label that names a pod's Kueue LocalQueue (kueue.sigs.k8s.io, "Run Plain Pods").
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^(?=.{1,63}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class PodSettings:
    """What the ``kubernetes:`` section of gpu_executor's config says about the objects to create.

    Attributes:
        namespace: namespace of pods and templates.
        image: container image of the step worker (ignored by the test node agent, which runs argv locally).
        secret_env: env vars from Secret keys; by default ``DAGSTER_PG_PASSWORD`` from Secret
            ``dagster-postgresql-secret`` key ``postgresql-password`` (the dagster Helm chart's names).
        container_context: dagster-k8s ``K8sContainerContext`` keyword arguments (``env_vars``,
            ``env_secrets``, ``env_config_maps``, ``volumes``, ``volume_mounts``, ``resources``,
            ``image_pull_policy``, ``labels``, ``service_account_name``, ``security_context``, ``env``...).
        mig_profile: MIG profile used for a ``mig_ok`` request when the placement names no device
            (e.g. ``1g.10gb``), or None to always ask for whole GPUs unless the placement says ``mig-...``.
        sharing_strategy: ``TimeSlicing``, ``MPS`` or None; applied to ``shared_ok`` requests only.
        termination_grace_period_seconds: the pod's ``terminationGracePeriodSeconds``.
        cpu_request, memory_request: the container's resource requests (quantities), or None.
        labels: added to the pod (and claims).
        restricted_security_context: give the pod and the step container the securityContext the Pod Security "restricted"
            profile admits (:func:`restricted_security_contexts`); the user's ``container_context``
            ``security_context`` (container) and ``pod_spec_config.security_context`` override it key by key.
        run_as_user: runAsUser/runAsGroup under ``restricted_security_context`` (default the worker image's 1000; None: the
            image's USER).
        tolerations: the pod's tolerations (Kubernetes shape, camelCase or snake_case), before the
            ``container_context``'s; None: :data:`GPU_TAINT_TOLERATION` for a GPU step, none for a CPU step.
        priority_class_name: the pod's ``priorityClassName`` (a PriorityClass's name, an RFC 1123 subdomain);
            None: the namespace's default priority. A class with ``preemptionPolicy: Never`` and a low value
            (``resources/k8s/manifests/50-batch-priorityclass.yaml``) queues batch steps without ever
            preempting other pods, and lets higher-priority pods preempt them.
        queue_name: a Kueue LocalQueue: the pod gets the label :data:`KUEUE_QUEUE_LABEL` with it (Kueue's pod
            integration admits it from that queue); None: no label.
    """

    namespace: str = "dagster-gpu"
    image: str = "dagster-gpu:latest"
    secret_env: tuple[SecretEnv, ...] = (SecretEnv("DAGSTER_PG_PASSWORD", "dagster-postgresql-secret", "postgresql-password"),)
    container_context: Mapping[str, Any] = field(default_factory=dict)
    mig_profile: str | None = "1g.10gb"
    sharing_strategy: str | None = None
    termination_grace_period_seconds: int = 30
    cpu_request: str | None = "100m"
    memory_request: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    restricted_security_context: bool = True
    run_as_user: int | None = WORKER_UID
    tolerations: tuple[Mapping[str, Any], ...] | None = None
    priority_class_name: str | None = None
    queue_name: str | None = None

    def __post_init__(self):
        if self.priority_class_name is not None and not _DNS_SUBDOMAIN.match(self.priority_class_name):
            raise ManifestError(f"priority_class_name must be a PriorityClass name (lowercase RFC 1123 subdomain, at most "
                                f"253 characters), got {self.priority_class_name!r}")
        if self.queue_name is not None and not (_DNS_LABEL.match(self.queue_name)):
            raise ManifestError(f"queue_name must be a Kueue LocalQueue name (lowercase RFC 1123 label, at most 63 "
                                f"characters), got {self.queue_name!r}")
        if self.run_as_user is not None and (not isinstance(self.run_as_user, int) or self.run_as_user <= 0):
            raise ManifestError(f"run_as_user must be a positive UID (restricted pods may not run as root), got {self.run_as_user!r}")
        if self.sharing_strategy is not None and self.sharing_strategy not in SHARING_STRATEGIES:
            raise ManifestError(f"sharing_strategy must be one of {SHARING_STRATEGIES} or null, got {self.sharing_strategy!r}")
        if self.mig_profile is not None and not is_mig_profile(self.mig_profile):
            raise ManifestError(f"mig_profile must look like '1g.10gb', got {self.mig_profile!r}")
        if self.termination_grace_period_seconds < 0:
            raise ManifestError("termination_grace_period_seconds must be >= 0")


def _container_context_config(settings: PodSettings) -> tuple[dict, dict, dict]:
    """(container config, pod spec config, pod template metadata) of the user's ``container_context``, read by
    dagster-k8s (``K8sContainerContext.create_from_config``: its config schema, then ``run_k8s_config``, whose
    env vars, secrets, volumes, resources... are already folded into snake_case dicts; deep copies).
    Raises ManifestError naming what dagster-k8s rejected, MissingExtra (one line) without the kubernetes
    extra (dagster-k8s, read only for a ``container_context``)."""
    if not settings.container_context:
        return {}, {}, {}
    require_extra("kubernetes", "kubernetes.container_context")
    from dagster_k8s.container_context import K8sContainerContext

    try:
        cc = K8sContainerContext.create_from_config({"k8s": dict(settings.container_context)})
    except Exception as e:  # DagsterInvalidConfigError lists every bad key
        raise ManifestError(f"kubernetes.container_context: {e}") from None
    cfg = cc.run_k8s_config
    return (copy.deepcopy(dict(cfg.container_config)), copy.deepcopy(dict(cfg.pod_spec_config)),
            copy.deepcopy(dict(cfg.pod_template_spec_metadata)))


def _model(klass: type, config: Mapping[str, Any], what: str) -> Any:
    require_extra("kubernetes", "kubernetes.container_context")
    from dagster_k8s.models import k8s_model_from_dict

    try:
        return k8s_model_from_dict(klass, config)
    except Exception as e:  # dagster-k8s raises on unknown keys and malformed values
        raise ManifestError(f"kubernetes.container_context: the merged {what} is not a valid {klass.__name__}: {e}") from None


def build_pod(launch: StepLaunch, settings: PodSettings, name: str, template_name: str | None,
              extra_env: Mapping[str, str] | None = None) -> client.V1Pod:
    """The step's Pod (``restartPolicy: Never``), the user's ``container_context`` merged as dagster-k8s does.

    Merge (after ``construct_dagster_k8s_job``): the user's container and pod spec fields pass through
    (``node_selector``, ``tolerations``, ``security_context``, sidecar ``containers``...); env, envFrom,
    volumes, volume mounts and image pull secrets are concatenated (the step's env first; a user env var
    named like one of the step's or like a Secret reference is dropped); resource requests are the
    settings' overlaid with the user's, limits the user's; the step's own fields win: container name,
    ``command`` (the worker argv; no ``args``), the DRA claim, ``restartPolicy: Never``,
    ``terminationGracePeriodSeconds``, ``enableServiceLinks: false``, and the service account token is
    mounted only for a named ServiceAccount. Security: the Pod Security "restricted" defaults
    (:func:`restricted_security_contexts`, unless ``settings.restricted_security_context`` is False) overlaid key by key with
    the user's container and pod ``security_context``; tolerations: ``settings.tolerations`` (default: the
    GPU taint for a GPU step) then the user's. Labels: the user's, ``labels``, then the step's. The
    container's ``terminationMessagePolicy`` is ``FallbackToLogsOnError`` unless the user's sets one, so a
    failed worker's last log lines are its termination message, readable after the pod is gone.

    Args:
        launch: the step (argv, env without secrets, request, run/step/partition for labels).
        settings: see :class:`PodSettings`.
        name: the pod name (:func:`~dagster_gpu.k8s.names.object_name`).
        template_name: the ResourceClaimTemplate to claim a device from, or None for a CPU-only step.
        extra_env: more plain env vars (no secrets).
    Raises ManifestError when ``launch.env`` sets a variable that is configured as a Secret reference
    (a secret would otherwise appear in clear text in the pod spec), or when the merged container or pod
    spec is not valid.
    """
    secret_names = {s.env for s in settings.secret_env}
    clash = secret_names & set(launch.env)
    if clash:
        raise ManifestError(f"env {sorted(clash)} would be set in clear text but are configured as Secret references")
    container_cfg, pod_spec_cfg, pod_meta = _container_context_config(settings)

    step_env: list[dict[str, Any]] = [{"name": k, "value": str(v)} for k, v in {**launch.env, **(extra_env or {})}.items()]
    step_env += [{"name": ENV_POD, "value_from": {"field_ref": {"field_path": "metadata.name"}}},
                 {"name": ENV_NAMESPACE, "value_from": {"field_ref": {"field_path": "metadata.namespace"}}}]
    step_env += [{"name": s.env, "value_from": {"secret_key_ref": {"name": s.secret, "key": s.key}}} for s in settings.secret_env]
    taken = {e["name"] for e in step_env}
    user_env = [e for e in container_cfg.pop("env", None) or [] if (e.get("name") if isinstance(e, Mapping) else None) not in taken]

    user_resources = container_cfg.pop("resources", None) or {}
    requests = {k: v for k, v in (("cpu", settings.cpu_request), ("memory", settings.memory_request)) if v}
    resources = {
        "requests": {**requests, **(user_resources.get("requests") or {})} or None,
        "limits": user_resources.get("limits") or None,
        "claims": [{"name": REQUEST_NAME}] if template_name else None,
    }
    container_cfg.pop("args", None)
    pod_sc, container_sc = restricted_security_contexts(settings.run_as_user) if settings.restricted_security_context else ({}, {})
    container_sc = {**container_sc, **dict(container_cfg.pop("security_context", None) or {})} or None
    pod_sc = {**pod_sc, **dict(pod_spec_cfg.pop("security_context", None) or {})} or None
    tolerations = [_snake(dict(t)) for t in (settings.tolerations if settings.tolerations is not None
                                             else ((GPU_TAINT_TOLERATION,) if template_name else ()))]
    tolerations += list(pod_spec_cfg.pop("tolerations", None) or [])
    container = _model(client.V1Container, {
        **container_cfg,
        "name": CONTAINER_NAME,
        "image": container_cfg.get("image") or settings.image,
        "command": list(launch.argv),
        "env": step_env + user_env,
        "env_from": container_cfg.get("env_from") or None,
        "volume_mounts": container_cfg.get("volume_mounts") or None,
        "resources": resources,
        "security_context": container_sc,
        "termination_message_policy": container_cfg.get("termination_message_policy") or "FallbackToLogsOnError",
    }, "container")

    labels = {**dict(pod_meta.pop("labels", None) or {}), **dict(settings.labels), **step_labels(launch)}
    if settings.queue_name:
        labels[KUEUE_QUEUE_LABEL] = settings.queue_name
    annotations = {**dict(pod_meta.pop("annotations", None) or {}), ANNOTATION_STEP_KEY: launch.step_key}
    if launch.placement.device:
        annotations[ANNOTATION_PLACEMENT_DEVICE] = launch.placement.device
    if len(launch.partition_keys) == 1:  # the key as it is (a ranged run's keys: the partition label's hash)
        annotations[ANNOTATION_PARTITION_KEY] = launch.partition_keys[0]
    # Only a named ServiceAccount's token is mounted (the worker reads its own pod and ResourceClaim with
    # it: resources/k8s/manifests/43-worker-rbac.yaml); the namespace's default account gets none.
    service_account = pod_spec_cfg.pop("service_account_name", None)
    pod_spec_cfg.pop("automount_service_account_token", None)
    sidecars = [_model(client.V1Container, c, "sidecar container") if isinstance(c, Mapping) else c
                for c in pod_spec_cfg.pop("containers", None) or []]
    spec = _model(client.V1PodSpec, {
        **pod_spec_cfg,
        "restart_policy": "Never",
        "termination_grace_period_seconds": settings.termination_grace_period_seconds,
        "priority_class_name": pod_spec_cfg.get("priority_class_name") or settings.priority_class_name,
        "automount_service_account_token": bool(service_account),
        "enable_service_links": False,
        "service_account_name": service_account,
        "image_pull_secrets": pod_spec_cfg.get("image_pull_secrets") or None,
        "volumes": pod_spec_cfg.get("volumes") or None,
        "security_context": pod_sc,
        "tolerations": tolerations or None,
        "containers": [],
        "resource_claims": [{"name": REQUEST_NAME, "resource_claim_template_name": template_name}] if template_name else None,
    }, "pod spec")
    spec.containers = [container, *sidecars]
    return client.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=client.V1ObjectMeta(name=name, namespace=settings.namespace, labels=labels, annotations=annotations),
        spec=spec,
    )


def owner_reference(pod_name: str, pod_uid: str) -> dict:
    """The ownerReferences patch that makes a template (or any object) go away with its pod.

    ``blockOwnerDeletion`` is left unset: setting it needs the ``pods/finalizers`` permission, which the
    executor's Role does not grant.
    """
    return {"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid}]}}


def step_objects(launch: StepLaunch, settings: PodSettings, shared: bool | None = None,
                 ) -> tuple[client.V1Pod, client.V1ResourceClaimTemplate | None, DeviceChoice | None]:
    """(pod, template or None, device choice or None) for ``launch``; names from :func:`object_name`.

    ``shared``: whether the claim may carry the sharing config (:func:`device_choice`); None takes
    ``launch.placement.shared``."""
    name = object_name(launch.run_id, launch.step_key, launch.attempt, launch.preemptions)
    shared = launch.placement.shared if shared is None else shared
    choice = device_choice(launch.request, launch.placement.device, settings, launch.placement.product, shared)
    labels = {**dict(settings.labels), **step_labels(launch)}
    template = None
    if choice is not None:
        template = claim_template(name, settings.namespace, labels, choice,
                                  {ANNOTATION_DEVICE_REQUEST: json.dumps(choice.to_json(), sort_keys=True)})
    pod = build_pod(launch, settings, name, name if template is not None else None)
    if choice is not None:
        pod.metadata.annotations[ANNOTATION_DEVICE_REQUEST] = json.dumps(choice.to_json(), sort_keys=True)
    return pod, template, choice


def handle_from_pod(pod: client.V1Pod) -> PodHandle:
    """The handle of a pod this library created (labels + annotations), for a process that did not launch it
    (settling pods whose orchestrator went away)."""
    ann = pod.metadata.annotations or {}
    req = json.loads(ann.get(ANNOTATION_DEVICE_REQUEST, "null")) or {}
    has_claim = bool(pod.spec.resource_claims)
    return PodHandle(
        namespace=pod.metadata.namespace, pod=pod.metadata.name, pod_uid=pod.metadata.uid,
        template=pod.metadata.name if has_claim else "",
        device_class=req.get("deviceClassName", ""),
        device_type=req.get("deviceType") or ("default" if has_claim else "cpu"),
        device_fraction=float(req.get("deviceFraction", 0.0)) if has_claim else 0.0,
        product=req.get("product") or "",
        sharing=(req.get("sharing") or "") if has_claim else "",
        device_request=ann.get(ANNOTATION_DEVICE_REQUEST, "") if has_claim else "",
        placement_device=ann.get(ANNOTATION_PLACEMENT_DEVICE, ""),
        launched_at=pod.metadata.creation_timestamp.timestamp() if pod.metadata.creation_timestamp else 0.0,
        partition_key=ann.get(ANNOTATION_PARTITION_KEY, ""),
    )


