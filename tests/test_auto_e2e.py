"""``backend: auto`` end to end across both test clusters: the cost policy places each partition step of a
real daemon backfill on the local Slurm cluster or on the Kubernetes control plane, from their live state
and the rate card, and the placement it recorded is the one the step ran on.

With resources/ratecard.yaml (A100-80GB: Slurm 1.20, Kubernetes 2.40 USD per GPU-hour; a MIG 1g.10gb
slice 1/7 of its GPU's rate) and free devices on both clusters, a whole-GPU step is cheapest as a Slurm
array task and a MIG-acceptable step on a Kubernetes MIG slice. Needs resources/slurm/cluster.sh,
resources/k8s/cluster.sh and resources/postgres/postgres.sh running; skips with the reason otherwise.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from tests import slurm_helpers as H
from tests.conftest import REPO
from tests.k8s_helpers import NAMESPACE, k8s_dagster_instance

pytestmark = [pytest.mark.slurm, pytest.mark.k8s, pytest.mark.e2e, pytest.mark.postgres]


@pytest.fixture
def instance(pg, slurm_cluster, tmp_path, monkeypatch):
    """On each local Slurm cluster (22.05 and 24.11: fixture slurm_cluster sets SLURM_CONF, PATH and the
    array tasks' interpreter) with the Kubernetes control plane."""
    monkeypatch.setenv("DAGSTER_GPU_SLURM_SPOOL", str(tmp_path / "slurm-spool"))
    with k8s_dagster_instance(pg, tmp_path, monkeypatch, max_runs=10) as inst:
        yield inst


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace.yaml"
    ws.write_text(
        f"load_from:\n  - python_file:\n      relative_path: {REPO / 'tests' / 'auto_pipeline.py'}\n"
        f"      working_directory: {REPO}\n      location_name: auto\n"
    )
    return ws


def _failures(instance) -> str:
    """The error messages of every failed run (for the assertion message)."""
    from dagster._core.events import DagsterEventType

    out = []
    for run in instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE])):
        for rec in instance.get_records_for_run(run.run_id).records:
            ev = rec.event_log_entry.dagster_event
            err = getattr(ev.event_specific_data, "error", None) if ev else None
            if ev and err is not None and ev.event_type in (DagsterEventType.STEP_FAILURE, DagsterEventType.RUN_FAILURE, DagsterEventType.ENGINE_EVENT):
                out.append(f"{run.tags.get('dagster/partition')} {ev.event_type_value}: {err.to_string()[:1500]}")
    return "\n".join(out) or "no error event recorded"


def _cheapest(md: dict, backend: str) -> dict:
    """The cheapest feasible alternative of ``backend`` in the placement a step recorded."""
    return min((a for a in md["test/placement"]["alternatives"] if a["backend"] == backend and a["feasible"]), key=lambda a: a["cost_usd"])


# 22.05 only (284 s on 24.11, a loaded 2-CPU host): what the policy reads of Slurm (GPUs in use from sinfo
# GresUsed, --test-only) runs on 24.11 in test_slurm_e2e's policy_state test and on the recorded 24.11 outputs.
@H.on_slurm("22.05")
def test_auto_backfill_puts_whole_gpus_on_slurm_and_mig_steps_on_kubernetes(instance, tmp_path):
    from dagster_gpu.commands.backfill import DaemonProcess, submit_asset_backfill, wait_for_backfill
    from tests import auto_pipeline as p

    keys = p.KEYS[:3]
    whole = submit_asset_backfill(instance, p.defs, p.auto_whole.key, keys, tags={"test/sleep": "1"})
    mig = submit_asset_backfill(instance, p.defs, p.auto_mig.key, keys, tags={"test/sleep": "1"})
    with DaemonProcess(_workspace(tmp_path), log_file=tmp_path / "daemon.log") as daemon:
        finals = [wait_for_backfill(instance, bid, len(keys), timeout_s=600, daemon=daemon) for bid in (whole, mig)]
    assert [(f.succeeded, f.failed) for f in finals] == [(3, 0), (3, 0)], _failures(instance)

    def materialization(asset, pk) -> dict:
        recs = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=asset.key, asset_partitions=[pk]), limit=5).records
        assert len(recs) == 1, f"{asset.key.to_user_string()} {pk} materialized {len(recs)} times"
        return {k: v.value for k, v in recs[0].asset_materialization.metadata.items()}

    for pk in keys:
        w, m = materialization(p.auto_whole, pk), materialization(p.auto_mig, pk)
        print(f"{pk}: whole GPU -> {w['test/placement']['reason']}\n{pk}: mig-ok -> {m['test/placement']['reason']}")
        # a whole A100-80GB: Slurm at 1.20 USD/GPU-h beats Kubernetes at 2.40; it ran as an array task
        assert w["test/backend"] == "slurm" and w["test/placement"]["backend"] == "slurm"
        assert w["slurm/array_job_id"] > 0 and w["test/cuda_visible_devices"] in {"0", "1", "2", "3"}
        assert _cheapest(w, "kubernetes")["cost_usd"] > _cheapest(w, "slurm")["cost_usd"]
        # mig-ok: a 1g.10gb slice (1/7 of 2.40) beats a whole Slurm GPU; the node exposed a MIG device
        assert m["test/backend"] == "kubernetes" and m["test/placement"]["device"] == "mig-1g.10gb"
        # the driver's CDI spec gives a DRA container NVIDIA_VISIBLE_DEVICES=void and no CUDA_VISIBLE_DEVICES
        assert m["k8s/namespace"] == NAMESPACE and m["test/nvidia_visible_devices"] == "void"
        assert m["test/cuda_visible_devices"] == ""
        assert _cheapest(m, "kubernetes")["device"] == "mig-1g.10gb"
        assert _cheapest(m, "kubernetes")["cost_usd"] < _cheapest(m, "slurm")["cost_usd"]
