"""Ranged runs end to end on the real clusters: a 40-partition backfill of the embedding asset in runs of 10,
with one undecodable file and one work unit SIGKILLed mid-range, on the local Slurm cluster and on the
Kubernetes 1.34 control plane (fake DRA GPU node whose agent runs pods as local processes).

Expected: every good partition materialized exactly once with its own metadata; the undecodable one failed
with its reason; the killed unit's step retried (RetryPolicy(max_retries=1)) and the retry embedded only the
partitions the killed unit had not finished; nothing left in squeue / no pod, claim or template left; each
unit's scheduler bill (sacct, pod interval) split over its partitions adds up to the unit's figure.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import dagster as dg
import psutil
import pytest

from tests.conftest import FORTUNES, REPO

N, PER_RUN, BAD, KILL_RANGE = 40, 10, 5, 2  # partition 5 is undecodable; the unit of range 2 (20-29) is killed


def make_corpus(d: Path, n: int = N, records: int = 30) -> list[str]:
    """``n`` files of ``records`` fortune records each; file ``BAD`` holds invalid UTF-8."""
    text = (FORTUNES / "fortunes").read_text(encoding="utf-8")
    recs = [r.strip() for r in text.split("\n%\n") if r.strip()]
    d.mkdir(parents=True, exist_ok=True)
    names = [f"f{i:03d}.txt" for i in range(n)]
    for i, name in enumerate(names):
        chunk = recs[(i * records) % len(recs):][:records]
        (d / name).write_text("\n%\n".join(chunk) + "\n")
    (d / names[BAD]).write_bytes(b"fine record\n%\nhe\xffllo world\n")
    return names


def _worker_pids(run_id: str) -> list[int]:
    """Step-worker processes of ``run_id`` on this host (Slurm tasks and the node agent's pods run here)."""
    from dagster_gpu.instance.step_args import step_args_from_env

    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if "execute_step" not in cmd and "dagster_gpu.worker.relay_step" not in cmd:
            continue
        try:
            env = p.environ()
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
        args = step_args_from_env(env)
        if args is not None and args.run_id == run_id:
            out.append(p.pid)
    return out


def _mats(instance, asset_key, run_id=None) -> list[tuple[str, str, dict]]:
    recs = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=asset_key), limit=1000).records
    return [(r.asset_materialization.partition, r.run_id, {k: v.value for k, v in r.asset_materialization.metadata.items()})
            for r in recs if run_id is None or r.run_id == run_id]


class Killer(threading.Thread):
    """SIGKILLs the step worker of the backfill's run over range ``KILL_RANGE`` once it materialized 2 partitions:
    as the instance has them, or with ``relay_dir`` (``events: relay``) as the unit's channel under
    ``<relay_dir>/<run id>/`` has them: the instance learns of a relayed materialization only when the run worker
    reads the channel, up to ``relay.pump.MAX_READ_INTERVAL_S`` after a quiet spell (the model loading), by
    which time a unit of small files may have finished its range."""

    def __init__(self, instance, backfill_id: str, asset_key, first_key: str, relay_dir: Path | None = None):
        super().__init__(daemon=True)
        self.instance, self.backfill_id, self.asset_key, self.first_key = instance, backfill_id, asset_key, first_key
        self.relay_dir = relay_dir
        self.killed: dict = {}
        self.stop = threading.Event()

    def done(self, run_id: str) -> list[str]:
        """The partitions the run's unit materialized so far (see the class doc)."""
        if self.relay_dir is None:
            return sorted(k for k, _, _ in _mats(self.instance, self.asset_key, run_id))
        from dagster_gpu.relay.channel import decode, read_from

        return sorted(e.dagster_event.step_materialization_data.materialization.partition
                      for ch in sorted((self.relay_dir / run_id).glob("*.jsonl")) for e in decode(read_from(str(ch))).events
                      if e.dagster_event is not None and e.dagster_event.event_type_value == "ASSET_MATERIALIZATION")

    def run(self) -> None:
        while not self.stop.wait(0.3):
            runs = self.instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": self.backfill_id}))
            run = next((r.dagster_run for r in runs
                        if r.dagster_run.tags.get("dagster/asset_partition_range_start") == self.first_key), None)
            if run is None:
                continue
            done = self.done(run.run_id)
            if len(done) >= 2:
                pids = _worker_pids(run.run_id)
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                if pids:
                    self.killed = {"run_id": run.run_id, "pids": pids, "materialized_before": done}
                    return


def run_ranged_backfill(instance, tmp_path: Path, workspace: Path, env: dict, unit_key: str, source: str) -> dict:
    from dagster_gpu.commands.backfill import DaemonProcess, submit_asset_backfill, summarize_partitions, wait_for_backfill
    from tests import ranged_pipeline as p

    keys = make_corpus(Path(env["RANGED_TEST_CORPUS"]))
    pdef = p.ranged_embeddings.partitions_def.name
    instance.add_dynamic_partitions(pdef, keys)
    bid = submit_asset_backfill(instance, p.defs, p.ranged_embeddings.key, keys, title="ranged-e2e")
    relay_dir = Path(env["DAGSTER_GPU_SLURM_SPOOL"]) / "relay" if env.get("DGPU_TEST_EVENTS") == "relay" else None
    killer = Killer(instance, bid, p.ranged_embeddings.key, keys[KILL_RANGE * PER_RUN], relay_dir)
    with DaemonProcess(workspace, env=env, log_file=tmp_path / "daemon.log") as daemon:
        killer.start()
        final = wait_for_backfill(instance, bid, len(keys), timeout_s=1500, poll_s=2, daemon=daemon,
                                  partitions_def_name=pdef)
        killer.stop.set()
        # the run workers post each unit's scheduler bill as they exit: keep the daemon (their parent) up meanwhile
        from tests.k8s_helpers import wait_for

        bills = wait_for(lambda: unit_observations(instance, p.ranged_embeddings.key, unit_key, source), 180, interval=2,
                         what=f"{source} observations of every unit")
    summary = {s.partition_key: s for s in summarize_partitions(instance, p.ranged_embeddings.key, keys, bid, pdef)}
    return {"keys": keys, "final": final, "summary": summary, "killed": killer.killed, "backfill_id": bid,
            "asset_key": p.ranged_embeddings.key, "bills": bills}


def check_outcome(instance, res: dict, backend: str, log: Path) -> dict[str, list[dict]]:
    """The assertions both clusters share; returns each unit's materializations (by scheduler unit id)."""
    keys, final, summary, killed = res["keys"], res["final"], res["summary"], res["killed"]
    assert killed, f"the unit of range {KILL_RANGE} was never seen running with 2 partitions done; {log}"
    assert final.runs == N // PER_RUN, final
    assert (final.succeeded, final.failed) == (N - 1, 1), (final, log.read_text()[-3000:])
    bad = summary[keys[BAD]]
    assert not bad.ok and keys[BAD] in bad.error and "utf-8" in bad.error, bad.error
    mats = _mats(instance, res["asset_key"])
    by_key: dict[str, list] = {}
    for k, run_id, md in mats:
        by_key.setdefault(k, []).append((run_id, md))
    for k in keys:
        if k == keys[BAD]:
            assert k not in by_key
            continue
        assert len(by_key.get(k, [])) == 1, f"{k} materialized {len(by_key.get(k, []))} times"
        md = by_key[k][0][1]
        assert md["dagster_gpu/backend"] == backend and md["embedding/rows"] > 0 and md["embedding/dim"] == "384"
        assert 0 < md["embedding/useful_fraction"] <= 1 and md["billing/gpu_seconds"] > 0
    # the killed unit's finished partitions stayed materialized by it; its retry embedded only the rest
    killed_range = keys[KILL_RANGE * PER_RUN:(KILL_RANGE + 1) * PER_RUN]
    unit_key = "slurm/job_id" if backend == "slurm" else "k8s/pod"
    assert all(by_key[k][0][0] == killed["run_id"] for k in killed_range)
    killed_unit = {by_key[k][0][1][unit_key] for k in killed["materialized_before"]}
    assert len(killed_unit) == 1, killed_unit
    # the kill lands a moment after the unit was seen with 2 done: on a loaded host it may have finished another
    by_killed = {k for k in killed_range if by_key[k][0][1][unit_key] in killed_unit}
    assert set(killed["materialized_before"]) <= by_killed < set(killed_range), (killed, by_killed)
    retry_units = {by_key[k][0][1][unit_key] for k in killed_range if k not in by_killed}
    assert len(retry_units) == 1 and not retry_units & killed_unit, (killed_unit, retry_units)
    units: dict[str, list[dict]] = {}
    for k, run_id, md in mats:
        units.setdefault(str(md[unit_key]), []).append(md)
    return units


def unit_observations(instance, asset_key, unit_key: str, source: str) -> dict[str, list[dict]] | None:
    """The scheduler-bill observations by unit, once every unit that materialized something has its own
    (None before)."""
    recs = instance.fetch_observations(dg.AssetRecordsFilter(asset_key=asset_key), limit=1000).records
    by_unit: dict[str, list[dict]] = {}
    for r in recs:
        o = {k: v.value for k, v in r.asset_observation.metadata.items()}
        if o.get("bill/source") == source:
            by_unit.setdefault(str(o[unit_key]), []).append({**o, "_partition": r.asset_observation.partition})
    units = {str(md[unit_key]) for _, _, md in _mats(instance, asset_key)}
    return by_unit if units and units <= set(by_unit) else None


def check_bills(by_unit: dict[str, list[dict]], res: dict) -> None:
    """Every unit's observations (one per partition it covered) add up to the unit's scheduler figure."""
    assert len(by_unit) == N // PER_RUN + 1, sorted(by_unit)  # four ranges, one of them also billed for its killed unit
    for unit, group in by_unit.items():
        total = group[0]["bill/unit_gpu_seconds"]
        assert total > 0 and {o["bill/unit_gpu_seconds"] for o in group} == {total}
        assert sum(o["bill/gpu_seconds"] for o in group) == pytest.approx(total, rel=1e-3)  # each part rounded to 4 significant digits, unit
        assert all(o["bill/unit_partitions"] == len(group) for o in group), unit
    bad_obs = [o for g in by_unit.values() for o in g if o["_partition"] == res["keys"][BAD]]
    assert len(bad_obs) == 1 and "not materialized" in bad_obs[0]["bill/note"]


# ------------------------------------------------------------------------------------------------ Slurm
@pytest.mark.slurm
@pytest.mark.postgres
@pytest.mark.e2e
@pytest.mark.parametrize("events", ["direct", "relay"])
def test_ranged_backfill_on_slurm(tmp_path, monkeypatch, events):
    """``relay``: the array tasks cannot open the instance (wrong password, no DAGSTER_HOME: slurm_helpers.
    no_database_env); every event reaches it through the run workers' relay, with the same outcome."""
    from tests import slurm_helpers as H

    reason = H.cluster_unavailable_reason() or H.postgres_unavailable_reason()
    if reason:
        pytest.skip(reason)
    home, env = H.make_dagster_home(max_concurrent_runs=4)
    if events == "relay":
        env.update(H.no_database_env(home))
    env = {**env, "RANGED_TEST_BACKEND": "slurm", "RANGED_TEST_CORPUS": str(tmp_path / "corpus"),
           "RANGED_TEST_OUTPUT": str(tmp_path / "out"), "RANGED_TEST_PER_RUN": str(PER_RUN), "RANGED_TEST_RETRIES": "1",
           "SLURM_TEST_THROTTLE": "4", "SLURM_TEST_WINDOW": "2", "SLURM_TEST_MAX_WINDOW": "20",
           "DAGSTER_GRPC_TIMEOUT_SECONDS": "300", "HF_HUB_OFFLINE": "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    ws = home / "workspace.yaml"
    ws.write_text(f"load_from:\n  - python_file:\n      relative_path: {REPO / 'tests' / 'ranged_pipeline.py'}\n"
                  f"      working_directory: {REPO}\n      location_name: ranged\n")
    with dg.DagsterInstance.get() as instance:
        res = run_ranged_backfill(instance, tmp_path, ws, env, "slurm/job_id", "sacct")
        units = check_outcome(instance, res, "slurm", tmp_path / "daemon.log")
        check_bills(res["bills"], res)
        if events == "relay":
            check_relayed(instance, res, units)
    # nothing of ours left in squeue
    batches = H.spool_batches(Path(env["DAGSTER_GPU_SLURM_SPOOL"]))
    ids = {str(b["array_job_id"]) for b in batches}
    from dagster_gpu.slurm.client import SlurmClient

    left = [j for j in SlurmClient(slurm_conf=H.slurm_conf()).squeue(ids) if not j.state.final]
    assert not left, left
    # 4 ranges and 1 retry: at most one sbatch each (fewer when launches arrive within the coalescing window)
    assert 1 <= len(batches) <= 5 and sum(b["tasks"] for b in batches) == 5


def check_relayed(instance, res: dict, units: dict[str, list[dict]]) -> None:
    """Every unit that materialized was relayed: one report per ended unit (the killed one ended with no outcome,
    so none), its materializations all stored once, its delay measured, no torn or refused line."""
    from tests import slurm_helpers as H

    runs = {r.dagster_run.run_id for r in instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": res["backfill_id"]}))}
    reports = H.relay_reports(instance, runs)
    assert len(reports) == len(units) - 1 == N // PER_RUN, reports
    first_killed = res["killed"]["materialized_before"][0]
    killed_unit = next(str(md["slurm/job_id"]) for k, _, md in _mats(instance, res["asset_key"]) if k == first_killed)
    assert sum(r["dagster_gpu/relay_materializations"] for r in reports) == sum(
        len(v) for u, v in units.items() if u != killed_unit)
    for r in reports:
        assert r["dagster_gpu/relay_bad_lines"] == 0 and r["dagster_gpu/relay_refused"] == 0, r
        assert r["dagster_gpu/relay_materializations"] >= 1 and 0 <= r["dagster_gpu/relay_delay_p95_s"] < 60, r
        assert r["dagster_gpu/relay_channel"].endswith(".jsonl") and "/relay/" in r["dagster_gpu/relay_channel"]
    # the run's cost tag grew by what its relayed materializations measured
    for run_id in runs:
        run = instance.get_run_by_id(run_id)
        mats = [md for _, rid, md in _mats(instance, res["asset_key"], run_id)]
        if mats:
            assert float(run.tags["dagster_gpu/cost_usd"]) == pytest.approx(sum(md["billing/cost_usd"] for md in mats), abs=1e-5)


# ------------------------------------------------------------------------------------------------ Kubernetes
@pytest.mark.k8s
@pytest.mark.postgres
@pytest.mark.e2e
def test_ranged_backfill_on_kubernetes(pg, tmp_path, monkeypatch):
    from tests.k8s_helpers import executor_api, k8s_dagster_instance, labelled, wait_for

    env_extra = {"RANGED_TEST_BACKEND": "kubernetes", "RANGED_TEST_CORPUS": str(tmp_path / "corpus"),
                 "RANGED_TEST_OUTPUT": str(tmp_path / "out"), "RANGED_TEST_PER_RUN": str(PER_RUN),
                 "RANGED_TEST_RETRIES": "1", "HF_HUB_OFFLINE": "1"}
    for k, v in env_extra.items():
        monkeypatch.setenv(k, v)
    with k8s_dagster_instance(pg, tmp_path, monkeypatch, max_runs=4) as instance:
        ws = tmp_path / "workspace.yaml"
        ws.write_text(f"load_from:\n  - python_file:\n      relative_path: {REPO / 'tests' / 'ranged_pipeline.py'}\n"
                      f"      working_directory: {REPO}\n      location_name: ranged\n")
        res = run_ranged_backfill(instance, tmp_path, ws, dict(os.environ), "k8s/pod", "pod-interval")
        check_outcome(instance, res, "kubernetes", tmp_path / "daemon.log")
        check_bills(res["bills"], res)
        api = executor_api()
        runs = {r.dagster_run.run_id for r in instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": res["backfill_id"]}))}
        from dagster_gpu.k8s import manifests as m

        for run_id in runs:
            wait_for(lambda: not any(labelled(api, m.run_selector(run_id)).values()), 60, what=f"cleanup of run {run_id}")
