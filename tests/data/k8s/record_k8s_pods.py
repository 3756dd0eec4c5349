"""Record step pods' JSON from the local control plane (resources/k8s/cluster.sh) for the pod_state tests.

Run from the repository root with the cluster up: ``.venv/bin/python tests/data/k8s/record_k8s_pods.py``.
Launches one step pod per case through the kubernetes backend (pods kept: no settler deletes them), waits
for the case's phase, writes ``tests/data/k8s/pod_<case>.json`` (``managedFields`` dropped) and deletes what
it made. Cases: succeeded (exit 0, MIG claim), failed (logs two lines, exit 7), running (sleeping), unschedulable (no device
has 200 GiB), stuck (bound, its container waits on a missing Secret: CreateContainerConfigError), pulling (its
image's first pull takes the node agent's slow-pull time: ContainerCreating with a Pulling event), image_missing
(the registry has no such image: ErrImagePull then ImagePullBackOff), prepare_failed (a TimeSlicing GpuConfig
while the driver's TimeSlicingSettings gate is off: ContainerCreating with FailedPrepareDynamicResources).
Each case's pod events (the kubelet's and the scheduler's) go to ``tests/data/k8s/events_<case>.json``.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from dagster_gpu.contracts import StepLaunch  # noqa: E402
from dagster_gpu.k8s.backend import KubernetesBackend  # noqa: E402
from dagster_gpu.k8s import manifests as m  # noqa: E402
from dagster_gpu.k8s.client import KubeClient  # noqa: E402
from dagster_gpu.policy.placement import Placement  # noqa: E402
from dagster_gpu.core.request import GpuRequest  # noqa: E402
from tests.k8s_helpers import NAMESPACE, admin_api, executor_api, require_cluster, wait_for  # noqa: E402

OUT = Path(__file__).resolve().parent


#: A worker that logs, prints an error to stderr and exits 7 (its termination message is its log's tail).
FAILING_WORKER = "echo 'embedding 3 partitions'; echo 'ValueError: corpus file bad.parquet: no text column' >&2; exit 7"


def _launch(argv, request):
    return StepLaunch(run_id=str(uuid.uuid4()), step_key="embeddings", partition_keys=("fortunes.txt",), attempt=0,
                      argv=tuple(argv), env={"GREETING": "hi"}, request=request,
                      placement=Placement(backend="kubernetes", reason="recording"))


def main() -> int:
    require_cluster()
    kube = KubeClient(executor_api(), NAMESPACE)
    admin = KubeClient(admin_api(), NAMESPACE)
    plain = m.PodSettings(namespace=NAMESPACE, secret_env=(), termination_grace_period_seconds=5)
    stuck = m.PodSettings(namespace=NAMESPACE, secret_env=(m.SecretEnv("DAGSTER_PG_PASSWORD", "no-such-secret", "pw"),))
    kw = dict(pending_timeout_s=3600, create_timeout_s=3600, delete_finished_pods=False,
              settle_wait_s=0, sweep_grace_s=-1, rates={"default": 1.0})
    tag = uuid.uuid4().hex[:8]  # a new image tag: its first pull on the node, so the pull takes its full time
    slow = m.PodSettings(namespace=NAMESPACE, secret_env=(), image=f"registry.example.com/slow-pull/dagster-gpu:{tag}")
    missing = m.PodSettings(namespace=NAMESPACE, secret_env=(), image="registry.example.com/does-not-exist/dagster-gpu:1")
    shared = m.PodSettings(namespace=NAMESPACE, secret_env=(), sharing_strategy="TimeSlicing")
    b, b_stuck = KubernetesBackend(kube, plain, **kw), KubernetesBackend(kube, stuck, **kw)
    b_slow, b_missing, b_shared = (KubernetesBackend(kube, x, **kw) for x in (slow, missing, shared))

    def waiting(reason):
        return lambda p: any(cs.state and cs.state.waiting and cs.state.waiting.reason == reason
                             for cs in p.status.container_statuses or [])
    cases = {
        "succeeded": (b, ["sh", "-c", "sleep 1.2"], GpuRequest(mig_ok=True), lambda p: p.status.phase == "Succeeded"),
        "failed": (b, ["sh", "-c", FAILING_WORKER], GpuRequest(count=1), lambda p: p.status.phase == "Failed"),
        "running": (b, ["sleep", "30"], GpuRequest(count=1), lambda p: p.status.phase == "Running"),
        "unschedulable": (b, ["true"], GpuRequest(memory_gib=200), lambda p: any(
            c.type == "PodScheduled" and c.reason == "Unschedulable" for c in p.status.conditions or [])),
        "stuck": (b_stuck, ["true"], GpuRequest(count=1), waiting("CreateContainerConfigError")),
        "pulling": (b_slow, ["true"], GpuRequest(count=0), lambda p: waiting("ContainerCreating")(p) and any(
            e["reason"] == "Pulling" for e in admin.pod_events(p.metadata.name))),
        "image_missing": (b_missing, ["true"], GpuRequest(count=0), waiting("ImagePullBackOff")),
        "prepare_failed": (b_shared, ["true"], GpuRequest(count=1, shared_ok=True), lambda p: any(
            e["reason"] == "FailedPrepareDynamicResources" for e in admin.pod_events(p.metadata.name))),
    }
    handles = []
    try:
        _record(cases, handles, admin)
    finally:
        for backend, h in handles:
            backend.terminate(h)
    time.sleep(1)
    return 0


def _record(cases, handles, admin) -> None:
    for case, (backend, argv, request, done) in cases.items():
        h = backend.launch(_launch(argv, request))
        handles.append((backend, h))
        pod = wait_for(lambda: (p := admin.read_pod(h["pod"])) is not None and done(p) and p, 60, what=f"{case} pod")
        time.sleep(0.5)  # the events of the status just seen
        body = m.to_dict(pod)
        body["metadata"].pop("managedFields", None)
        (OUT / f"pod_{case}.json").write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
        events = admin.pod_events(h["pod"])
        for e in events:
            e["metadata"].pop("managedFields", None)
        (OUT / f"events_{case}.json").write_text(json.dumps(events, indent=1, sort_keys=True) + "\n")
        print(f"recorded {case}: {h['pod']} phase {pod.status.phase}")


if __name__ == "__main__":
    sys.exit(main())
