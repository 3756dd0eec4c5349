"""The DRA side of a step (pure): its device request, the ResourceClaimTemplate, and reading claims back.

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

Objects are built with the kubernetes client's models (``V1ResourceClaimTemplate``,
``V1ExactDeviceRequest``...) for ``resource.k8s.io/v1``; :func:`claim_template_for_version` converts the
serialised template to the ``v1beta2`` shape (same fields) or the ``v1beta1`` shape (request fields
directly on the request) for clusters that serve only those.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from kubernetes import client

from dagster_gpu.billing.ratecard import mig_fraction

if TYPE_CHECKING:
    from dagster_gpu.k8s.pod import K8sSettings
    from dagster_gpu.request import GpuRequest

DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
REQUEST_NAME = "gpu"  # the device request in the template, and the pod's claim name
SHARING_STRATEGIES = ("TimeSlicing", "MPS")
RESOURCE_API_VERSIONS = ("v1", "v1beta2", "v1beta1")  # preference order

_PROFILE = re.compile(r"^\d+g\.\d+gb$")


class ManifestError(ValueError):
    """The request or settings cannot be expressed as a valid Pod/ResourceClaimTemplate; the message says why."""


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
