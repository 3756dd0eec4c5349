"""KubernetesBackend.launch honours remembered sharing failures for placements the policy did not make, and
the pod-interval bill of a firstAvailable claim follows the device the scheduler allocated. No cluster: the
backend's client is a recorder of the objects it is sent; claims are the recorded ones under tests/data/k8s.

The allocated alternative is read from ``status.allocation.devices.results[].request``, which names a
firstAvailable subrequest ``<main request>/<subrequest>`` (kubernetes/api v0.34 ``resource/v1/types.go``,
``DeviceRequestAllocationResult.Request``; the same text is in the python client's
``V1DeviceRequestAllocationResult.request``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path

import pytest
from kubernetes.client import V1ObjectMeta

from dagster_gpu.contracts import StepLaunch
from dagster_gpu.k8s.backend import KubernetesBackend
from dagster_gpu.k8s.billing import pod_interval_metadata
from dagster_gpu.k8s.handle import PodHandle
from dagster_gpu.k8s import dra
from dagster_gpu.k8s import manifests as m
from dagster_gpu.k8s.client import ClaimWatcher
from dagster_gpu.policy.placement import Placement
from dagster_gpu.k8s.sharing_failures import SharingFailures
from dagster_gpu.core.request import GpuRequest

DATA = Path(__file__).resolve().parent / "data" / "k8s"
A100 = "NVIDIA A100-SXM4-80GB"
RATES = {"default": 2.0, A100: 4.0}


class _NoWatch:
    def start(self):
        pass

    def wait_synced(self, timeout):
        return True

    def get(self, uid):
        return None


class _Kube:
    """Records the ResourceClaimTemplates and pods it is asked to create."""

    namespace = "ns"

    def __init__(self):
        self.templates: list[dict] = []
        self.pods: list[dict] = []

    def create_claim_template(self, body):
        self.templates.append(body)

    def create_pod(self, body):
        self.pods.append(body)
        return type("Created", (), {"metadata": V1ObjectMeta(name=body["metadata"]["name"], uid=f"uid-{len(self.pods)}")})()

    def set_template_owner(self, name, patch):
        pass


def _backend(memory):
    kube = _Kube()
    b = KubernetesBackend(kube, m.PodSettings(namespace="ns", secret_env=(), sharing_strategy="TimeSlicing"),
                          rates=RATES, sharing_failures=memory)
    b.claims = _NoWatch()
    return b, kube


def _launch(device, shared=None, step="embed"):
    return StepLaunch(run_id="r-1", step_key=step, partition_keys=("a.txt",), attempt=0, argv=("python",), env={},
                      request=GpuRequest(shared_ok=True),
                      placement=Placement(backend="kubernetes", reason="forced", device=device, shared=shared))


def _configs(template):
    return template["spec"]["spec"]["devices"].get("config") or []


def test_a_forced_launch_gets_no_sharing_config_where_a_shared_claim_failed_to_prepare():
    memory = SharingFailures(None)
    b, kube = _backend(memory)
    h = b.launch(_launch(A100))
    assert h["sharing"] == "TimeSlicing" and len(_configs(kube.templates[-1])) == 1  # nothing failed yet
    memory.record(A100, "invalid GPU sharing settings: feature gate TimeSlicingSettings is not enabled")
    h = b.launch(_launch(A100, step="embed2"))
    assert h["sharing"] == "" and _configs(kube.templates[-1]) == []
    assert json.loads(kube.pods[-1]["metadata"]["annotations"][m.ANNOTATION_DEVICE_REQUEST])["sharing"] is None
    # another pool is still allowed; a failure of an unplaced step (None -> every pool) blocks all of them
    assert b.launch(_launch("NVIDIA H100 80GB HBM3", step="embed3"))["sharing"] == "TimeSlicing"
    memory.record(None, "refused")
    assert b.launch(_launch(None, step="embed4"))["sharing"] == ""
    assert b.launch(_launch("NVIDIA H100 80GB HBM3", step="embed5"))["sharing"] == ""


def test_the_placements_own_shared_decision_wins_over_the_memory():
    memory = SharingFailures(None)
    memory.record(A100, "refused")
    b, kube = _backend(memory)
    assert b.launch(_launch(A100, shared=True))["sharing"] == "TimeSlicing"  # the policy decided: as placed
    assert b.launch(_launch("NVIDIA H100 80GB HBM3", shared=False, step="e2"))["sharing"] == ""


def _first_available_handle():
    """What a process that did not launch the pod bills from: handle_from_pod of a firstAvailable step pod."""
    launch = StepLaunch(run_id="r", step_key="embed", partition_keys=("a.txt",), attempt=0, argv=("python",), env={},
                        request=GpuRequest(mig_ok=True), placement=Placement(backend="kubernetes", reason="forced"))
    pod, template, choice = m.step_objects(launch, m.PodSettings(secret_env=()))
    assert [a.subrequest for a in choice.alternatives] == ["mig", "gpu"]
    pod.metadata = V1ObjectMeta(**{**pod.metadata.to_dict(), "uid": "u1", "namespace": "ns",
                                   "creation_timestamp": dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)})
    return m.handle_from_pod(pod)


def _watched(claim_file):
    """The ClaimWatcher's entry for a recorded allocated claim (owner pod uid set to ``u1``)."""
    claim = json.loads((DATA / claim_file).read_text())
    claim["metadata"]["ownerReferences"] = [{"kind": "Pod", "uid": "u1", "name": "p", "apiVersion": "v1"}]
    w = ClaimWatcher(kube=None, label_selector="")
    w.record(claim)
    return w.get("u1")


def test_a_whole_gpu_given_as_the_first_available_fallback_is_billed_as_a_whole_gpu():
    handle = _first_available_handle()
    assert (handle.device_type, handle.device_fraction) == ("mig-1g.10gb", pytest.approx(1 / 7))  # as asked
    seen = _watched("claim_allocated_whole_gpu.json")
    assert seen["requests"] == ["gpu/gpu"]
    md = pod_interval_metadata(handle, 1000.0, 1070.0, "claim", seen["devices"], RATES, seen["requests"])
    assert (md["billing/device_type"], md["gpu/device_fraction"], md["k8s/device_request"]) == ("default", 1.0, "gpu/gpu")
    assert md["billing/gpu_seconds"] == 70.0 and md["billing/cost_usd"] == pytest.approx(70 / 3600 * 2.0)


def test_a_slice_given_by_a_first_available_claim_stays_a_seventh():
    handle = _first_available_handle()
    seen = _watched("claim_allocated_static_mig.json")
    assert seen["requests"] == ["gpu/mig"]
    md = pod_interval_metadata(handle, 1000.0, 1070.0, "claim", seen["devices"], RATES, seen["requests"])
    assert (md["billing/device_type"], md["billing/gpu_seconds"]) == ("mig-1g.10gb", pytest.approx(10.0))
    # without the results (claim never seen) the bill is what was asked, and a broken annotation changes nothing
    assert pod_interval_metadata(handle, 1000.0, 1070.0, "claim", [], RATES)["billing/gpu_seconds"] == pytest.approx(10.0)
    bad = dataclasses.replace(handle, device_request="{not json")
    assert pod_interval_metadata(bad, 1000.0, 1070.0, "c", [], RATES, ["gpu/gpu"])["billing/gpu_seconds"] == pytest.approx(10.0)


def test_the_launch_handle_carries_the_device_request_the_bill_resolves():
    b, kube = _backend(SharingFailures(None))
    launch = StepLaunch(run_id="r-1", step_key="embed", partition_keys=("a.txt",), attempt=0, argv=("python",), env={},
                        request=GpuRequest(mig_ok=True), placement=Placement(backend="kubernetes", reason="forced"))
    h = b.launch(launch)
    assert h["device_request"] == kube.pods[-1]["metadata"]["annotations"][m.ANNOTATION_DEVICE_REQUEST]
    facts = {"started_at": 0.0, "finished_at": 14.0, "resource_claim": "c", "allocated_devices": ["d"],
             "allocated_requests": ["gpu/gpu"], "env": {}}
    assert b._metadata(PodHandle.from_handle(h), facts)["billing/gpu_seconds"] == 14.0


def test_pod_py_uses_the_public_mig_profile_names():
    assert not hasattr(dra, "_PROFILE")
    with pytest.raises(m.ManifestError, match="mig_profile"):
        m.PodSettings(mig_profile="1g.10")
    assert m.PodSettings(mig_profile="3g.40gb").mig_profile == "3g.40gb"


def _context_fraction(request, settings=None):
    """The step context's device_fraction the launched pod's worker gets, and what the worker bills with it."""
    from dagster_gpu.worker.context import ENV_VAR

    kube = _Kube()
    b = KubernetesBackend(kube, settings or m.PodSettings(namespace="ns", secret_env=()), rates=RATES,
                          sharing_failures=SharingFailures(None))
    b.claims = _NoWatch()
    ctx = {"backend": "kubernetes", "placement": {"backend": "kubernetes", "reason": "t"}, "rates": RATES,
           "gpu_count": request.count, "device_fraction": None}
    b.launch(StepLaunch(run_id="r-1", step_key="embed", partition_keys=("a.txt",), attempt=0, argv=("python",),
                        env={ENV_VAR: json.dumps(ctx)}, request=request,
                        placement=Placement(backend="kubernetes", reason="forced")))
    env = {e["name"]: e.get("value") for e in kube.pods[-1]["spec"]["containers"][0]["env"]}
    return json.loads(env[ENV_VAR])["device_fraction"]


def test_the_worker_bills_each_device_it_sees_once():
    from dagster_gpu.billing.measured import billed_device

    # two whole GPUs: 1.0 per device (was the claim's 2.0, so the worker billed 4 GPUs)
    f = _context_fraction(GpuRequest(count=2))
    assert f == 1.0 and billed_device("cuda:0", A100, 2, f) == (A100, None, 2.0)
    # firstAvailable: the whole GPU fallback is one GPU (was 1/7); a slice is named by NVML's MIG name
    f = _context_fraction(GpuRequest(mig_ok=True))
    assert f == 1.0 and billed_device("cuda:0", A100, 1, f) == (A100, None, 1.0)
    assert billed_device("cuda:0", f"{A100} MIG 1g.10gb", 1, f)[2] == pytest.approx(1 / 7)
