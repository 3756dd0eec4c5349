"""A Kubernetes work unit's handle: one step pod (and its ResourceClaimTemplate), as the executor records it in
the event log (STEP_WORKER_STARTING metadata, so a resumed run re-attaches) and as the sweep reads it back from
a pod this process did not launch (:func:`dagster_gpu.k8s.pod.handle_from_pod`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class PodHandle:
    """One step pod.

    Attributes:
        namespace, pod, pod_uid: the pod; the uid tells it from a later pod of the same name.
        template: the pod's ResourceClaimTemplate ("" for a CPU-only pod, which has no claim).
        device_class: the DeviceClass the claim asks for ("" for a CPU-only pod).
        device_type: the rate card's device type the pod is billed as (``cpu`` for a CPU-only pod; a MIG
            profile such as ``mig-1g.10gb``; ``default`` when a claim named none).
        device_fraction: the share of one GPU the claim holds (0.0 without a claim; 1/7 for a 1g.10gb slice).
        product: the GPU product asked for ("" when any), a MIG slice's parent.
        sharing: the claim's sharing strategy (``TimeSlicing``, ``MPS``) or "".
        device_request: the DeviceChoice as JSON, as in the pod's annotation ("" without a claim); a
            ``firstAvailable`` claim is billed as the alternative it was allocated
            (:func:`dagster_gpu.k8s.billing.allocated_handle`).
        placement_device: the policy's pool the pod was placed on ("" when the placement named none).
        launched_at: when the pod was created (Unix seconds; 0.0 when unknown).
        partition_key: the key of a single-partition step, else "".
    """

    namespace: str
    pod: str
    pod_uid: str
    template: str = ""
    device_class: str = ""
    device_type: str = "default"
    device_fraction: float = 0.0
    product: str = ""
    sharing: str = ""
    device_request: str = ""
    placement_device: str = ""
    launched_at: float = 0.0
    partition_key: str = ""

    def to_handle(self) -> dict[str, Any]:
        """The handle as the executor stores it (JSON values)."""
        return asdict(self)

    @classmethod
    def from_handle(cls, handle: Mapping[str, Any]) -> "PodHandle":
        """The handle from its stored form (:meth:`to_handle`). Raises KeyError without the namespace, the pod's
        name or its uid (not a Kubernetes handle), ValueError for a fraction or time that is not a number."""
        def text(key: str, default: str = "") -> str:
            v = handle.get(key)
            return default if v is None or v == "" else str(v)

        return cls(
            namespace=str(handle["namespace"]), pod=str(handle["pod"]), pod_uid=str(handle["pod_uid"]),
            template=text("template"), device_class=text("device_class"),
            device_type=text("device_type", "default"), device_fraction=float(handle.get("device_fraction") or 0.0),
            product=text("product"), sharing=text("sharing"), device_request=text("device_request"),
            placement_device=text("placement_device"), launched_at=float(handle.get("launched_at") or 0.0),
            partition_key=text("partition_key"),
        )
