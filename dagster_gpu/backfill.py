"""Submit an asset backfill, run the Dagster daemon until it ends, and summarize per partition.

This is the same path as a backfill launched from the UI: a ``PartitionBackfill`` stored in the
instance, picked up by the daemon's backfill loop, one run per partition (no BackfillPolicy) queued
through the run coordinator and launched by the run launcher; each run's step goes through whatever
executor the job has (``gpu_executor`` for our assets).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import dagster as dg
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
from dagster._core.storage.dagster_run import RunsFilter
from dagster._core.utils import make_new_backfill_id

PARTITION_TAG = "dagster/partition"
_DONE_BACKFILL = {
    BulkActionStatus.COMPLETED,
    BulkActionStatus.COMPLETED_SUCCESS,
    BulkActionStatus.COMPLETED_FAILED,
    BulkActionStatus.FAILED,
    BulkActionStatus.CANCELED,
}


class BackfillTimeout(TimeoutError):
    """The backfill did not finish within the given seconds; the message names what was still running."""


def submit_asset_backfill(
    instance: dg.DagsterInstance,
    defs: dg.Definitions,
    asset_key: dg.AssetKey,
    partition_keys: Sequence[str],
    *,
    title: str | None = None,
    tags: Mapping[str, str] | None = None,
    run_config: Mapping | None = None,
) -> str:
    """Store an asset backfill of ``partition_keys`` of ``asset_key``; returns the backfill id."""
    backfill_id = make_new_backfill_id()
    backfill = PartitionBackfill.from_asset_partitions(
        backfill_id=backfill_id,
        asset_graph=defs.resolve_asset_graph(),
        partition_names=list(partition_keys),
        asset_selection=[asset_key],
        backfill_timestamp=time.time(),
        tags=dict(tags or {}),
        dynamic_partitions_store=instance,
        all_partitions=False,
        title=title,
        description=None,
        run_config=dict(run_config) if run_config else None,
    )
    instance.add_backfill(backfill)
    return backfill_id


@dataclass
class BackfillProgress:
    """Counts of the backfill's partitions by the state of their latest run."""

    total: int
    succeeded: int = 0
    failed: int = 0
    running: int = 0
    status: str = "REQUESTED"

    @property
    def done(self) -> int:
        return self.succeeded + self.failed


def backfill_progress(instance: dg.DagsterInstance, backfill_id: str, total: int) -> BackfillProgress:
    latest: dict[str, dg.DagsterRunStatus] = {}
    for rec in instance.get_run_records(RunsFilter.for_backfill(backfill_id), order_by="id", ascending=True):
        pk = rec.dagster_run.tags.get(PARTITION_TAG)
        if pk is not None:
            latest[pk] = rec.dagster_run.status
    p = BackfillProgress(total=total)
    for s in latest.values():
        if s == dg.DagsterRunStatus.SUCCESS:
            p.succeeded += 1
        elif s in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED):
            p.failed += 1
        else:
            p.running += 1
    bf = instance.get_backfill(backfill_id)
    p.status = bf.status.value if bf else "MISSING"
    return p


class DaemonProcess:
    """``dagster-daemon run -w <workspace>`` as a child process group (context manager)."""

    def __init__(self, workspace: str | Path, env: Mapping[str, str] | None = None, log_file: Path | None = None):
        self.workspace = str(workspace)
        self.env = {**os.environ, **(env or {})}
        self.log_file = log_file
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "DaemonProcess":
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dagster._daemon", "run", "-w", self.workspace],
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        return self

    def __exit__(self, *exc) -> None:
        """Stop the daemon's process group, then whatever it started in other sessions (its code
        server and run workers): SIGTERM, and SIGKILL for those alive 10 s (30 s for the daemon) later."""
        import psutil

        if not self.proc or self.proc.poll() is not None:
            return
        try:
            descendants = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            descendants = []
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        alive = [p for p in descendants if p.is_running()]
        for p in alive:
            try:
                p.terminate()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(alive, timeout=10)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


def _die_with_parent() -> None:
    """Linux: SIGTERM the daemon if the process that started it dies (no orphaned daemons)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def wait_for_backfill(
    instance: dg.DagsterInstance,
    backfill_id: str,
    total: int,
    *,
    timeout_s: float = 3600,
    poll_s: float = 1.0,
    on_progress: Callable[[BackfillProgress], None] | None = None,
    daemon: DaemonProcess | None = None,
) -> BackfillProgress:
    """Poll until the backfill's status is final and no run is in flight; raises BackfillTimeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        p = backfill_progress(instance, backfill_id, total)
        if on_progress:
            on_progress(p)
        if BulkActionStatus(p.status) in _DONE_BACKFILL and p.running == 0:
            return p
        if daemon and daemon.proc and daemon.proc.poll() is not None:
            raise RuntimeError(f"dagster-daemon exited with code {daemon.proc.returncode} before backfill {backfill_id} finished")
        if time.monotonic() > deadline:
            raise BackfillTimeout(
                f"backfill {backfill_id}: {p.done}/{p.total} partitions done after {timeout_s:.0f} s ({p.running} running)"
            )
        time.sleep(poll_s)


@dataclass(frozen=True)
class PartitionSummary:
    """One partition's outcome: its materialization figures, or the failure."""

    partition_key: str
    ok: bool
    rows: int | None = None
    seconds: float | None = None
    texts_per_second: float | None = None
    backend: str | None = None
    gpu_seconds: float | None = None
    cost_usd: float | None = None
    error: str | None = None
    run_id: str | None = None  # the latest run of a failed partition


def summarize_partitions(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey, partition_keys: Sequence[str], backfill_id: str | None = None
) -> list[PartitionSummary]:
    """The latest materialization of each partition (or the failure message of its latest run)."""
    failures: dict[str, str] = {}
    failed_runs: dict[str, str] = {}
    if backfill_id:
        for rec in instance.get_run_records(RunsFilter.for_backfill(backfill_id), order_by="id", ascending=True):
            run = rec.dagster_run
            pk = run.tags.get(PARTITION_TAG)
            if pk and run.status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED):
                failures[pk] = _failure_message(instance, run.run_id) or run.status.value
                failed_runs[pk] = run.run_id
            elif pk:
                failures.pop(pk, None)
                failed_runs.pop(pk, None)
    out = []
    for pk in partition_keys:
        recs = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[pk]), limit=1).records
        if pk in failures or not recs:
            out.append(PartitionSummary(pk, ok=False, error=failures.get(pk, "not materialized"), run_id=failed_runs.get(pk)))
            continue
        md = {k: v.value for k, v in recs[0].asset_materialization.metadata.items()}
        out.append(
            PartitionSummary(
                pk,
                ok=True,
                rows=md.get("embedding/rows"),
                seconds=md.get("embedding/seconds"),
                texts_per_second=md.get("embedding/texts_per_second"),
                backend=md.get("dagster_gpu/backend"),
                gpu_seconds=md.get("billing/gpu_seconds"),
                cost_usd=md.get("billing/cost_usd"),
            )
        )
    return out


def _failure_message(instance: dg.DagsterInstance, run_id: str) -> str | None:
    recs = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_FAILURE).records
    for r in recs:
        ev = r.event_log_entry.dagster_event
        data = ev.step_failure_data if ev else None
        if data is None:
            continue
        if data.user_failure_data and data.user_failure_data.description:
            return data.user_failure_data.description
        if data.error and data.error.message:
            return data.error.message.strip().splitlines()[0]
    return None
