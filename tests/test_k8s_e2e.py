"""gpu_executor's kubernetes backend end to end on the real control plane (resources/k8s/cluster.sh) with a
PostgreSQL Dagster instance: backfills run by the real daemon, one run per partition, each step in a pod
whose GPU is a DRA ResourceClaim allocated by kube-scheduler; the executor authenticates as its
ServiceAccount (least privilege), the PostgreSQL password reaches pods only as a Secret reference.
"""

from __future__ import annotations

import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.execution.backfill import BulkActionStatus
from kubernetes import client

from tests.k8s_helpers import NAMESPACE, admin_api, executor_api, k8s_dagster_instance, labelled, wait_for
from tests.conftest import REPO

pytestmark = [pytest.mark.k8s, pytest.mark.e2e, pytest.mark.postgres]

PIPELINE = REPO / "tests" / "k8s_pipeline.py"
MIG_PROFILE_OF = {}  # device name -> MIG profile, from the ResourceSlice


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace.yaml"
    ws.write_text(f"load_from:\n  - python_file:\n      relative_path: {PIPELINE}\n      working_directory: {REPO}\n"
                  "      location_name: k8s\n")
    return ws


@pytest.fixture
def k8s_instance(pg, tmp_path, monkeypatch):
    """A fresh PostgreSQL-backed DAGSTER_HOME (10 concurrent runs), the PostgreSQL Secret in the namespace,
    and the executor's kubeconfig in the environment. Yields the DagsterInstance."""
    with k8s_dagster_instance(pg, tmp_path, monkeypatch, max_runs=10) as instance:
        yield instance


def _slice_profiles() -> dict[str, str]:
    if not MIG_PROFILE_OF:
        for s in client.ResourceV1Api(admin_api()).list_resource_slice(field_selector="spec.driver=gpu.nvidia.com").items:
            for d in s.spec.devices:
                MIG_PROFILE_OF[d.name] = d.attributes["profile"].string if "profile" in d.attributes else ""
    return MIG_PROFILE_OF


def _run_ids(instance, backfill_id) -> list[str]:
    return [r.dagster_run.run_id for r in instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))]


def _leftovers(run_ids) -> dict[str, list[str]]:
    from dagster_gpu.k8s.manifests import run_selector

    api = executor_api()
    out: dict[str, list[str]] = {"pods": [], "claims": [], "templates": []}
    for rid in run_ids:
        for k, v in labelled(api, run_selector(rid)).items():
            out[k] += v
    return out


def _sweep() -> int:
    """What the next orchestrating process's settler does: bill and delete pods whose run worker exited before
    they ended."""
    from dagster_gpu.k8s.backend import KubernetesBackend
    from dagster_gpu.executor.settle import Settler
    from dagster_gpu.k8s import manifests as m
    from dagster_gpu.k8s.client import KubeClient

    b = KubernetesBackend(KubeClient(executor_api(), NAMESPACE), m.PodSettings(namespace=NAMESPACE), settle_wait_s=0,
                          sweep_grace_s=0)
    return Settler().sweep(b)


def _observation(instance, asset_key, pk):
    recs = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[pk]), limit=5).records
    obs = [{k: v.value for k, v in r.asset_observation.metadata.items()} for r in recs]
    return [o for o in obs if o.get("bill/source") == "pod-interval"]


def _billed(instance, asset_key, pk):
    """``_observation`` after a sweep, as the next orchestrating process's settler sweeps every 5 s: the daemon
    stops with the backfill, so a run worker still in its exit wait is stopped with it, and its pod is billed by
    a sweep only once the node agent reports the pod ended (one sweep right after the backfill can be too early
    on a loaded host)."""
    _sweep()
    return _observation(instance, asset_key, pk)


def _backfill(instance, asset, keys, tmp_path, sleep_s, timeout_s=600, on_running=None):
    from dagster_gpu.commands.backfill import DaemonProcess, submit_asset_backfill, wait_for_backfill
    from tests import k8s_pipeline

    bid = submit_asset_backfill(instance, k8s_pipeline.defs, asset.key, keys, tags={"test/sleep": str(sleep_s)})
    with DaemonProcess(_workspace(tmp_path), log_file=tmp_path / "daemon.log") as daemon:
        if on_running:
            on_running(bid)
        final = wait_for_backfill(instance, bid, len(keys), timeout_s=timeout_s, daemon=daemon)
    return bid, final


def test_backfill_6_partitions_mig_claims(k8s_instance, tmp_path):
    from tests import k8s_pipeline as p

    instance = k8s_instance
    keys = p.KEYS[:5] + [p.KEYS[-1]]  # includes a key full of shell metacharacters and non-ASCII
    bid, final = _backfill(instance, p.k8s_mig, keys, tmp_path, sleep_s=1)
    assert (final.succeeded, final.failed) == (6, 0), (tmp_path / "daemon.log").read_text()[-3000:]
    time.sleep(3)
    print(f"pods settled by the sweep, not by their own run worker: {_sweep()}")
    profiles = _slice_profiles()
    devices_used = set()
    for pk in keys:
        recs = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=p.k8s_mig.key, asset_partitions=[pk]),
                                               limit=5).records
        assert len(recs) == 1, f"{pk} materialized {len(recs)} times"
        md = {k: v.value for k, v in recs[0].asset_materialization.metadata.items()}
        assert md["test/partition_key"] == pk
        assert md["k8s/namespace"] == NAMESPACE and md["k8s/pod"].startswith("dagster-gpu-")
        # as NVIDIA's driver does (its CDI spec): NVIDIA_VISIBLE_DEVICES=void, the devices come from the claim
        assert md["test/nvidia_visible_devices"] == "void"
        assert md["test/pg_password_set"] is True  # from the Secret reference
        obs = wait_for(lambda: _billed(instance, p.k8s_mig.key, pk), 30, interval=1.0, what=f"observation of {pk}")
        assert len(obs) == 1
        o = obs[0]
        assert o["k8s/pod"] == md["k8s/pod"] and o["k8s/resource_claim"].startswith(md["k8s/pod"] + "-gpu-")
        # the step read its own claim as the pod's ServiceAccount: the same claim and devices on the materialization
        assert "k8s/claim_unavailable_reason" not in md, md.get("k8s/claim_unavailable_reason")
        assert md["k8s/resource_claim"] == o["k8s/resource_claim"]
        assert md["k8s/allocated_devices"] == o["k8s/allocated_devices"]
        driver, pool, device = o["k8s/allocated_devices"].split("/")
        assert (driver, pool) == ("gpu.nvidia.com", "gpu-node-0")
        assert profiles[device] == "1g.10gb", device
        devices_used.add(device)
        assert o["gpu/device_fraction"] == pytest.approx(1 / 7)
        assert o["k8s/running_seconds"] >= 1.0
        assert o["bill/gpu_seconds"] == pytest.approx(o["k8s/running_seconds"] / 7, rel=1e-3)  # both rounded to 4 significant digits
        assert o["bill/cost_usd"] == pytest.approx(o["bill/gpu_seconds"] * o["bill/rate_usd_per_gpu_hour"] / 3600, rel=1e-3)
    assert len(devices_used) >= 2  # several slices were used
    assert _leftovers(_run_ids(instance, bid)) == {"pods": [], "claims": [], "templates": []}
    assert not Path("/tmp/pwned").exists()


def test_more_steps_than_devices_wait_then_run(k8s_instance, tmp_path):
    from tests import k8s_pipeline as p

    instance = k8s_instance
    keys = p.KEYS[20:23]  # 3 concurrent runs, 2 whole A100s on the node
    bid, final = _backfill(instance, p.k8s_gpu, keys, tmp_path, sleep_s=20)  # long enough to overlap
    assert (final.succeeded, final.failed) == (3, 0), (tmp_path / "daemon.log").read_text()[-3000:]
    time.sleep(3)
    print(f"pods settled by the sweep, not by their own run worker: {_sweep()}")
    spans = []
    for pk in keys:
        o = wait_for(lambda: _billed(instance, p.k8s_gpu.key, pk), 30, interval=1.0, what=f"observation of {pk}")[0]
        assert o["k8s/allocated_devices"] in ("gpu.nvidia.com/gpu-node-0/gpu-0", "gpu.nvidia.com/gpu-node-0/gpu-1")
        assert o["gpu/device_fraction"] == 1.0
        spans.append((o["k8s/started_at"], o["k8s/finished_at"], o["k8s/allocated_devices"]))
    # never more than 2 running at once, and on one device the runs did not overlap
    for t, _, _ in spans:
        assert sum(1 for s, f, _ in spans if s <= t < f) <= 2
    for dev in {d for _, _, d in spans}:
        ds = sorted((s, f) for s, f, d in spans if d == dev)
        assert all(ds[i][1] <= ds[i + 1][0] + 1 for i in range(len(ds) - 1)), ds  # 1 s timestamp resolution
    # the extra pods waited: the scheduler reported them unschedulable first
    core = client.CoreV1Api(executor_api())
    evs = core.list_namespaced_event(NAMESPACE).items
    ours = {o["k8s/pod"] for pk in keys for o in _observation(instance, p.k8s_gpu.key, pk)}
    waited = {e.involved_object.name for e in evs if e.reason == "FailedScheduling" and e.involved_object.name in ours}
    assert len(waited) >= 1
    assert _leftovers(_run_ids(instance, bid)) == {"pods": [], "claims": [], "templates": []}


def test_impossible_request_fails_with_scheduler_message(k8s_instance, monkeypatch):
    from tests import k8s_pipeline as p

    import importlib

    monkeypatch.setenv("K8S_TEST_PENDING_TIMEOUT", "8")
    importlib.reload(p)  # the executor config is read from the environment at import
    instance = k8s_instance
    t0 = time.monotonic()
    result = dg.execute_job(dg.reconstructable(p.get_impossible_job), instance=instance,
                            tags={"dagster/partition": p.KEYS[40]})
    elapsed = time.monotonic() - t0
    assert not result.success
    failures = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert len(failures) == 1
    msg = failures[0].step_failure_data.error.message
    assert "FailedScheduling" in msg and "cannot allocate all claims" in msg, msg
    assert "pending_timeout_seconds=8" in msg
    assert elapsed < 8 + 40, elapsed  # timeout + process start-up and one health-check period
    wait_for(lambda: _leftovers([result.run_id]) == {"pods": [], "claims": [], "templates": []}, 30, what="cleanup")


def test_terminate_mid_backfill_leaves_no_pod_or_claim(k8s_instance, tmp_path):
    from tests import k8s_pipeline as p

    instance = k8s_instance
    keys = p.KEYS[50:53]  # 3 runs: 2 get a GPU and run, 1 waits for one
    seen = {}

    def cancel_when_running(bid):
        def running_pods():
            rids = _run_ids(instance, bid)
            if len(rids) < len(keys):
                return False
            pods = client.CoreV1Api(executor_api()).list_namespaced_pod(NAMESPACE, label_selector="dagster-gpu/test=e2e").items
            mine = [x for x in pods if x.metadata.labels.get("dagster/run-id") in rids]
            run = [x for x in mine if x.status.phase == "Running"]
            return len(mine) == len(keys) and len(run) == 2 and rids
        rids = wait_for(running_pods, 240, interval=0.5, what="2 running pods and 1 pending")
        seen["runs"] = rids
        # Cancel the backfill as the UI does, and terminate each run (run coordinator -> run worker -> terminate_step)
        bf = instance.get_backfill(bid)
        instance.update_backfill(bf.with_status(BulkActionStatus.CANCELING))
        for rid in rids:
            instance.run_coordinator.cancel_run(rid)
        wait_for(lambda: all(instance.get_run_by_id(r).status in (dg.DagsterRunStatus.CANCELED, dg.DagsterRunStatus.FAILURE)
                             for r in rids), 120, what="runs to be canceled")

    bid, final = _backfill(instance, p.k8s_gpu, keys, tmp_path, sleep_s=120, timeout_s=300, on_running=cancel_when_running)
    assert final.succeeded == 0
    statuses = {instance.get_run_by_id(r).status for r in seen["runs"]}
    assert statuses == {dg.DagsterRunStatus.CANCELED}, statuses
    wait_for(lambda: _leftovers(seen["runs"]) == {"pods": [], "claims": [], "templates": []}, 60, what="no pod or claim left")


def test_killed_run_worker_is_resumed_and_reattaches_to_its_pod(k8s_instance, tmp_path):
    """The orchestrating process dies (SIGKILL) while its step runs in a pod: the pod keeps running; the
    run, resumed as Dagster's run monitoring resumes it (``dagster api resume_run``), re-attaches to that
    pod by the handle in its event log, the partition materializes once from it, and the resumed process
    finalizes it (pod-interval observation, nothing left)."""
    import subprocess
    import sys

    from tests import k8s_pipeline as p
    from tests.resume_helpers import launch_handle, resume_and_check_reattached

    instance, key = k8s_instance, p.KEYS[20]
    code = ("import sys, dagster as dg\nfrom dagster._core.definitions.reconstruct import ReconstructableJob\n"
            "with dg.DagsterInstance.get() as i:\n"
            f"    dg.execute_job(ReconstructableJob.for_file({str(PIPELINE)!r}, 'get_mig_job'), instance=i,\n"
            f"                   tags={{'dagster/partition': {key!r}, 'test/sleep': '20'}})\n")
    with open(tmp_path / "run.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)

    run = wait_for(lambda: next(iter(instance.get_runs(dg.RunsFilter(tags={"dagster/partition": key}))), None), 120,
                   interval=1, what="the run")
    handle = wait_for(lambda: launch_handle(instance, run.run_id), 120, interval=1, what="the step's launch")
    core = client.CoreV1Api(executor_api())
    wait_for(lambda: core.read_namespaced_pod(handle["pod"], NAMESPACE).status.phase == "Running", 60, what="pod running")
    proc.kill()
    proc.wait(timeout=30)
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED
    pod = core.read_namespaced_pod(handle["pod"], NAMESPACE)
    assert pod.metadata.uid == handle["pod_uid"] and pod.metadata.deletion_timestamp is None  # left running
    resume_and_check_reattached(instance, run, tmp_path / "resume.log")
    recs = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=p.k8s_mig.key, asset_partitions=[key]), limit=5).records
    assert len(recs) == 1 and recs[0].asset_materialization.metadata["k8s/pod"].value == handle["pod"]
    obs = wait_for(lambda: _observation(instance, p.k8s_mig.key, key), 30, what="pod-interval observation")
    assert obs[0]["k8s/pod"] == handle["pod"] and obs[0]["k8s/running_seconds"] >= 20
    assert wait_for(lambda: _leftovers([run.run_id]) == {"pods": [], "claims": [], "templates": []}, 60, what="cleanup")


def test_a_slow_image_pull_is_progress_not_a_stuck_pod(k8s_instance, monkeypatch):
    """The node's first pull of the step image takes 8 s (the node agent pulls ``*slow-pull*`` images that long,
    emitting the kubelet's Pulling/Pulled events) while create_timeout_seconds is 4: the step waits for the
    pull and succeeds."""
    import importlib
    import uuid

    from tests import k8s_pipeline as p

    monkeypatch.setenv("K8S_TEST_IMAGE", f"registry.example.com/slow-pull/dagster-gpu:{uuid.uuid4().hex[:12]}")
    monkeypatch.setenv("K8S_TEST_CREATE_TIMEOUT", "4")
    importlib.reload(p)
    t0 = time.monotonic()
    from dagster._core.definitions.reconstruct import ReconstructableJob

    result = dg.execute_job(ReconstructableJob.for_file(str(PIPELINE), "get_mig_job"), instance=k8s_instance,
                            tags={"dagster/partition": p.KEYS[60]})
    elapsed = time.monotonic() - t0
    failures = [e.step_failure_data.error.message for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert result.success, failures
    assert elapsed > 8, elapsed  # it did wait for the pull
    pod = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION) \
        .event_specific_data.materialization.metadata["k8s/pod"].value
    reasons = [e.reason for e in client.CoreV1Api(admin_api()).list_namespaced_event(
        NAMESPACE, field_selector=f"involvedObject.name={pod}").items]
    assert reasons.index("Pulling") < reasons.index("Pulled") < reasons.index("Started"), reasons
    obs = wait_for(lambda: _observation(k8s_instance, p.k8s_mig.key, p.KEYS[60]), 30, what="pod-interval observation")
    assert obs[0]["k8s/pod"] == pod  # billed and settled before the instance goes away
    wait_for(lambda: _leftovers([result.run_id]) == {"pods": [], "claims": [], "templates": []}, 30, what="cleanup")


def test_a_sharing_config_the_driver_refuses_fails_at_once_with_the_kubelets_message(k8s_instance, monkeypatch):
    """A TimeSlicing GpuConfig while the driver's TimeSlicingSettings feature gate is off (as NVIDIA's driver
    ships, pkg/featuregates/featuregates.go): the kubelet reports FailedPrepareDynamicResources and the pod
    would stay ContainerCreating; the step fails at once with that message, long before create_timeout_seconds."""
    import importlib

    from tests import k8s_pipeline as p

    monkeypatch.setenv("K8S_TEST_SHARING", "TimeSlicing")
    monkeypatch.setenv("K8S_TEST_CREATE_TIMEOUT", "120")
    importlib.reload(p)
    t0 = time.monotonic()
    result = dg.execute_job(dg.reconstructable(p.get_shared_job), instance=k8s_instance,
                            tags={"dagster/partition": p.KEYS[61]})
    elapsed = time.monotonic() - t0
    assert not result.success
    failures = [e.step_failure_data.error.message for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert len(failures) == 1
    msg = failures[0]
    assert "its DRA devices could not be prepared" in msg and "FailedPrepareDynamicResources: Failed to prepare " \
        "dynamic resources: NodePrepareResources failed for claim dagster-gpu/" in msg, msg
    assert "invalid GPU sharing settings: &{TimeSlicing" in msg, msg
    assert elapsed < 60, elapsed  # not the 120 s create timeout
    from dagster_gpu.k8s.sharing_failures import SharingFailures, default_path

    blocked = SharingFailures(default_path()).blocked()  # the instance's memory: no more shared placements there
    assert blocked and all("invalid GPU sharing settings" in r for r in blocked.values()), blocked
    wait_for(lambda: _leftovers([result.run_id]) == {"pods": [], "claims": [], "templates": []}, 30, what="cleanup")
