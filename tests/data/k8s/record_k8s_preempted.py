"""Record a step pod that kube-scheduler preempts, from the local control plane (resources/k8s/cluster.sh).

Run from the repository root with the cluster up: ``.venv/bin/python tests/data/k8s/record_k8s_preempted.py``.
Launches one step pod through the kubernetes backend at the batch PriorityClass with 40 CPUs (its worker exits
143 one second after SIGTERM, as a graceful stop does), then an "online" pod of a higher class that needs 40 of
the node's 64 CPUs. Writes, from a watch on the step pod (``managedFields`` dropped):

* ``pod_preempted_terminating.json``: the first version with the scheduler's ``DisruptionTarget`` condition
  (still Running, ``deletionTimestamp`` set);
* ``pod_preempted.json``: its last version (``Failed``, the container terminated, the condition kept, as the
  kubelet's status manager keeps a condition it does not own), the object of the watch's DELETED event;
* ``events_preempted.json``: the pod's events, kube-scheduler's ``Preempted`` among them.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from kubernetes import client, watch  # noqa: E402

from dagster_gpu.contracts import StepLaunch  # noqa: E402
from dagster_gpu.core.request import GpuRequest  # noqa: E402
from dagster_gpu.k8s import manifests as m  # noqa: E402
from dagster_gpu.k8s.backend import KubernetesBackend  # noqa: E402
from dagster_gpu.k8s.client import KubeClient  # noqa: E402
from dagster_gpu.policy.placement import Placement  # noqa: E402
from tests.k8s_helpers import NAMESPACE, admin_api, executor_api, require_cluster, wait_for  # noqa: E402
from tests.test_k8s_preemption_e2e import _ensure_online_class, _online_pod  # noqa: E402

OUT = Path(__file__).resolve().parent
WORKER = "trap 'sleep 1; exit 143' TERM; sleep 300 & wait"


def _clean(d: dict) -> dict:
    d.get("metadata", {}).pop("managedFields", None)
    return d


def main() -> int:
    require_cluster()
    _ensure_online_class()
    kube = KubeClient(executor_api(), NAMESPACE)
    settings = m.PodSettings(namespace=NAMESPACE, secret_env=(), termination_grace_period_seconds=10,
                             cpu_request="40", priority_class_name="dagster-gpu-batch")
    b = KubernetesBackend(kube, settings, delete_finished_pods=False, settle_wait_s=0, sweep_grace_s=-1,
                          rates={"default": 1.0})
    launch = StepLaunch(run_id=str(uuid.uuid4()), step_key="embeddings", partition_keys=("fortunes.txt",), attempt=0,
                        argv=("sh", "-c", WORKER), env={}, request=GpuRequest(mig_ok=True),
                        placement=Placement(backend="kubernetes", reason="recording"))
    h = b.launch(launch)
    core = client.CoreV1Api(admin_api())
    wait_for(lambda: core.read_namespaced_pod(h["pod"], NAMESPACE).status.phase == "Running", 120, what="running")
    online = f"online-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_pod("default", _online_pod(online, 5))
    api = client.ApiClient()
    first, last = None, None
    w = watch.Watch()
    for ev in w.stream(core.list_namespaced_pod, NAMESPACE, field_selector=f"metadata.name={h['pod']}", timeout_seconds=90):
        body = _clean(api.sanitize_for_serialization(ev["object"]))
        disrupted = any(c.get("type") == "DisruptionTarget" for c in body["status"].get("conditions") or [])
        if disrupted and first is None:
            first = body
        last = body
        if ev["type"] == "DELETED":
            w.stop()
    events = kube.pod_events(h["pod"])
    (OUT / "pod_preempted_terminating.json").write_text(json.dumps(first, indent=1, sort_keys=True) + "\n")
    (OUT / "pod_preempted.json").write_text(json.dumps(last, indent=1, sort_keys=True) + "\n")
    (OUT / "events_preempted.json").write_text(json.dumps(events, indent=1, sort_keys=True) + "\n")
    time.sleep(6)
    core.delete_namespaced_pod(online, "default", grace_period_seconds=0)
    b.terminate(h)
    print(f"recorded {h['pod']}: {len(events)} events")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
