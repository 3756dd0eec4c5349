"""KubernetesBackend on the real control plane, as the executor's ServiceAccount (no Dagster run needed).

The worker argv here is a shell command, so these tests isolate the backend contract: launch, state
(including FailedScheduling timeouts), terminate, post-run pod-interval figures. Each launched handle is
tracked by a settler, as the step handler does: it deletes ended pods and terminates pods given up on.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

from dagster_gpu.contracts import StepLaunch, WorkerStatus
from dagster_gpu.k8s.backend import KubernetesBackend
from dagster_gpu.executor.settle import Settler
from dagster_gpu.k8s import manifests as m
from dagster_gpu.k8s.client import KubeClient
from dagster_gpu.policy.placement import Placement
from dagster_gpu.core.request import GpuRequest
from tests.k8s_helpers import NAMESPACE, executor_api, labelled, require_cluster, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.e2e]

SETTLER = Settler(write=lambda bill: 0)  # these shell steps name no Dagster run: nothing to write


def _start(backend, launch):
    """Launch and hand the handle to the settler (what GpuStepHandler.launch_step does)."""
    h = backend.launch(launch)
    SETTLER.track(backend, h)
    return h


@pytest.fixture(scope="module")
def backend():
    require_cluster()
    kube = KubeClient(executor_api(), NAMESPACE)
    assert kube.resource_api_version == "v1"
    # No Secret named like the default PostgreSQL one exists here: no secret env for these shell steps.
    settings = m.PodSettings(namespace=NAMESPACE, secret_env=(), termination_grace_period_seconds=10)
    return KubernetesBackend(kube, settings, pending_timeout_s=5, create_timeout_s=30)


def _launch(argv, request=GpuRequest(), device=None, run_id=None, pk="p-0") -> StepLaunch:
    return StepLaunch(run_id=run_id or str(uuid.uuid4()), step_key="embeddings", partition_keys=(pk,), attempt=0,
                      argv=tuple(argv), env={"GREETING": "hi"}, request=request,
                      placement=Placement(backend="kubernetes", reason="test", device=device))


def _wait_terminal(backend, handle, timeout=60):
    return wait_for(lambda: (s := backend.state(handle)).status in (WorkerStatus.SUCCEEDED, WorkerStatus.FAILED) and s,
                    timeout, what=f"pod {handle['pod']} to end")


def test_mig_step_runs_and_reports_pod_interval(backend):
    launch = _launch(["sh", "-c", 'test "$GREETING" = hi && test -n "$NVIDIA_VISIBLE_DEVICES" && sleep 1.2'],
                     GpuRequest(mig_ok=True))
    h = _start(backend, launch)
    assert h["device_class"] == "mig.nvidia.com" and h["device_fraction"] == pytest.approx(1 / 7)
    s = _wait_terminal(backend, h)
    assert s.status == WorkerStatus.SUCCEEDED and s.exit_code == 0, s
    bill = backend.accounting(h)  # the pod-interval bill, from the end this process read
    md = bill.metadata
    assert md["billing/source"] == "pod-interval" and md["dagster_gpu/backend"] == "kubernetes"
    assert md["k8s/resource_claim"].startswith(h["pod"] + "-gpu-")
    driver, pool, device = md["k8s/allocated_devices"].split("/")
    assert (driver, pool) == ("gpu.nvidia.com", "gpu-node-0") and device.startswith("gpu-2-mig-1g10gb-19-")
    assert 1.0 <= md["k8s/running_seconds"] <= 5.0
    assert bill.gpu_seconds == pytest.approx(md["k8s/running_seconds"] / 7)
    assert bill.rate_usd_per_gpu_hour == pytest.approx(2.40) and bill.match == ("k8s/pod", h["pod"])
    # delete_finished_pods: nothing of the step is left; the claim went with the pod
    sel = m.run_selector(launch.run_id)
    wait_for(lambda: not any(labelled(backend.kube.api, sel).values()), 30, what="cleanup")
    assert backend.state(h).status == WorkerStatus.SUCCEEDED  # remembered after the pod is gone


def test_failed_step_reports_exit_code_and_the_last_lines_of_its_log(backend):
    lines = "; ".join(f"echo line {i}" for i in range(100))  # more than the kubelet's 80-line cap
    h = _start(backend, _launch(["sh", "-c", f"{lines}; echo 'ValueError: bad record' >&2; exit 7"], GpuRequest(memory_gib=79)))
    s = _wait_terminal(backend, h)
    assert s.status == WorkerStatus.FAILED and s.exit_code == 7
    head, log = s.message.split("\n", 1)
    assert head == f"pod {h['pod']} Failed (Error); termination message:"
    assert log.splitlines() == [f"line {i}" for i in range(21, 100)] + ["ValueError: bad record"]
    assert backend.accounting(h).metadata["k8s/allocated_devices"] in (
        "gpu.nvidia.com/gpu-node-0/gpu-0", "gpu.nvidia.com/gpu-node-0/gpu-1")


def test_impossible_request_fails_with_scheduler_message_and_leaves_nothing(backend):
    launch = _launch(["true"], GpuRequest(memory_gib=200))
    t0 = time.monotonic()
    h = _start(backend, launch)
    s = wait_for(lambda: (st := backend.state(h)).status == WorkerStatus.FAILED and st, 30, what="FAILED")
    assert time.monotonic() - t0 < 15
    assert "FailedScheduling" in s.message and "cannot allocate all claims" in s.message, s.message
    wait_for(lambda: not any(labelled(backend.kube.api, m.run_selector(launch.run_id)).values()), 30, what="cleanup")


def test_terminate_is_graceful_and_leaves_nothing(backend, tmp_path):
    os.chmod(tmp_path, 0o777)
    marker = tmp_path / "term"
    launch = _launch(["bash", "-c", f"trap 'echo TERM > {marker}; exit 143' TERM; while true; do sleep 0.1; done"],
                     GpuRequest(count=1))
    h = _start(backend, launch)
    wait_for(lambda: backend.state(h).status == WorkerStatus.RUNNING, 30, what="RUNNING")
    backend.terminate(h)
    wait_for(lambda: not any(labelled(backend.kube.api, m.run_selector(launch.run_id)).values()), 30, what="cleanup")
    assert marker.read_text().strip() == "TERM"


def test_relaunch_reattaches_to_existing_pod(backend):
    launch = _launch(["sleep", "1"], GpuRequest(count=0))
    h1 = _start(backend, launch)
    h2 = _start(backend, launch)
    assert h1["pod_uid"] == h2["pod_uid"] and h1["template"] == ""
    assert _wait_terminal(backend, h2).status == WorkerStatus.SUCCEEDED


@pytest.mark.parametrize("version", ["v1beta2", "v1beta1"])
def test_older_resource_api_shapes_work_on_a_real_server(version):
    """Clusters that serve only v1beta2/v1beta1 get those shapes (this one serves all three)."""
    require_cluster()
    kube = KubeClient(executor_api(), NAMESPACE, resource_api_version=version)
    groups = [v.group_version for g in __import__("kubernetes").client.ApisApi(kube.api).get_api_versions().groups
              for v in g.versions]
    if f"resource.k8s.io/{version}" not in groups:
        pytest.skip(f"resource.k8s.io/{version} not served (cluster.sh serves it; an older cluster.sh may not)")
    b = KubernetesBackend(kube, m.PodSettings(namespace=NAMESPACE, secret_env=()), pending_timeout_s=30)
    h = _start(b, _launch(["sleep", "1"], GpuRequest(mig_ok=True)))
    s = _wait_terminal(b, h)
    assert s.status == WorkerStatus.SUCCEEDED
    assert b.accounting(h).metadata["k8s/allocated_devices"].startswith("gpu.nvidia.com/gpu-node-0/gpu-2-mig-1g10gb-19-")


def test_stuck_creating_fails_with_kubelet_reason_and_leaves_nothing():
    """A pod bound to the node whose container cannot start (missing Secret) fails after create_timeout."""
    require_cluster()
    kube = KubeClient(executor_api(), NAMESPACE)
    settings = m.PodSettings(namespace=NAMESPACE, secret_env=(m.SecretEnv("DAGSTER_PG_PASSWORD", "no-such-secret", "pw"),))
    b = KubernetesBackend(kube, settings, pending_timeout_s=30, create_timeout_s=4)
    launch = _launch(["true"], GpuRequest(count=1))
    h = _start(b, launch)
    s = wait_for(lambda: (st := b.state(h)).status == WorkerStatus.FAILED and st, 40, what="FAILED")
    assert "not started" in s.message and "CreateContainerConfigError" in s.message, s.message
    wait_for(lambda: not any(labelled(kube.api, m.run_selector(launch.run_id)).values()), 30, what="cleanup")
