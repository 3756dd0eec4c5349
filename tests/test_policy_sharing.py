"""After a shared (TimeSlicing/MPS) claim failed to prepare on a pool, the policy stops choosing shared
placements there.

Upstream behaviour copied: NVIDIA/k8s-dra-driver-gpu v25.12.0 ``pkg/featuregates/featuregates.go``
(TimeSlicingSettings and MPSSupport alpha, off by default since 25.8) and ``api/nvidia.com/resource/v1beta1``
(``GpuSharing.Validate`` rejects the config while they are off), so the kubelet reports
FailedPrepareDynamicResources for every shared claim of that driver installation.
"""

from __future__ import annotations

import json

import pytest

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.k8s.dra import device_choice
from dagster_gpu.k8s.pod import PodSettings
from dagster_gpu.policy import DeviceGroup, GpuRequest, KubernetesState, Placement, RuntimeModel, Snapshot, StepSize, decide
from dagster_gpu.policy.ranges import plan_range
from dagster_gpu.k8s.sharing_failures import ALL_POOLS, SharingFailures, default_path

A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
MODEL = RuntimeModel(texts_per_second=2000.0, n_history=3)
PREPARE = ("Failed to prepare dynamic resources: NodePrepareResources failed for ResourceClaim gpu: "
           "invalid GPU sharing settings: time-slicing settings are not enabled")


def _snap(no_sharing=()):
    pools = (DeviceGroup(A100, A100, 80.0, 2, 2), DeviceGroup(H100, H100, 79.65, 2, 2))
    return Snapshot(rate_card=RateCard.load(), kubernetes=KubernetesState(pools=pools, no_sharing=tuple(no_sharing)))


def test_a_pool_where_sharing_failed_gets_an_unshared_claim():
    req = GpuRequest(shared_ok=True, product="NVIDIA A100")
    ok = decide(req, StepSize(rows=1000), _snap(), model=MODEL)
    assert (ok.device, ok.shared) == (A100, True)
    no = decide(req, StepSize(rows=1000), _snap([A100]), model=MODEL)
    assert (no.device, no.shared) == (A100, False) and "unshared: a shared claim failed to prepare on " + A100 in no.reason
    settings = PodSettings(sharing_strategy="TimeSlicing")
    assert device_choice(req, ok.device, settings, shared=ok.shared).sharing == "TimeSlicing"
    assert device_choice(req, no.device, settings, shared=no.shared).sharing is None
    # another pool is unaffected, "*" blocks every pool; a step that is not shared_ok is not concerned
    assert decide(GpuRequest(shared_ok=True, product="NVIDIA H100"), StepSize(rows=1000), _snap([A100]), model=MODEL).shared is True
    assert decide(req, StepSize(rows=1000), _snap([ALL_POOLS]), model=MODEL).shared is False
    assert decide(GpuRequest(product="NVIDIA A100"), StepSize(rows=1000), _snap([A100]), model=MODEL).shared is None
    # the decision travels in the step context
    assert Placement.from_json(json.loads(json.dumps(no.to_json()))).shared is False


def test_ranged_units_follow_the_same_rule():
    plan = plan_range(GpuRequest(shared_ok=True, product="NVIDIA A100"), [StepSize(rows=1000)] * 3, _snap([A100]), model=MODEL)
    assert plan.units and all(u.placement.shared is False for u in plan.units)


def test_the_memory_is_shared_through_its_file_and_expires(tmp_path):
    path = tmp_path / "home" / "dagster_gpu" / "sharing-failures.json"
    SharingFailures(path).record(A100, PREPARE, now=1000.0)
    other = SharingFailures(path, ttl_s=3600)  # another run worker of the same instance
    assert other.blocked(now=1000.0 + 3599) == {A100: PREPARE}
    assert other.blocked(now=1000.0 + 3600) == {}
    assert not other.allows_sharing(A100, now=1001.0) and other.allows_sharing(H100, now=1001.0)
    assert other.allows_sharing(None, now=1001.0)  # a forced step without a device: only "*" blocks it
    other.record(None, "x", now=5000.0)  # a step placed without a device: every pool
    assert set(SharingFailures(path).blocked(now=5000.0)) == {ALL_POOLS}  # the expired entry was dropped
    assert json.loads(path.read_text()) == {ALL_POOLS: {"reason": "x", "at": 5000.0}}
    path.write_text("{not json")
    assert SharingFailures(path).blocked() == {}
    assert default_path({"DAGSTER_HOME": "/h"}).as_posix() == "/h/dagster_gpu/sharing-failures.json"
    assert default_path({}) is None
    mem = SharingFailures()
    mem.record(H100, PREPARE)
    assert mem.blocked() == {H100: PREPARE}
    with pytest.raises(ValueError):
        SharingFailures(ttl_s=0)
