"""The Kubernetes pod-interval bill (pure): what a step pod held, from its container's running interval.

``billing/source: pod-interval``: ``billing/gpu_seconds`` = the container's running interval
(``terminated.finishedAt - startedAt``, s; 1 s resolution) × ``gpu/device_fraction`` (one CPU slot for a
CPU-only pod); the cost comes from :func:`dagster_gpu.billing.metering.charge` at the kubernetes rate of
the device type, so a MIG slice is priced at its parent product's GPU-hour rate, as in the worker's
measured bill and the cost policy's estimate. A ``firstAvailable`` claim (a MIG slice, else a whole GPU) is
billed as the alternative the scheduler allocated, named by the claim's
``status.allocation.devices.results[].request`` (``gpu/mig`` or ``gpu/gpu``): a whole GPU given as the
fallback is a whole GPU, not the slice's fraction.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

from dagster_gpu.billing.keys import COST_USD, DEVICE_TYPE, GPU_SECONDS, RATE_USD_PER_GPU_HOUR, SOURCE
from dagster_gpu.billing.metering import charge
from dagster_gpu.k8s.dra import choice_from_json
from dagster_gpu.k8s.handle import PodHandle


def allocated_handle(handle: PodHandle, allocated_requests: Sequence[str]) -> PodHandle:
    """``handle`` with ``device_type``, ``device_fraction`` and ``product`` of the alternative its claim was
    allocated (:meth:`~dagster_gpu.k8s.dra.DeviceChoice.resolve` of the first result's ``request``).

    Unchanged (billed as asked) without a ``device_request`` or results, for an ``exactly`` request, or when
    ``device_request`` is not a DeviceChoice's JSON (an annotation edited by hand)."""
    if not handle.device_request or not allocated_requests:
        return handle
    try:
        choice = choice_from_json(json.loads(handle.device_request)).resolve(allocated_requests[0])
    except (ValueError, KeyError, TypeError, AttributeError):
        return handle
    return dataclasses.replace(handle, device_type=choice.device_type, device_fraction=choice.device_fraction,
                               product=choice.product or handle.product)


def pod_interval_metadata(handle: PodHandle, started_at: float | None, finished_at: float | None, resource_claim: str,
                          allocated_devices: Sequence[str], rates: Mapping[str, float],
                          allocated_requests: Sequence[str] = ()) -> dict[str, Any] | None:
    """Observation metadata of an ended pod, or None when its container never ran (no interval).

    Args:
        handle: the pod's handle (its ``namespace``, ``pod``, ``device_type``, ``device_fraction`` and
            ``product``, the GPU product asked for: a MIG slice's parent).
        started_at, finished_at: the container's ``terminated.startedAt`` / ``finishedAt`` (Unix epoch s).
        resource_claim: the generated ResourceClaim's name (empty for a CPU-only pod).
        allocated_devices: ``driver/pool/device`` of each device the claim was allocated.
        rates: the kubernetes rate table (USD per GPU-hour).
        allocated_requests: the ``request`` of each allocation result (``gpu``, ``gpu/mig``, ``gpu/gpu``): a
            firstAvailable claim is billed as the alternative named (:func:`allocated_handle`).

    Returns ``k8s/namespace``, ``k8s/pod``, ``k8s/resource_claim``, ``k8s/allocated_devices`` (comma-separated),
    ``k8s/device_request`` (each result's request, as the worker's measured bill records it),
    ``k8s/running_seconds``, ``k8s/started_at``, ``k8s/finished_at``, ``gpu/device_fraction`` and the
    ``billing/*`` figures. Raises RateCardError when the table has no rate and no ``default``.
    """
    if started_at is None or finished_at is None:
        return None
    handle = allocated_handle(handle, allocated_requests)
    interval = max(0.0, finished_at - started_at)
    fraction, device_type = handle.device_fraction, handle.device_type
    bill = charge(rates, device_type, 1.0 if device_type == "cpu" else fraction, interval, handle.product or None)
    return {
        "k8s/namespace": handle.namespace,
        "k8s/pod": handle.pod,
        "k8s/resource_claim": resource_claim,
        "k8s/allocated_devices": ",".join(allocated_devices),
        "k8s/device_request": ",".join(allocated_requests),
        "k8s/running_seconds": float(interval),
        "k8s/started_at": float(started_at),
        "k8s/finished_at": float(finished_at),
        "gpu/device_fraction": fraction,
        DEVICE_TYPE: device_type,
        GPU_SECONDS: float(bill.gpu_seconds),
        RATE_USD_PER_GPU_HOUR: float(bill.rate_usd_per_gpu_hour),
        COST_USD: float(bill.cost_usd),
        SOURCE: "pod-interval",
    }
