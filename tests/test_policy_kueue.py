"""Behind a Kueue LocalQueue the Kubernetes wait is the queue's: its ClusterQueue's free and borrowable quota and
the workloads pending ahead (dagster_gpu.k8s.kueue.queue_state -> policy._wait), named in the reason.

The ClusterQueue / LocalQueue JSON is shaped as sigs.k8s.io/kueue v0.17.0 serves it
(``apis/kueue/v1beta2/clusterqueue_types.go``: ``spec.cohortName``, ``resourceGroups[].flavors[].resources[]``
{name, nominalQuota, borrowingLimit, lendingLimit}, ``status.flavorsReservation[].resources[]`` {name, total,
borrowed}, condition ``Active``; ``localqueue_types.go``: ``spec.clusterQueue``, ``status.pendingWorkloads``,
``admittedWorkloads``), as resources/k8s/kueue/example/mixed-cluster.yaml declares them.
"""

from __future__ import annotations

import pytest

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.k8s import kueue
from dagster_gpu.policy.policy import NoFeasiblePlacement
from dagster_gpu.policy import DeviceGroup, GpuRequest, KubernetesState, RuntimeModel, Snapshot, StepSize, decide

A100 = "NVIDIA A100-SXM4-80GB"
MIG = "mig-1g.10gb"
MODEL = RuntimeModel(texts_per_second=2000.0, n_history=3)
POOLS = (DeviceGroup(A100, A100, 80.0, 2, 2), DeviceGroup(MIG, A100, 10.0, 7, 7, mig_profile="1g.10gb"))


def _cq(name, gpu, mig, used_gpu=0, used_mig=0, borrowing_limit=None, active=True):
    def res(r, q):
        out = {"name": r, "nominalQuota": q}
        if borrowing_limit is not None:
            out["borrowingLimit"] = borrowing_limit
        return out
    return {"metadata": {"name": name},
            "spec": {"cohortName": "gpus", "resourceGroups": [
                {"coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": "a100-80gb", "resources": [res("nvidia.com/gpu", gpu)]}]},
                {"coveredResources": ["nvidia.com/mig-1g.10gb"],
                 "flavors": [{"name": MIG, "resources": [res("nvidia.com/mig-1g.10gb", str(mig))]}]}]},
            "status": {"conditions": [{"type": "Active", "status": "True" if active else "False", "reason": "Ready"}],
                       "flavorsReservation": [
                           {"name": "a100-80gb", "resources": [{"name": "nvidia.com/gpu", "total": str(used_gpu)}]},
                           {"name": MIG, "resources": [{"name": "nvidia.com/mig-1g.10gb", "total": str(used_mig)}]}]}}


def _lq(pending=0, admitted=0):
    return {"metadata": {"name": "batch"}, "spec": {"clusterQueue": "batch"},
            "status": {"pendingWorkloads": pending, "admittedWorkloads": admitted}}


def test_batch_borrows_what_online_leaves_idle():
    online, batch = _cq("online", 2, 2, used_gpu=1), _cq("batch", 0, 0, used_mig=1)
    q = kueue.queue_state(_lq(pending=1, admitted=1), [online, batch], "batch", POOLS)
    assert (q.cluster_queue, q.pending, q.admitted, q.active) == ("batch", 1, 1, True)
    # gpu: online's 2 nominal, 1 used -> 1 to lend; mig: 2 nominal, batch already borrows 1 -> 1 more
    assert dict(q.quota_free) == {A100: 1.0, MIG: 1.0} and dict(q.quota_total) == {A100: 2.0, MIG: 2.0}
    capped = kueue.queue_state(_lq(), [online, _cq("batch", 0, 0, borrowing_limit=0)], "batch", POOLS)
    assert dict(capped.quota_free) == {A100: 0.0, MIG: 0.0} and dict(capped.quota_total) == {A100: 0.0, MIG: 0.0}


def test_a_missing_local_or_cluster_queue_is_inactive():
    assert not kueue.queue_state(None, [], "nope", POOLS).active
    q = kueue.queue_state(_lq(), [], "batch", POOLS)
    assert (q.active, q.cluster_queue) == (False, "")


def _decide(q, req=GpuRequest(mig_ok=True)):
    snap = Snapshot(rate_card=RateCard.load(), kubernetes=KubernetesState(pools=POOLS, queue=q))
    return decide(req, StepSize(rows=100_000), snap, model=MODEL)


def test_the_wait_is_the_queues_and_the_reason_names_it():
    free = kueue.queue_state(_lq(), [_cq("online", 2, 2), _cq("batch", 0, 0)], "batch", POOLS)
    p = _decide(free)
    assert p.device == MIG and p.alternatives
    mig = next(a for a in p.alternatives if a.device == MIG)
    assert mig.start_delay_s == KubernetesState().launch_latency_s  # quota free, nothing ahead: no wait
    assert "Kueue LocalQueue batch -> ClusterQueue batch: 0 pending, 0 admitted, quota for mig-1g.10gb 2 free of 2" in p.reason
    # the devices are idle but the quota is taken and 3 workloads wait ahead: waves of this step's runtime
    full = kueue.queue_state(_lq(pending=3, admitted=2), [_cq("online", 2, 2, used_gpu=2), _cq("batch", 0, 0, used_mig=2)],
                             "batch", POOLS)
    busy = next(a for a in _decide(full).alternatives if a.device == MIG)
    assert busy.start_delay_s == pytest.approx(KubernetesState().launch_latency_s + 2 * busy.runtime_s)
    assert "quota for mig-1g.10gb 0 free of 2: queue estimate 2 wave(s)" in busy.note


def test_a_pool_without_quota_or_an_inactive_queue_is_infeasible():
    q = kueue.queue_state(_lq(), [_cq("online", 0, 2), _cq("batch", 0, 0)], "batch", POOLS)
    with pytest.raises(NoFeasiblePlacement) as e:
        _decide(q, GpuRequest())
    gpu = next(a for a in e.value.alternatives if a.device == A100)
    assert not gpu.feasible and gpu.note.endswith("quota for NVIDIA A100-SXM4-80GB 0 free of 0: never admitted (less "
                                                  "quota than 1 device(s))")
    with pytest.raises(NoFeasiblePlacement, match="ClusterQueue \\(none\\): 0 pending, 0 admitted, inactive, quota for "
                                                  "NVIDIA A100-SXM4-80GB 0 free of 0: never admitted \\(the ClusterQueue is inactive\\)"):
        _decide(kueue.queue_state(None, [], "batch", POOLS), GpuRequest())


def test_the_queue_travels_in_a_saved_snapshot():
    q = kueue.queue_state(_lq(pending=1), [_cq("online", 2, 2), _cq("batch", 0, 0)], "batch", POOLS)
    snap = Snapshot(rate_card=RateCard.load(), kubernetes=KubernetesState(pools=POOLS, queue=q))
    back = Snapshot.loads(__import__("json").dumps(snap.to_json()))
    assert back.kubernetes.queue == q
    assert "Kueue LocalQueue batch -> ClusterQueue batch: 1 pending" in decide(GpuRequest(mig_ok=True), StepSize(rows=1000),
                                                                                back, model=MODEL).reason


def test_whatif_names_the_queue_and_its_state_in_the_table_and_each_placement(tmp_path, capsys, monkeypatch):
    import json

    from dagster_gpu.commands.whatif import whatif_main

    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(2):
        (corpus / f"day{i}.jsonl").write_bytes(b"x" * 200_000)
    q = kueue.queue_state(_lq(pending=1, admitted=1), [_cq("online", 2, 2), _cq("batch", 0, 0, used_mig=1)], "batch", POOLS)
    snap = tmp_path / "snap.json"
    snap.write_text(json.dumps(Snapshot(rate_card=RateCard.load(), kubernetes=KubernetesState(pools=POOLS, queue=q)).to_json()))
    args = [str(corpus), "--snapshot", str(snap), "--tag", "dagster-gpu/mig-ok=true"]
    assert whatif_main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    # batch borrows 1 of online's 2 slices already and 1 workload waits ahead: 1 free of 2
    assert ("queue on kubernetes: Kueue LocalQueue batch -> ClusterQueue batch: 1 pending, 1 admitted, quota for "
            "mig-1g.10gb 1 free of 2") in out
    assert kueue.queue_lines(None, []) == []
    assert kueue.queue_lines(q, []) == ["queue on kubernetes: Kueue LocalQueue batch -> ClusterQueue batch: 1 pending, "
                                        "1 admitted"]


def _summary(*local_queues: str) -> dict:
    """A ``PendingWorkloadsSummary`` as Kueue v0.17.0's visibility server returns it for a ClusterQueue
    (``apis/visibility/v1beta1/types.go``; ``pkg/visibility/storage/pending_workloads_cq.go`` numbers
    ``positionInClusterQueue`` from 0 in the queue's order)."""
    return {"kind": "PendingWorkloadsSummary", "apiVersion": "visibility.kueue.x-k8s.io/v1beta1", "metadata": {},
            "items": [{"metadata": {"name": f"pod-w{i}", "namespace": "dagster-gpu"}, "priority": 0,
                       "localQueueName": lq, "positionInClusterQueue": i,
                       "positionInLocalQueue": list(local_queues[:i + 1]).count(lq) - 1}
                      for i, lq in enumerate(local_queues)]}


def test_the_visibility_api_counts_every_workload_ahead_in_the_cluster_queue_and_its_absence_falls_back():
    assert kueue.pending_ahead(None) is None and kueue.pending_ahead(_summary()) == 0
    # three workloads wait in ClusterQueue batch, one of them from another team's LocalQueue: all are ahead
    ahead = _summary("batch", "other-team", "batch")
    assert kueue.pending_ahead(ahead) == 3
    cqs = [_cq("online", 2, 2, used_mig=2), _cq("batch", 0, 0)]
    seen = kueue.queue_state(_lq(pending=2), cqs, "batch", POOLS, pending_workloads=ahead)
    assert seen.pending == 3  # not the LocalQueue's 2
    assert kueue.queue_state(_lq(pending=2), cqs, "batch", POOLS, pending_workloads=None).pending == 2
    busy = next(a for a in _decide(seen).alternatives if a.device == MIG)
    assert "ClusterQueue batch: 3 pending" in busy.note and busy.start_delay_s > KubernetesState().launch_latency_s
