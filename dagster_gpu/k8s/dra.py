"""The DRA side of a step (pure): its device request, the ResourceClaimTemplate, and reading claims back.

A step's :class:`~dagster_gpu.core.request.GpuRequest` becomes one DRA device request named ``gpu``:

* a whole GPU: DeviceClass ``gpu.nvidia.com`` with CEL selectors for the product-name prefix
  (``device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA A100')``) and the minimum memory
  (``device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('76185Mi')) >= 0`` for ``memory_gib: 80``:
  the marketed-size rule of :mod:`dagster_gpu.core.device_memory`), ``count`` devices;
* a MIG slice: DeviceClass ``mig.nvidia.com`` with ``profile == '1g.10gb'`` plus the same product and
  memory selectors, the memory judged against the slice's own capacity (a 1g.10gb slice publishes 9728Mi);
* the request follows the policy's placement exactly: a ``mig-<profile>`` placement asks for that slice, a
  product placement (a whole-GPU pool) for a whole GPU. Without a placement device (a forced backend), a
  ``mig_ok`` count-1 request with ``settings.mig_profile`` set becomes a ``firstAvailable`` request
  (DRAPrioritizedList, beta and on by default in Kubernetes 1.34): subrequest ``mig`` (the slice, when its
  profile can hold the memory asked for) else subrequest ``gpu`` (a whole GPU). The scheduler records which
  one it allocated in ``status.allocation.devices.results[].request`` (``gpu/mig`` or ``gpu/gpu``;
  :meth:`DeviceChoice.resolve`);
* a sharing strategy (``TimeSlicing`` or ``MPS``) when the request is ``shared_ok`` and the settings enable
  one: an opaque ``resource.nvidia.com/v1beta1`` ``GpuConfig`` (``MigDeviceConfig`` for MIG) for driver
  ``gpu.nvidia.com``. Note that DRA never gives one device to two claims: the strategy governs how the
  containers that share *this* claim use the device.

Request shapes: kubernetes/api v0.34.0 ``resource/v1/types.go`` (``DeviceRequest``: exactly one of
``exactly`` / ``firstAvailable``; ``DeviceSubRequest``: name, deviceClassName, selectors, allocationMode,
count; at most 8 subrequests; config and results name a subrequest ``<request>/<subrequest>``).

Objects are built with the kubernetes client's models (``V1ResourceClaimTemplate``,
``V1ExactDeviceRequest``...) for ``resource.k8s.io/v1``; :func:`claim_template_for_version` converts the
serialised template to the ``v1beta2`` shape (same fields) or the ``v1beta1`` shape (request fields
directly on the request) for clusters that serve only those.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol, Sequence

from kubernetes import client

from dagster_gpu.billing.ratecard import mig_fraction
from dagster_gpu.core.device_memory import min_memory_mib

if TYPE_CHECKING:
    from dagster_gpu.core.request import GpuRequest

DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
REQUEST_NAME = "gpu"  # the device request in the template, and the pod's claim name
SHARING_STRATEGIES = ("TimeSlicing", "MPS")
RESOURCE_API_VERSIONS = ("v1", "v1beta2", "v1beta1")  # preference order

#: a MIG profile name as the driver publishes it (``1g.10gb``, ``3g.40gb``): ``<slices>g.<GB>gb``
MIG_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb$")
MIG_SUBREQUEST = "mig"  # firstAvailable subrequest names (results[].request is "gpu/mig" or "gpu/gpu")
GPU_SUBREQUEST = "gpu"


def is_mig_profile(name: str) -> bool:
    """Whether ``name`` looks like a MIG profile (``1g.10gb``)."""
    return bool(MIG_PROFILE.match(name))


class DeviceSettings(Protocol):
    """What :func:`device_choice` reads of the backend's settings (``dagster_gpu.k8s.pod.PodSettings``
    has them): the MIG profile for ``mig_ok`` requests (None: whole GPUs only), the sharing strategy
    (``TimeSlicing``/``MPS``, None: no sharing config) and the Kueue LocalQueue (None: not queued)."""

    mig_profile: str | None
    sharing_strategy: str | None
    queue_name: str | None


def mig_device_class(profile: str) -> str:
    """The DeviceClass of one MIG profile, for a claim Kueue admits: ``1g.10gb`` -> ``1g.10gb.mig.nvidia.com``.

    Kueue v0.17.0 quotas DRA devices by DeviceClass only (``pkg/dra/claims.go`` ``countDevicesPerClass``: a
    claim with CEL selectors is refused, "CEL selectors are not supported"), so the profile is chosen by the
    class (its own selector, ``resources/k8s/manifests/21-deviceclass-mig-profiles.yaml``) and mapped to a
    Kueue resource (``resources.deviceClassMappings``) that a ResourceFlavor's quota counts.
    """
    if not MIG_PROFILE.match(profile):
        raise ManifestError(f"{profile!r} is not a MIG profile like '1g.10gb'")
    return f"{profile}.{MIG_CLASS}"


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
        alternatives: for a ``firstAvailable`` request, its subrequests in order of preference (each a
            DeviceChoice with ``subrequest`` set: the MIG slice, then the whole GPU); the other fields are then
            the slice's (what the scheduler allocates whenever one is free) until :meth:`resolve` names the one
            the claim was allocated (``status.allocation.devices.results[].request``). Empty for an ``exactly``
            request.
        subrequest: this alternative's subrequest name (``mig``/``gpu``), None for the request itself.
    """

    device_class: str
    count: int
    selectors: tuple[str, ...]
    mig_profile: str | None
    sharing: str | None
    device_type: str
    fraction_per_device: float
    product: str | None = None
    alternatives: tuple["DeviceChoice", ...] = ()
    subrequest: str | None = None

    def resolve(self, allocated_request: str | None) -> "DeviceChoice":
        """The alternative a claim was allocated: ``allocated_request`` is a result's ``request``
        (``gpu/mig``); self for an ``exactly`` request or an unknown/None name."""
        name = (allocated_request or "").partition("/")[2]
        return next((a for a in self.alternatives if a.subrequest == name), self)

    @property
    def device_fraction(self) -> float:
        """Whole-GPU equivalents held by the step: count × fraction per device (1g.10gb -> 1/7)."""
        return self.count * self.fraction_per_device

    def to_json(self) -> dict:
        out = {"deviceClassName": self.device_class, "count": self.count, "selectors": list(self.selectors),
               "migProfile": self.mig_profile, "sharing": self.sharing, "deviceFraction": self.device_fraction,
               "deviceType": self.device_type, "product": self.product}
        if self.subrequest:
            out["subrequest"] = self.subrequest
        if self.alternatives:
            out["firstAvailable"] = [a.to_json() for a in self.alternatives]
        return out


def _cel_string(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def memory_selector(gib: float) -> str:
    """CEL: the device's ``memory`` capacity satisfies ``memory_gib: gib`` by the marketed-size rule
    (:func:`dagster_gpu.core.device_memory.min_memory_mib`: at least 93 % of ``gib`` GiB, so an "80GB" H100's
    81559Mi matches 80). Raises ManifestError for a negative or non-finite ``gib``."""
    try:
        mib = min_memory_mib(gib)
    except ValueError as e:
        raise ManifestError(str(e)) from None
    return f"device.capacity[{_cel_string(DRIVER)}].memory.compareTo(quantity('{mib}Mi')) >= 0"


def product_selector(prefix: str) -> str:
    """CEL: the device's ``productName`` starts with ``prefix`` (``NVIDIA A100`` matches ``NVIDIA A100-SXM4-80GB``)."""
    return f"device.attributes[{_cel_string(DRIVER)}].productName.startsWith({_cel_string(prefix)})"


def profile_selector(profile: str) -> str:
    return f"device.attributes[{_cel_string(DRIVER)}].profile == {_cel_string(profile)}"


def _profile_gib(profile: str) -> int:
    """The marketed memory of a MIG profile, from its name (``1g.10gb`` -> 10)."""
    return int(MIG_PROFILE.match(profile).group(2))


def device_choice(request: GpuRequest, placement_device: str | None, settings: DeviceSettings,
                  placement_product: str | None = None, shared: bool | None = None) -> DeviceChoice | None:
    """The DRA request for ``request`` (None for a CPU-only step, ``count == 0``).

    ``placement_device`` is the policy's pool: ``mig-<profile>`` asks for that MIG slice; a product name
    (``NVIDIA A100-SXM4-80GB``) asks for a whole GPU and narrows the product selector when the request has
    none. With no placement device (None, ``default``, ``cpu``), a ``mig_ok`` request for one device with
    ``settings.mig_profile`` set gets ``alternatives`` (``firstAvailable``): the slice first, when the
    profile's marketed memory holds ``memory_gib``, else a whole GPU; any other request a whole GPU.
    ``placement_product`` (the policy's product of the chosen pool, a MIG slice's parent) only names the
    product billed (:attr:`DeviceChoice.product`), it adds no selector. ``shared`` is the placement's
    :attr:`~dagster_gpu.policy.placement.Placement.shared`: False drops the sharing config (a shared claim
    failed to prepare on that pool); None or True leave it to ``request.shared_ok`` and
    ``settings.sharing_strategy``.
    Queued (``settings.queue_name`` set, a Kueue workload): the request is one ``exactly`` request for
    one DeviceClass and a count, nothing else, because Kueue v0.17.0 refuses a claim with ``firstAvailable``,
    CEL selectors or device config (``pkg/dra/claims.go`` ``countDevicesPerClass``): a MIG slice is asked by
    its profile's class (:func:`mig_device_class`), a whole GPU by ``gpu.nvidia.com``; without a placement
    device a ``mig_ok`` request takes the slice (the first preference of the unqueued ``firstAvailable``);
    no sharing config. Which product and memory the device has is then the queue's ResourceFlavor's
    business (one flavor per placement); ``product`` still names what is billed.
    Raises ManifestError for a malformed MIG device name.
    """
    if request.count <= 0:
        return None
    if settings.queue_name:
        return _queued_choice(request, placement_device, settings, placement_product)
    placed = placement_device if placement_device not in (None, "", "cpu", "default") else None
    sharing = settings.sharing_strategy if request.shared_ok and shared is not False else None
    billed_product = placement_product if placement_product not in (None, "", "cpu", "default") else None
    if placed and placed.startswith("mig-"):
        profile = placed[4:]
        if not MIG_PROFILE.match(profile):
            raise ManifestError(f"placement device {placed!r} is not a MIG profile like 'mig-1g.10gb'")
        return _mig_choice(request, profile, sharing, billed_product)
    product = request.product or placed
    gpu = _gpu_choice(request, product, sharing, billed_product)
    profile = settings.mig_profile
    if placed or not (request.mig_ok and request.count == 1 and profile):
        return gpu
    if request.memory_gib is not None and _profile_gib(profile) < request.memory_gib:
        return gpu  # the slice cannot hold it: no point offering it
    mig = replace(_mig_choice(request, profile, sharing, billed_product), subrequest=MIG_SUBREQUEST)
    return replace(mig, subrequest=None, alternatives=(mig, replace(gpu, subrequest=GPU_SUBREQUEST)))


def _queued_choice(request: GpuRequest, placement_device: str | None, settings: DeviceSettings,
                   placement_product: str | None) -> DeviceChoice:
    """The ``exactly`` request of a Kueue workload (:func:`device_choice`): a class and a count only."""
    choice = device_choice(request, placement_device, _Unqueued(settings.mig_profile), placement_product, shared=False)
    if choice.alternatives:
        choice = choice.alternatives[0]
    device_class = mig_device_class(choice.mig_profile) if choice.mig_profile else choice.device_class
    return replace(choice, device_class=device_class, selectors=(), sharing=None, subrequest=None, alternatives=())


@dataclass(frozen=True)
class _Unqueued:
    """The :class:`DeviceSettings` of the same request without a queue and without sharing."""

    mig_profile: str | None
    sharing_strategy: str | None = None
    queue_name: str | None = None


def _selectors(request: GpuRequest, product: str | None, profile: str | None = None) -> tuple[str, ...]:
    out = [profile_selector(profile)] if profile else []
    if product:
        out.append(product_selector(product))
    if request.memory_gib is not None:
        out.append(memory_selector(request.memory_gib))
    return tuple(out)


def _mig_choice(request: GpuRequest, profile: str, sharing: str | None, billed_product: str | None) -> DeviceChoice:
    return DeviceChoice(MIG_CLASS, request.count, _selectors(request, request.product, profile), profile, sharing,
                        f"mig-{profile}", mig_fraction(profile, request.product or billed_product),
                        request.product or billed_product)


def _gpu_choice(request: GpuRequest, product: str | None, sharing: str | None, billed_product: str | None) -> DeviceChoice:
    return DeviceChoice(GPU_CLASS, request.count, _selectors(request, product), None, sharing, product or "default",
                        1.0, product or billed_product)


def _opaque_config(choice: DeviceChoice, request: str) -> client.V1DeviceClaimConfiguration | None:
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
        requests=[request],
        opaque=client.V1OpaqueDeviceConfiguration(driver=DRIVER, parameters=params),
    )


def _cel(selectors: Sequence[str]) -> list[client.V1DeviceSelector] | None:
    return [client.V1DeviceSelector(cel=client.V1CELDeviceSelector(expression=e)) for e in selectors] or None


def device_request(choice: DeviceChoice) -> tuple[client.V1DeviceRequest, list[client.V1DeviceClaimConfiguration]]:
    """The ``gpu`` DeviceRequest for ``choice`` (``exactly``, or ``firstAvailable`` with one
    DeviceSubRequest per alternative) and its opaque configs (a subrequest's config names it
    ``gpu/<subrequest>``)."""
    if not choice.alternatives:
        exact = client.V1ExactDeviceRequest(device_class_name=choice.device_class, allocation_mode="ExactCount",
                                            count=choice.count, selectors=_cel(choice.selectors))
        cfg = _opaque_config(choice, REQUEST_NAME)
        return client.V1DeviceRequest(name=REQUEST_NAME, exactly=exact), [cfg] if cfg else []
    subs, cfgs = [], []
    for alt in choice.alternatives:
        subs.append(client.V1DeviceSubRequest(name=alt.subrequest, device_class_name=alt.device_class,
                                              allocation_mode="ExactCount", count=alt.count,
                                              selectors=_cel(alt.selectors)))
        cfg = _opaque_config(alt, f"{REQUEST_NAME}/{alt.subrequest}")
        if cfg:
            cfgs.append(cfg)
    return client.V1DeviceRequest(name=REQUEST_NAME, first_available=subs), cfgs


def claim_template(name: str, namespace: str, labels: Mapping[str, str], choice: DeviceChoice,
                   annotations: Mapping[str, str] | None = None) -> client.V1ResourceClaimTemplate:
    """A ``resource.k8s.io/v1`` ResourceClaimTemplate with one request named ``gpu`` (:func:`device_request`).

    ``labels`` go on the template and (through ``spec.metadata``) on every claim generated from it.
    """
    request, cfgs = device_request(choice)
    return client.V1ResourceClaimTemplate(
        api_version="resource.k8s.io/v1",
        kind="ResourceClaimTemplate",
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=dict(labels),
                                     annotations=dict(annotations or {}) or None),
        spec=client.V1ResourceClaimTemplateSpec(
            metadata=client.V1ObjectMeta(labels=dict(labels), annotations=dict(annotations or {}) or None),
            spec=client.V1ResourceClaimSpec(devices=client.V1DeviceClaim(requests=[request], config=cfgs or None)),
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


def allocated_requests(claim: Mapping[str, Any] | Any) -> list[str]:
    """The ``request`` of each result in a claim's ``status.allocation`` (empty if unallocated): ``gpu``, or
    ``gpu/<subrequest>`` for a firstAvailable request (kubernetes/api ``resource/v1`` types.go,
    ``DeviceRequestAllocationResult.Request``: "<main request>/<subrequest>"), what :meth:`DeviceChoice.resolve`
    takes. Accepts a kubernetes model or a camelCase dict."""
    d = claim if isinstance(claim, Mapping) else to_dict(claim)
    results = (((d.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return [str(r.get("request") or "") for r in results]


def choice_from_json(d: Mapping[str, Any]) -> DeviceChoice:
    """Inverse of :meth:`DeviceChoice.to_json` (the pod's and template's device-request annotation), so a
    process that did not launch the pod can :meth:`~DeviceChoice.resolve` what its claim was allocated."""
    return DeviceChoice(
        device_class=d["deviceClassName"], count=int(d["count"]), selectors=tuple(d.get("selectors") or ()),
        mig_profile=d.get("migProfile"), sharing=d.get("sharing"), device_type=d["deviceType"],
        fraction_per_device=float(d["deviceFraction"]) / max(1, int(d["count"])), product=d.get("product"),
        alternatives=tuple(choice_from_json(a) for a in d.get("firstAvailable") or ()), subrequest=d.get("subrequest"))


def newest_slices(slices: Iterable[Mapping[str, Any]], driver: str = DRIVER) -> list[Mapping[str, Any]]:
    """``driver``'s slices of the highest ``spec.pool.generation`` of each pool; older generations are
    dropped ("A consumer must only use ResourceSlices with the highest generation number and ignore all
    others": kubernetes/api v0.34.0 ``resource/v1/types.go``). Plain dicts, any resource.k8s.io version."""
    mine = [s for s in slices if (s.get("spec") or {}).get("driver") == driver]

    def pool(s: Mapping[str, Any]) -> tuple[str, int]:
        p = s["spec"].get("pool") or {}
        return p.get("name", ""), int(p.get("generation", 0))

    newest: dict[str, int] = {}
    for s in mine:
        name, gen = pool(s)
        newest[name] = max(gen, newest.get(name, gen))
    return [s for s in mine if pool(s)[1] == newest[pool(s)[0]]]


@dataclass(frozen=True)
class AllocatedDevice:
    """One device of a claim's allocation, with what its ResourceSlice says about it.

    Attributes:
        request: the result's ``request`` (``gpu``, or ``gpu/mig`` for a firstAvailable subrequest).
        driver, pool, device: the device's identity.
        uuid: the device's ``uuid`` attribute (``GPU-…``, ``MIG-…``); None when its slice is not known or the
            device is abstract (a dynamic-MIG placement: its MIG device is created at prepare time).
        parent_uuid: a MIG device's ``parentUUID`` attribute, else None.
        mig_profile: a MIG device's ``profile`` attribute (``1g.10gb``), else None.
    """

    request: str
    driver: str
    pool: str
    device: str
    uuid: str | None = None
    parent_uuid: str | None = None
    mig_profile: str | None = None

    @property
    def nvml_uuid(self) -> str | None:
        """The UUID NVML opens for it: its own, else (an abstract MIG device) its parent's, whose MIG
        devices the sampler then reads."""
        return self.uuid or self.parent_uuid


def _string_attr(body: Mapping[str, Any], name: str) -> str | None:
    attrs = body.get("attributes") or {}
    v = attrs.get(name) or attrs.get(f"{DRIVER}/{name}") or {}
    return v.get("string")


def allocation(claim: Mapping[str, Any] | Any, slices: Iterable[Mapping[str, Any]] = ()) -> list[AllocatedDevice]:
    """The devices of a claim's ``status.allocation.devices.results`` (empty if unallocated), each looked up
    in ``slices`` (the newest generation of its pool) for its ``uuid`` / ``parentUUID`` / ``profile``
    attributes (NVIDIA/k8s-dra-driver-gpu v25.12.0 ``deviceinfo.go``, ``partitions.go``).

    ``claim``: a kubernetes model (``ResourceV1ResourceClaim``) or a camelCase dict; ``slices``: dicts.
    """
    d = claim if isinstance(claim, Mapping) else to_dict(claim)
    results = (((d.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    known: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    slices = list(slices)
    for drv in {r.get("driver") for r in results}:
        for s in newest_slices(slices, drv):
            pool = (s["spec"].get("pool") or {}).get("name", "")
            for dev in s["spec"].get("devices") or []:
                known[(drv, pool, dev["name"])] = dev.get("basic") or dev
    out = []
    for r in results:
        body = known.get((r["driver"], r["pool"], r["device"])) or {}
        out.append(AllocatedDevice(r.get("request", ""), r["driver"], r["pool"], r["device"], _string_attr(body, "uuid"),
                                   _string_attr(body, "parentUUID"), _string_attr(body, "profile")))
    return out


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
