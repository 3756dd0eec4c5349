"""Batch step pods as Kueue workloads on a mixed cluster (the real Kueue v0.17.0 manager resources/k8s/cluster.sh runs).

resources/k8s/kueue/example/mixed-cluster.yaml: ClusterQueue ``online`` owns the quota (two MIG 1g.10gb slices) and
reclaims it (``preemption.reclaimWithinCohort: Any``); ``batch`` has none and borrows through the cohort ``gpus``.
A backfill of four ``k8s_preemptible`` partitions (one ``mig_ok`` slice each, ``kubernetes.queue_name: batch``)
borrows both idle slices: two units run, two wait in Kueue. An online pod asking for both slices then arrives in
LocalQueue ``online``; Kueue (sigs.k8s.io/kueue v0.17.0) relies on:

* ``pkg/controller/jobs/pod/pod_webhook.go``: a pod labelled ``kueue.x-k8s.io/queue-name`` gets the scheduling gate
  ``kueue.x-k8s.io/admission``; the pod controller makes its Workload (label ``kueue.x-k8s.io/job-uid``) and removes
  the gate on admission;
* ``pkg/dra/claims.go``: the Workload's DRA request is counted from the ResourceClaimTemplate's ``exactly`` request
  by DeviceClass (``resources.deviceClassMappings``); the step's template has no ``firstAvailable``;
* ``pkg/scheduler/preemption/preemption.go``: to admit the online workload within its nominal quota Kueue evicts the
  borrowing batch workloads (Evicted reason ``Preempted``, Preempted reason ``InCohortReclamation``, message
  "Preempted to accommodate a workload ... due to reclamation within the cohort");
* ``pkg/controller/jobs/pod/pod_controller.go`` ``Stop``: the evicted pod gets ``TerminationTarget`` (reason
  ``WorkloadEvictedDueToPreempted``) and is deleted: the worker stops gracefully, the backend reports PREEMPTED
  and the unit is launched again (``-p1``), which Kueue admits once the online pod has finished.

Measured and written to ``$DAGSTER_GPU_KUEUE_RESULT`` (bench/kueue_reclaim.py merges it into
bench/results/summary.json): ``reclaimed_ok``, ``online_wait_s`` (online pod created -> its Workload admitted, while
batch borrowed), ``units_without_bill`` (pods that ran without a pod-interval bill).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
from kubernetes import client

from tests.k8s_helpers import NAMESPACE, admin_api, executor_api, wait_for
from tests.test_k8s_e2e import _backfill, _leftovers, _observation, k8s_instance  # noqa: F401  (fixture)

pytestmark = [pytest.mark.k8s, pytest.mark.e2e, pytest.mark.postgres]

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "resources/k8s/kueue/example/mixed-cluster.yaml"
KQ = ("kueue.x-k8s.io", "v1beta2")
ONLINE_CLASS = "1g.10gb.mig.nvidia.com"


def _apply_example() -> None:
    from tests.k8s_helpers import K8S_DIR

    subprocess.run([sys.executable, str(REPO / "resources/k8s/kubetool.py"), "--kubeconfig",
                    str(K8S_DIR / "admin.kubeconfig"), "apply", str(EXAMPLE)], check=True, capture_output=True)
    custom = client.CustomObjectsApi(admin_api())

    def active():
        cqs = custom.list_cluster_custom_object(*KQ, "clusterqueues")["items"]
        ok = {c["metadata"]["name"] for c in cqs if any(x["type"] == "Active" and x["status"] == "True"
                                                         for x in (c.get("status") or {}).get("conditions") or [])}
        return {"online", "batch"} <= ok
    wait_for(active, 60, interval=0.5, what="ClusterQueues online and batch Active (is Kueue running?)")


def _online_objects(name: str) -> tuple[dict, dict]:
    """A ResourceClaimTemplate for both 1g.10gb slices and an online pod in LocalQueue ``online`` (Pod Security
    "restricted", as the namespace enforces), priority class ``online``."""
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": ONLINE_CLASS, "allocationMode": "ExactCount", "count": 2}}]}}}}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": NAMESPACE,
                        "labels": {"kueue.x-k8s.io/queue-name": "online", "kueue.x-k8s.io/priority-class": "online"}},
           "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
                    "containers": [{"name": "serve", "image": "online:dev", "command": ["sleep", "8"],
                                    "resources": {"claims": [{"name": "gpu"}]},
                                    "securityContext": {"allowPrivilegeEscalation": False,
                                                        "capabilities": {"drop": ["ALL"]}}}]}}
    return template, pod


def _workload_of(custom, uid: str) -> dict | None:
    items = custom.list_namespaced_custom_object(*KQ, NAMESPACE, "workloads",
                                                 label_selector=f"kueue.x-k8s.io/job-uid={uid}")["items"]
    return items[0] if items else None


def _cond(wl: dict | None, typ: str) -> dict | None:
    return next((c for c in ((wl or {}).get("status") or {}).get("conditions") or [] if c["type"] == typ), None)


def test_kueue_reclaims_borrowed_gpus_from_a_backfill_whose_evicted_units_resume(k8s_instance, tmp_path, monkeypatch):
    from dagster_gpu.k8s.manifests import LABEL_MANAGED_BY, MANAGED_BY
    from tests import k8s_pipeline as p

    instance, keys = k8s_instance, p.KEYS[40:44]
    _apply_example()
    monkeypatch.setenv("K8S_TEST_QUEUE_NAME", "batch")
    monkeypatch.setenv("K8S_TEST_MAX_PREEMPTIONS", "3")
    core, admin_core = client.CoreV1Api(executor_api()), client.CoreV1Api(admin_api())
    custom = client.CustomObjectsApi(admin_api())
    resource = client.ResourceV1Api(admin_api())
    online = f"online-{int(time.time())}"
    seen: dict[str, object] = {}

    def batch_pods():
        return [x for x in core.list_namespaced_pod(NAMESPACE, label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}").items
                if x.metadata.labels.get("kueue.x-k8s.io/queue-name") == "batch"]

    def reclaim(bid):
        running = wait_for(lambda: (lambda r: r if len(r) == 2 else None)(
            [x for x in batch_pods() if x.status.phase == "Running"]), 300, interval=0.5,
            what="two batch step pods running on borrowed quota")
        # no wait for the step workers' asset body: a SIGTERM before it is a preemption too (worker/step_main.py)
        # a mig_ok request with a queue is admitted: its template asks exactly for the profile's DeviceClass
        for pod in running:
            t = resource.read_namespaced_resource_claim_template(pod.metadata.name, NAMESPACE).spec.spec.devices.requests[0]
            assert t.first_available is None and t.exactly.device_class_name == ONLINE_CLASS and not t.exactly.selectors
            wl = _workload_of(custom, pod.metadata.uid)
            assert wl["status"]["admission"]["clusterQueue"] == "batch"
            assert wl["status"]["admission"]["podSetAssignments"][0]["flavors"]["nvidia.com/mig-1g.10gb"] == "mig-1g.10gb"
        seen["borrowers"] = sorted(x.metadata.uid for x in running)
        template, pod = _online_objects(online)
        resource.create_namespaced_resource_claim_template(NAMESPACE, template)
        t0 = time.monotonic()
        created = admin_core.create_namespaced_pod(NAMESPACE, pod)
        wait_for(lambda: (lambda w: w if (_cond(w, "Admitted") or {}).get("status") == "True" else None)(
            _workload_of(custom, created.metadata.uid)), 120, interval=0.1, what="the online workload admitted")
        seen["online_wait_s"] = round(time.monotonic() - t0, 2)
        seen["online_uid"] = created.metadata.uid

    try:
        bid, final = _backfill(instance, p.k8s_preemptible, keys, tmp_path, sleep_s=20, timeout_s=600, on_running=reclaim)
        # Kueue's record of what it did to the borrowers: evicted for the online workload, by reclamation
        evictions = []
        for uid in seen["borrowers"]:
            wl = _workload_of(custom, uid)
            if wl is not None:
                evictions.append((_cond(wl, "Evicted") or {}, _cond(wl, "Preempted") or {}))
        online_pod = admin_core.read_namespaced_pod(online, NAMESPACE)
    finally:
        for fn in (lambda: admin_core.delete_namespaced_pod(online, NAMESPACE, grace_period_seconds=0),
                   lambda: resource.delete_namespaced_resource_claim_template(online, NAMESPACE)):
            try:
                fn()
            except client.ApiException:
                pass

    runs = [r.dagster_run for r in instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": bid}))]
    stories = {r.run_id: [e.event_log_entry.dagster_event for e in instance.get_records_for_run(
        r.run_id, of_type=dg.DagsterEventType.STEP_WORKER_STARTING).records] for r in runs}
    assert (final.succeeded, final.failed) == (4, 0), (tmp_path / "daemon.log").read_text()[-3000:]
    assert online_pod.status.phase == "Succeeded"

    # every partition materialized once, by its last pod
    for pk in keys:
        recs = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=p.k8s_preemptible.key,
                                                                     asset_partitions=[pk]), limit=5).records
        assert len(recs) == 1, f"{pk} materialized {len(recs)} times"

    # both borrowers were evicted by Kueue to reclaim the quota, and launched again (-p1) through the queue
    relaunched = [e for evs in stories.values() for e in evs if "dagster_gpu/preemptions" in e.engine_event_data.metadata]
    assert len(relaunched) == 2, {k: [e.message for e in v] for k, v in stories.items()}
    assert all("WorkloadEvictedDueToPreempted" in e.message and "reclamation within the cohort" in e.message
               for e in relaunched), [e.message for e in relaunched]
    assert all(ev.get("reason") == "Preempted" and pre.get("reason") == "InCohortReclamation"
               and seen["online_uid"] in ev.get("message", "") for ev, pre in evictions), evictions

    # every pod that ran was billed from its running interval (each attempt its own bill)
    launched = {e.engine_event_data.metadata["k8s/pod"].value for evs in stories.values() for e in evs}
    billed = wait_for(lambda: (lambda b: b if launched <= b else None)(
        {o["k8s/pod"] for pk in keys for o in _observation(instance, p.k8s_preemptible.key, pk)}),
        90, interval=1, what="a pod-interval bill for every launched pod")
    without_bill = len(launched - billed)
    assert len(launched) == 4 + len(relaunched) and without_bill == 0
    obs = [o for pk in keys for o in _observation(instance, p.k8s_preemptible.key, pk)]
    assert all(o.get("kueue/cluster_queue") == "batch" and o.get("kueue/local_queue") == "batch" for o in obs), obs

    # the online workload's admission did not wait for the batch units to finish (they run 20 s each)
    assert seen["online_wait_s"] < 15, seen
    assert wait_for(lambda: _leftovers([r.run_id for r in runs]) == {"pods": [], "claims": [], "templates": []}, 90,
                    what="cleanup")
    out = os.environ.get("DAGSTER_GPU_KUEUE_RESULT")
    if out:
        Path(out).write_text(json.dumps({"reclaimed_ok": True, "online_wait_s": seen["online_wait_s"],
                                         "units_without_bill": without_bill, "units": len(launched),
                                         "evicted_units": len(relaunched)}, indent=1))
