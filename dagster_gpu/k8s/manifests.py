"""Pod and ResourceClaimTemplate for one step on Kubernetes with DRA (pure: no I/O, no cluster needed).

A step's :class:`~dagster_gpu.request.GpuRequest` becomes one DRA device request named ``gpu``:

* a whole GPU: DeviceClass ``gpu.nvidia.com`` with CEL selectors for the product-name prefix
  (``device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA A100')``) and the minimum memory
  (``device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40960Mi')) >= 0``), ``count`` devices;
* a MIG slice: DeviceClass ``mig.nvidia.com`` with ``profile == '1g.10gb'`` (plus the same product and
  memory selectors), when the placement's device is ``mig-<profile>`` or the request has ``mig_ok`` and
  the settings give a ``mig_profile``;
* a sharing strategy (``TimeSlicing`` or ``MPS``) when the request is ``shared_ok`` and the settings enable
  one: an opaque ``resource.nvidia.com/v1beta1`` ``GpuConfig`` (``MigDeviceConfig`` for MIG) for driver
  ``gpu.nvidia.com``. Note that DRA never gives one device to two claims: the strategy governs how the
  containers that share *this* claim use the device.

The Pod (``restartPolicy: Never``) references the template through ``spec.resourceClaims``; the
resourceclaim controller creates the ResourceClaim (owned by the pod, so it goes away with it) and
kube-scheduler allocates it. The template is owned by the pod too (owner reference added right after the
pod exists, see :func:`owner_reference`). The container gets the worker's argv and env, the Dagster
PostgreSQL password as a ``secretKeyRef`` (never a value), the pod's name/namespace through the downward
API, and dagster-k8s's container config (image pull policy, env, envFrom secrets/config maps, volumes,
volume mounts, resources, security context, labels, service account) from ``container_context``.

Objects are built with the kubernetes client's models (``V1ResourceClaimTemplate``,
``V1ExactDeviceRequest``...) for ``resource.k8s.io/v1``; :func:`claim_template_for_version` converts the
serialised template to the ``v1beta2`` shape (same fields) or the ``v1beta1`` shape (request fields
directly on the request) for clusters that serve only those.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from kubernetes import client

from dagster_gpu.billing.ratecard import mig_fraction
from dagster_gpu.contracts import StepLaunch
from dagster_gpu.request import GpuRequest

DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
REQUEST_NAME = "gpu"  # the device request in the template, and the pod's claim name
CONTAINER_NAME = "step"
SHARING_STRATEGIES = ("TimeSlicing", "MPS")
RESOURCE_API_VERSIONS = ("v1", "v1beta2", "v1beta1")  # preference order

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
#: The rate-card device type the placement chose (the cost policy counts our Pending pods per pool by it).
ANNOTATION_PLACEMENT_DEVICE = "dagster-gpu/placement-device"
MANAGED_BY = "dagster-gpu"
LABEL_RUN_ID = "dagster/run-id"
LABEL_STEP_KEY = "dagster-gpu/step-key"
LABEL_PARTITION = "dagster-gpu/partition"
LABEL_ATTEMPT = "dagster-gpu/attempt"
ANNOTATION_STEP_KEY = "dagster-gpu/step-key"
ANNOTATION_PARTITION_KEY = "dagster-gpu/partition-key"
ANNOTATION_DEVICE_REQUEST = "dagster-gpu/device-request"
ENV_POD = "DAGSTER_GPU_K8S_POD"
ENV_NAMESPACE = "DAGSTER_GPU_K8S_NAMESPACE"

_LABEL_OK = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_PROFILE = re.compile(r"^\d+g\.\d+gb$")


class ManifestError(ValueError):
    """The request or settings cannot be expressed as a valid Pod/ResourceClaimTemplate; the message says why."""


# ---- names and labels ---------------------------------------------------------------------------

def _h(s: str, n: int = 8) -> str:
    return hashlib.sha256(s.encode()).hexdigest()[:n]


def sanitize_label_value(value: str) -> str:
    """A valid label value (<= 63 chars of ``[A-Za-z0-9-_.]``, alphanumeric at both ends) for ``value``.

    A value that is already valid is returned unchanged; any other gets its invalid characters replaced
    by ``-``, is truncated, and ends in ``-<8 hex of sha256(value)>`` so two different keys never collide.
    """
    if len(value) <= 63 and _LABEL_OK.match(value):
        return value
    body = re.sub(r"[^A-Za-z0-9_.-]", "-", value)[:54].strip("-_.")
    return f"{body}-{_h(value)}" if body else _h(value, 16)


def object_name(run_id: str, step_key: str, attempt: int) -> str:
    """Deterministic pod (and template) name for one attempt of one step of one run.

    ``dagster-gpu-<16 hex of sha256(run_id/step_key)>-<attempt>``: at most 47 characters, a valid DNS
    label, stable across orchestrator restarts (a resumed run finds the same pod), distinct per retry.
    """
    return f"dagster-gpu-{_h(f'{run_id}/{step_key}', 16)}-{int(attempt)}"


def step_labels(launch: StepLaunch) -> dict[str, str]:
    """Labels on the pod, its template and the generated ResourceClaim: run id, step key, partition key."""
    labels = {
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_RUN_ID: sanitize_label_value(launch.run_id),
        LABEL_STEP_KEY: sanitize_label_value(launch.step_key),
        LABEL_ATTEMPT: str(int(launch.attempt)),
    }
    if launch.partition_key is not None:
        labels[LABEL_PARTITION] = sanitize_label_value(launch.partition_key)
    return labels


def run_selector(run_id: str) -> str:
    """Label selector for every object of one run (pods, templates, claims)."""
    return f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_RUN_ID}={sanitize_label_value(run_id)}"


# ---- settings -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SecretEnv:
    """An environment variable taken from a Secret key (``valueFrom.secretKeyRef``)."""

    env: str
    secret: str
    key: str


@dataclass(frozen=True)
class K8sSettings:
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
        termination_grace_period_s: the pod's ``terminationGracePeriodSeconds``.
        cpu_request, memory_request: the container's resource requests (quantities), or None.
        extra_labels: added to the pod (and claims).
    """

    namespace: str = "dagster-gpu"
    image: str = "dagster-gpu:latest"
    secret_env: tuple[SecretEnv, ...] = (SecretEnv("DAGSTER_PG_PASSWORD", "dagster-postgresql-secret", "postgresql-password"),)
    container_context: Mapping[str, Any] = field(default_factory=dict)
    mig_profile: str | None = "1g.10gb"
    sharing_strategy: str | None = None
    termination_grace_period_s: int = 30
    cpu_request: str | None = "100m"
    memory_request: str | None = None
    extra_labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if self.sharing_strategy is not None and self.sharing_strategy not in SHARING_STRATEGIES:
            raise ManifestError(f"sharing_strategy must be one of {SHARING_STRATEGIES} or null, got {self.sharing_strategy!r}")
        if self.mig_profile is not None and not _PROFILE.match(self.mig_profile):
            raise ManifestError(f"mig_profile must look like '1g.10gb', got {self.mig_profile!r}")
        if self.termination_grace_period_s < 0:
            raise ManifestError("termination_grace_period_s must be >= 0")


# ---- the device request ----------------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceChoice:
    """The DRA request made for a step.

    Attributes:
        device_class: ``gpu.nvidia.com`` or ``mig.nvidia.com``.
        count: devices (>= 1).
        selectors: CEL expressions, all of which a device must satisfy.
        mig_profile: the MIG profile (``1g.10gb``) for a MIG request, else None.
        sharing: ``TimeSlicing``/``MPS`` or None.
        device_type: the rate-card device type (``mig-1g.10gb``, a product name, or ``default``).
        fraction_per_device: 1.0 for a whole GPU, :func:`mig_fraction` of the profile for MIG.
        product: the GPU product asked for (a MIG slice's parent), from the request or the placement, or
            None (the rate card's ``default`` prices it).
    """

    device_class: str
    count: int
    selectors: tuple[str, ...]
    mig_profile: str | None
    sharing: str | None
    device_type: str
    fraction_per_device: float
    product: str | None = None

    @property
    def device_fraction(self) -> float:
        """Whole-GPU equivalents held by the step: count × fraction per device (1g.10gb -> 1/7)."""
        return self.count * self.fraction_per_device

    def to_json(self) -> dict:
        return {"deviceClassName": self.device_class, "count": self.count, "selectors": list(self.selectors),
                "migProfile": self.mig_profile, "sharing": self.sharing, "deviceFraction": self.device_fraction,
                "deviceType": self.device_type, "product": self.product}


def _cel_string(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def memory_selector(gib: float) -> str:
    """CEL: the device's ``memory`` capacity is at least ``gib`` GiB (rounded up to whole MiB)."""
    if not math.isfinite(gib) or gib < 0:
        raise ManifestError(f"memory_gib must be finite and >= 0, got {gib!r}")
    mib = math.ceil(gib * 1024)
    return f"device.capacity[{_cel_string(DRIVER)}].memory.compareTo(quantity('{mib}Mi')) >= 0"


def product_selector(prefix: str) -> str:
    """CEL: the device's ``productName`` starts with ``prefix`` (``NVIDIA A100`` matches ``NVIDIA A100-SXM4-80GB``)."""
    return f"device.attributes[{_cel_string(DRIVER)}].productName.startsWith({_cel_string(prefix)})"


def profile_selector(profile: str) -> str:
    return f"device.attributes[{_cel_string(DRIVER)}].profile == {_cel_string(profile)}"


def device_choice(request: GpuRequest, placement_device: str | None, settings: K8sSettings,
                  placement_product: str | None = None) -> DeviceChoice | None:
    """The DRA request for ``request`` (None for a CPU-only step, ``count == 0``).

    MIG is used when ``placement_device`` is ``mig-<profile>``, or when the request is ``mig_ok``,
    asks for one device, and ``settings.mig_profile`` is set. ``placement_device`` naming a product
    (``NVIDIA A100-SXM4-80GB``) narrows the product selector when the request has none.
    ``placement_product`` (the policy's product of the chosen pool, a MIG slice's parent) only names the
    product billed (:attr:`DeviceChoice.product`), it adds no selector.
    Raises ManifestError for a malformed MIG device name.
    """
    if request.count <= 0:
        return None
    profile = None
    if placement_device and placement_device.startswith("mig-"):
        profile = placement_device[4:]
        if not _PROFILE.match(profile):
            raise ManifestError(f"placement device {placement_device!r} is not a MIG profile like 'mig-1g.10gb'")
    elif request.mig_ok and request.count == 1 and settings.mig_profile:
        profile = settings.mig_profile
    product = request.product
    if not product and placement_device and not placement_device.startswith("mig-") and placement_device not in ("cpu", "default"):
        product = placement_device
    selectors: list[str] = []
    if profile:
        selectors.append(profile_selector(profile))
    if product:
        selectors.append(product_selector(product))
    if request.memory_gib is not None:
        selectors.append(memory_selector(request.memory_gib))
    sharing = settings.sharing_strategy if request.shared_ok else None
    billed = product or (placement_product if placement_product not in (None, "", "cpu", "default") else None)
    if profile:
        return DeviceChoice(MIG_CLASS, request.count, tuple(selectors), profile, sharing, f"mig-{profile}",
                            mig_fraction(profile), billed)
    return DeviceChoice(GPU_CLASS, request.count, tuple(selectors), None, sharing, product or "default", 1.0, billed)


def _opaque_config(choice: DeviceChoice) -> client.V1DeviceClaimConfiguration | None:
    if not choice.sharing:
        return None
    if choice.mig_profile:
        params = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
                  "sharing": {"strategy": choice.sharing}}
    else:
        sharing: dict[str, Any] = {"strategy": choice.sharing}
        if choice.sharing == "TimeSlicing":
            sharing["timeSlicingConfig"] = {"interval": "Default"}
        params = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}
    return client.V1DeviceClaimConfiguration(
        requests=[REQUEST_NAME],
        opaque=client.V1OpaqueDeviceConfiguration(driver=DRIVER, parameters=params),
    )


def claim_template(name: str, namespace: str, labels: Mapping[str, str], choice: DeviceChoice,
                   annotations: Mapping[str, str] | None = None) -> client.V1ResourceClaimTemplate:
    """A ``resource.k8s.io/v1`` ResourceClaimTemplate with one ``exactly`` request named ``gpu``.

    ``labels`` go on the template and (through ``spec.metadata``) on every claim generated from it.
    """
    exact = client.V1ExactDeviceRequest(
        device_class_name=choice.device_class,
        allocation_mode="ExactCount",
        count=choice.count,
        selectors=[client.V1DeviceSelector(cel=client.V1CELDeviceSelector(expression=e)) for e in choice.selectors] or None,
    )
    cfg = _opaque_config(choice)
    return client.V1ResourceClaimTemplate(
        api_version="resource.k8s.io/v1",
        kind="ResourceClaimTemplate",
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=dict(labels),
                                     annotations=dict(annotations or {}) or None),
        spec=client.V1ResourceClaimTemplateSpec(
            metadata=client.V1ObjectMeta(labels=dict(labels), annotations=dict(annotations or {}) or None),
            spec=client.V1ResourceClaimSpec(
                devices=client.V1DeviceClaim(
                    requests=[client.V1DeviceRequest(name=REQUEST_NAME, exactly=exact)],
                    config=[cfg] if cfg else None,
                )
            ),
        ),
    )


def to_dict(obj: Any) -> dict:
    """camelCase JSON-ready dict of a kubernetes model (as the API server receives it)."""
    return client.ApiClient().sanitize_for_serialization(obj)


def claim_template_for_version(template: dict, version: str) -> dict:
    """Convert a serialised v1 template (see :func:`to_dict`) to ``resource.k8s.io/<version>``.

    ``v1`` and ``v1beta2`` share the shape; ``v1beta1`` has no ``exactly``: its fields sit on the request.
    Raises ManifestError for any other version.
    """
    if version not in RESOURCE_API_VERSIONS:
        raise ManifestError(f"unsupported resource.k8s.io version {version!r}; expected one of {RESOURCE_API_VERSIONS}")
    t = json.loads(json.dumps(template))
    t["apiVersion"] = f"resource.k8s.io/{version}"
    if version == "v1beta1":
        for r in t["spec"]["spec"]["devices"]["requests"]:
            exact = r.pop("exactly", None) or {}
            r.update(exact)
    return t


# ---- the pod --------------------------------------------------------------------------------------

def _container_context_config(settings: K8sSettings):
    """(container_config, pod_spec_config, pod labels) from dagster-k8s's K8sContainerContext (snake_case)."""
    if not settings.container_context:
        return {}, {}, {}
    from dagster_k8s.container_context import K8sContainerContext

    try:
        cc = K8sContainerContext(**dict(settings.container_context))
    except TypeError as e:
        raise ManifestError(f"kubernetes.container_context: {e}") from None
    cfg = cc.run_k8s_config
    return dict(cfg.container_config), dict(cfg.pod_spec_config), dict(cfg.pod_template_spec_metadata.get("labels", {}))


def build_pod(launch: StepLaunch, settings: K8sSettings, name: str, template_name: str | None,
              extra_env: Mapping[str, str] | None = None) -> client.V1Pod:
    """The step's Pod (``restartPolicy: Never``).

    Args:
        launch: the step (argv, env without secrets, request, run/step/partition for labels).
        settings: see :class:`K8sSettings`.
        name: the pod name (:func:`object_name`).
        template_name: the ResourceClaimTemplate to claim a device from, or None for a CPU-only step.
        extra_env: more plain env vars (no secrets).
    Raises ManifestError when ``launch.env`` sets a variable that is configured as a Secret reference
    (a secret would otherwise appear in clear text in the pod spec).
    """
    from dagster_k8s.models import k8s_model_from_dict

    secret_names = {s.env for s in settings.secret_env}
    clash = secret_names & set(launch.env)
    if clash:
        raise ManifestError(f"env {sorted(clash)} would be set in clear text but are configured as Secret references")
    container_cfg, pod_spec_cfg, cc_labels = _container_context_config(settings)

    env: list[client.V1EnvVar] = [client.V1EnvVar(name=k, value=str(v)) for k, v in {**launch.env, **(extra_env or {})}.items()]
    env += [
        client.V1EnvVar(name=ENV_POD, value_from=client.V1EnvVarSource(
            field_ref=client.V1ObjectFieldSelector(field_path="metadata.name"))),
        client.V1EnvVar(name=ENV_NAMESPACE, value_from=client.V1EnvVarSource(
            field_ref=client.V1ObjectFieldSelector(field_path="metadata.namespace"))),
    ]
    env += [client.V1EnvVar(name=s.env, value_from=client.V1EnvVarSource(
        secret_key_ref=client.V1SecretKeySelector(name=s.secret, key=s.key))) for s in settings.secret_env]
    user_env = [k8s_model_from_dict(client.V1EnvVar, e) for e in container_cfg.pop("env", [])]
    env += [e for e in user_env if e.name not in secret_names and e.name not in launch.env]

    requests = {k: v for k, v in (("cpu", settings.cpu_request), ("memory", settings.memory_request)) if v}
    user_resources = container_cfg.pop("resources", None) or {}
    resources = client.V1ResourceRequirements(
        requests={**requests, **(user_resources.get("requests") or {})} or None,
        limits=user_resources.get("limits") or None,
        claims=[client.CoreV1ResourceClaim(name=REQUEST_NAME)] if template_name else None,
    )
    container = client.V1Container(
        name=CONTAINER_NAME,
        image=settings.image,
        command=list(launch.argv),
        env=env,
        env_from=[k8s_model_from_dict(client.V1EnvFromSource, e) for e in container_cfg.pop("env_from", [])] or None,
        resources=resources,
        image_pull_policy=container_cfg.pop("image_pull_policy", None),
        volume_mounts=[k8s_model_from_dict(client.V1VolumeMount, m) for m in container_cfg.pop("volume_mounts", [])] or None,
        security_context=(k8s_model_from_dict(client.V1SecurityContext, container_cfg.pop("security_context"))
                          if container_cfg.get("security_context") else None),
    )
    container_cfg.pop("security_context", None)
    if container_cfg:
        raise ManifestError(f"kubernetes.container_context: unsupported container fields {sorted(container_cfg)}")

    labels = {**cc_labels, **dict(settings.extra_labels), **step_labels(launch)}
    annotations = {ANNOTATION_STEP_KEY: launch.step_key}
    if launch.placement.device:
        annotations[ANNOTATION_PLACEMENT_DEVICE] = launch.placement.device
    if launch.partition_key is not None:
        annotations[ANNOTATION_PARTITION_KEY] = launch.partition_key
    # Only a named ServiceAccount's token is mounted (the worker reads its own pod and ResourceClaim with
    # it: resources/k8s/manifests/43-worker-rbac.yaml); the namespace's default account gets none.
    service_account = pod_spec_cfg.pop("service_account_name", None)
    spec = client.V1PodSpec(
        restart_policy="Never",
        termination_grace_period_seconds=settings.termination_grace_period_s,
        automount_service_account_token=bool(service_account),
        enable_service_links=False,
        service_account_name=service_account,
        image_pull_secrets=[k8s_model_from_dict(client.V1LocalObjectReference, s)
                            for s in pod_spec_cfg.pop("image_pull_secrets", [])] or None,
        volumes=[k8s_model_from_dict(client.V1Volume, v) for v in pod_spec_cfg.pop("volumes", [])] or None,
        scheduler_name=pod_spec_cfg.pop("scheduler_name", None),
        containers=[container],
        resource_claims=[client.V1PodResourceClaim(name=REQUEST_NAME, resource_claim_template_name=template_name)]
        if template_name else None,
    )
    if pod_spec_cfg:
        raise ManifestError(f"kubernetes.container_context: unsupported pod spec fields {sorted(pod_spec_cfg)}")
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


def step_objects(launch: StepLaunch, settings: K8sSettings) -> tuple[client.V1Pod, client.V1ResourceClaimTemplate | None, DeviceChoice | None]:
    """(pod, template or None, device choice or None) for ``launch``; names from :func:`object_name`."""
    name = object_name(launch.run_id, launch.step_key, launch.attempt)
    choice = device_choice(launch.request, launch.placement.device, settings, launch.placement.product)
    labels = {**dict(settings.extra_labels), **step_labels(launch)}
    template = None
    if choice is not None:
        template = claim_template(name, settings.namespace, labels, choice,
                                  {ANNOTATION_DEVICE_REQUEST: json.dumps(choice.to_json(), sort_keys=True)})
    pod = build_pod(launch, settings, name, name if template is not None else None)
    if choice is not None:
        pod.metadata.annotations[ANNOTATION_DEVICE_REQUEST] = json.dumps(choice.to_json(), sort_keys=True)
    return pod, template, choice


def handle_from_pod(pod: client.V1Pod) -> dict[str, Any]:
    """The backend handle of a pod this library created (labels + annotations), for a process that did not
    launch it (finalizing pods whose orchestrator went away)."""
    ann = pod.metadata.annotations or {}
    req = json.loads(ann.get(ANNOTATION_DEVICE_REQUEST, "null")) or {}
    has_claim = bool(pod.spec.resource_claims)
    fraction = float(req.get("deviceFraction", 0.0)) if has_claim else 0.0
    device_type = req.get("deviceType") or ("default" if has_claim else "cpu")
    return {
        "namespace": pod.metadata.namespace,
        "pod": pod.metadata.name,
        "pod_uid": pod.metadata.uid,
        "template": pod.metadata.name if has_claim else "",
        "device_class": req.get("deviceClassName", ""),
        "device_type": device_type,
        "device_fraction": fraction,
        "product": req.get("product") or "",
        "launched_at": pod.metadata.creation_timestamp.timestamp() if pod.metadata.creation_timestamp else 0.0,
        "partition_key": ann.get(ANNOTATION_PARTITION_KEY, ""),
    }


def generated_claim_name(pod: Any) -> str | None:
    """Name of the ResourceClaim the resourceclaim controller generated for a step pod's GPU request
    (``status.resourceClaimStatuses`` entry named REQUEST_NAME), or None before it exists. ``pod``: V1Pod."""
    return next((s.resource_claim_name for s in pod.status.resource_claim_statuses or []
                 if s.name == REQUEST_NAME and s.resource_claim_name), None)


def allocated_devices(claim: Mapping[str, Any] | Any) -> list[str]:
    """``driver/pool/device`` of each device in a claim's ``status.allocation`` (empty if unallocated).

    Accepts a kubernetes model (``ResourceV1ResourceClaim``) or a camelCase dict.
    """
    d = claim if isinstance(claim, Mapping) else to_dict(claim)
    results = (((d.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return [f"{r['driver']}/{r['pool']}/{r['device']}" for r in results]


def served_version(group_versions: Sequence[str]) -> str:
    """The resource.k8s.io version to use given the served ``group/version`` strings (v1 > v1beta2 > v1beta1).

    Raises ManifestError when none is served (DRA disabled on the cluster).
    """
    served = {gv.split("/", 1)[1] for gv in group_versions if gv.startswith("resource.k8s.io/")}
    for v in RESOURCE_API_VERSIONS:
        if v in served:
            return v
    raise ManifestError(f"the cluster serves no usable resource.k8s.io version (served: {sorted(served) or 'none'}); "
                        "DRA needs Kubernetes >= 1.32 with resource.k8s.io v1, v1beta2 or v1beta1 enabled")
