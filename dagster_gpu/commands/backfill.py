"""Submit an asset backfill, run the Dagster daemon until it ends, and summarize per partition.

This is the same path as a backfill launched from the UI: a ``PartitionBackfill`` stored in the
instance, picked up by the daemon's backfill loop, which makes runs over ranges of partitions (the asset's
``BackfillPolicy.multi_run``) queued through the run coordinator and launched by the run launcher; each
run's step goes through whatever executor the job has (``gpu_executor`` for our assets).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import dagster as dg
from dagster import RunsFilter
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
from dagster._core.utils import make_new_backfill_id

from dagster_gpu.billing.keys import COST_USD, DEVICE_TYPE, GPU_SECONDS, WALL_SECONDS
from dagster_gpu.core.log_tail import log_tail
from dagster_gpu.instance.bills import BilledShare, PendingBill, billed_share, unit_of
from dagster_gpu.instance.failures import launch_metadata, partition_line, step_failure_message
from dagster_gpu.partitions.run_ranges import range_tags, run_partition_keys

_DONE_BACKFILL = {
    BulkActionStatus.COMPLETED,
    BulkActionStatus.COMPLETED_SUCCESS,
    BulkActionStatus.COMPLETED_FAILED,
    BulkActionStatus.FAILED,
    BulkActionStatus.CANCELED,
}


class BackfillTimeout(TimeoutError):
    """The backfill did not finish within the given seconds; the message names what was still running."""


class DaemonDied(RuntimeError):
    """The daemon following the backfill stopped before it finished: the message says how (exit code and the
    last lines of its log, or how long ago its last heartbeat was)."""


#: A daemon counts as alive while its backfill loop's last heartbeat is at most this old (seconds). Dagster
#: writes one every 30 s (``dagster._daemon.controller.DEFAULT_HEARTBEAT_INTERVAL_SECONDS``); its own
#: liveness check tolerates 1,800 s more, far too long to tell a running daemon from one stopped a minute ago.
HEARTBEAT_FRESH_S = 90.0
#: While following another daemon's backfill, a heartbeat this old (seconds) means that daemon is gone.
HEARTBEAT_GONE_S = 300.0


def live_backfill_daemon(instance: dg.DagsterInstance, fresh_s: float = HEARTBEAT_FRESH_S, now: float | None = None):
    """The last heartbeat (``DaemonHeartbeat``: ``daemon_id``, ``timestamp``) of the instance's BACKFILL daemon
    when it is at most ``fresh_s`` seconds old (errors it reports do not matter: it runs), else None. A daemon writes a heartbeat per
    loop every 30 s (``dagster._daemon.daemon.DagsterDaemon._check_add_heartbeat``); with the instance setting
    ``daemon_skip_heartbeats_without_errors`` it writes none while healthy, so it cannot be seen here."""
    from dagster._daemon.controller import get_daemon_statuses
    from dagster._daemon.daemon import BackfillDaemon

    daemon_type = BackfillDaemon.daemon_type()
    status = get_daemon_statuses(instance, [daemon_type], curr_time_seconds=now if now is not None else time.time(), ignore_errors=True,
                                 heartbeat_interval_seconds=0, heartbeat_tolerance_seconds=fresh_s)[daemon_type]
    return status.last_heartbeat if status.healthy else None


class RunningDaemon:
    """A daemon this process did not start (``dagster dev``, a deployed ``dagster-daemon``), followed through its
    heartbeats in the instance."""

    def __init__(self, instance: dg.DagsterInstance, heartbeat, gone_s: float = HEARTBEAT_GONE_S):
        self.instance, self.daemon_id, self.gone_s = instance, heartbeat.daemon_id, gone_s

    def why_dead(self) -> str | None:
        """None while its BACKFILL heartbeat is under ``gone_s`` seconds old, else what was seen."""
        if live_backfill_daemon(self.instance, self.gone_s) is None:
            return (f"the dagster-daemon already running on this instance (id {self.daemon_id}) sent no heartbeat "
                    f"for {self.gone_s:.0f} s")
        return None


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


def error_lines(err, lines: int = 2) -> str | None:
    """A SerializableErrorInfo ``err`` as at most ``lines`` lines: its message's non-blank lines without the
    exception's module path (``DagsterImportError: …``, not ``dagster._core.errors.DagsterImportError: …``),
    then its causes' while fewer. None for None. Never the stack."""
    out: list[str] = []
    while err is not None and len(out) < lines:
        out += [re.sub(r"^(?:[A-Za-z_][\w]*\.)+(?=\w+(?:Error|Exception)\b)", "", ln.strip())
                for ln in (err.message or "").splitlines() if ln.strip()][: lines - len(out)]
        err = err.cause
    return "\n".join(out) or None


def backfill_error(instance: dg.DagsterInstance, backfill_id: str, lines: int = 2) -> str | None:
    """What the daemon stored as the reason a backfill ended (``PartitionBackfill.error``; e.g.
    ``DagsterAssetBackfillDataLoadError: … code location that's failing to load: ['mod:defs']`` when the
    workspace does not load) as :func:`error_lines`. None when the backfill has no error (or is gone)."""
    bf = instance.get_backfill(backfill_id)
    return error_lines(bf.error if bf is not None else None, lines)


def workspace_load_errors(instance: dg.DagsterInstance, workspace: str | Path) -> dict[str, str]:
    """Load each code location of the workspace file ``workspace`` as a dagster-daemon started from this process
    would (a code server per location, this process's environment and working directory) and return
    {location name: its load error's first line (:func:`error_lines`)} for those that fail; {} when all load.
    Takes about as long as importing the locations' code (seconds). The code servers' output (their log on
    stdout, the traceback of a failed import, warnings on stderr) is discarded.

    Raises what Dagster raises for a workspace file it cannot read (missing, not YAML, wrong schema)."""
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget

    with _fds_discarded(1, 2):  # the code servers inherit them
        with WorkspaceProcessContext(instance, WorkspaceFileTarget(paths=[str(workspace)])) as ctx:
            entries = ctx.create_request_context().get_code_location_entries()
            return {name: error_lines(e.load_error, 1) or "failed to load"
                    for name, e in entries.items() if e.load_error is not None}


@contextmanager
def _fds_discarded(*fds: int):
    """File descriptors ``fds`` pointed at /dev/null inside the block (what this process and the children it
    starts there write to them is lost), restored after it."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(fd) for fd in fds]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in fds:
            os.dup2(null, fd)
        yield
    finally:
        for fd, old in zip(fds, saved):
            os.dup2(old, fd)
            os.close(old)
        os.close(null)


@dataclass
class BackfillProgress:
    """Counts of the backfill's partitions: materialized by one of its runs, failed (their run ended without
    materializing them), or waiting/running; ``runs`` is how many runs the backfill has made so far."""

    total: int
    succeeded: int = 0
    failed: int = 0
    running: int = 0
    runs: int = 0
    status: str = "REQUESTED"
    #: runs of the backfill not finished yet (set by :func:`wait_for_backfill`): a run whose partitions are all
    #: done may still be settling its work units' bills
    runs_in_flight: int = 0

    @property
    def done(self) -> int:
        return self.succeeded + self.failed


_FINISHED = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)


class BackfillRuns:
    """The runs of one backfill and the partitions each covered and materialized (finished runs are read
    once and remembered, so polling a long backfill costs a query per unfinished run, not per partition)."""

    def __init__(self, instance: dg.DagsterInstance, backfill_id: str, partitions_def_name: str | None):
        self.instance = instance
        self.backfill_id = backfill_id
        self.partitions_def_name = partitions_def_name
        self._finished: dict[str, tuple[dg.DagsterRun, tuple[str, ...], set[str]]] = {}
        self._all_keys: list[str] | None = None

    def _keys(self, run: dg.DagsterRun) -> tuple[str, ...]:
        r = range_tags(run.tags)
        if r is not None and r[0] != r[1]:
            if self._all_keys is None or r[1] not in self._all_keys:
                self._all_keys = list(self.instance.get_dynamic_partitions(self.partitions_def_name or ""))
        return run_partition_keys(_ListStore(self._all_keys or []), run.tags, self.partitions_def_name)

    def _materialized(self, run_id: str) -> set[str]:
        recs = self.instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records
        return {r.event_log_entry.dagster_event.step_materialization_data.materialization.partition
                for r in recs if r.event_log_entry.dagster_event is not None} - {None}

    def runs(self) -> list[tuple[dg.DagsterRun, tuple[str, ...], set[str]]]:
        """(run, its partition keys, the keys it materialized), oldest run first."""
        out = []
        for rec in self.instance.get_run_records(RunsFilter.for_backfill(self.backfill_id), order_by="id", ascending=True):
            run = rec.dagster_run
            if run.run_id in self._finished:
                out.append(self._finished[run.run_id])
                continue
            item = (run, self._keys(run), self._materialized(run.run_id))
            if run.status in _FINISHED:
                self._finished[run.run_id] = item
            out.append(item)
        return out

    def partition_states(self) -> dict[str, tuple[str, dg.DagsterRun]]:
        """Partition key -> ("ok" | "failed" | "running", the latest run that covered it)."""
        state: dict[str, tuple[str, dg.DagsterRun]] = {}
        for run, keys, materialized in self.runs():
            for k in keys:
                if k in materialized:
                    state[k] = ("ok", run)
                elif run.status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED):
                    state[k] = ("failed", run)
                elif run.status == dg.DagsterRunStatus.SUCCESS:
                    state[k] = ("ok", run)
                else:
                    state[k] = ("running", run)
        return state


class _ListStore:
    def __init__(self, keys: list[str]):
        self.keys = keys

    def get_dynamic_partitions(self, partitions_def_name: str) -> list[str]:
        return self.keys


def backfill_progress(
    instance: dg.DagsterInstance, backfill_id: str, total: int, runs: BackfillRuns | None = None,
    partitions_def_name: str | None = None,
) -> BackfillProgress:
    """The backfill's progress by partition (a ranged run counts each of its partitions)."""
    runs = runs or BackfillRuns(instance, backfill_id, partitions_def_name)
    states = runs.partition_states()
    p = BackfillProgress(total=total, runs=len({run.run_id for _, run in states.values()}))
    for st, _ in states.values():
        if st == "ok":
            p.succeeded += 1
        elif st == "failed":
            p.failed += 1
        else:
            p.running += 1
    bf = instance.get_backfill(backfill_id)
    p.status = bf.status.value if bf else "MISSING"
    return p


class DaemonProcess:
    """``dagster-daemon run -w <workspace>`` as a child process group (context manager).

    Its output goes to ``log_file`` (a temporary file when None, kept when the daemon dies so that its path
    can be given). ``instance``: the instance it serves; when given, the heartbeats it wrote are deleted
    after it stopped (Dagster leaves them, and they would make the next ``dagster-gpu backfill`` take a
    stopped daemon for a running one: :func:`live_backfill_daemon`). ``instance_ref``: the daemon builds its
    instance from it (``dagster-daemon run --instance-ref``) rather than from ``$DAGSTER_HOME/dagster.yaml``
    (e.g. :func:`dagster_gpu.instance.run_queue.daemon_instance_ref`: the same instance, another run queue limit)."""

    #: Seconds :meth:`__exit__` may take at most: SIGTERM, 30 s for the daemon, then 10 s for its children.
    STOP_S = 40

    def __init__(self, workspace: str | Path, env: Mapping[str, str] | None = None, log_file: Path | None = None,
                 instance: dg.DagsterInstance | None = None, instance_ref=None):
        self.workspace = str(workspace)
        self.instance_ref = instance_ref
        self.env = {**os.environ, **(env or {})}
        self.log_file = log_file
        self.instance = instance
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0

    def __enter__(self) -> "DaemonProcess":
        import tempfile

        if self.log_file is None:
            fd, name = tempfile.mkstemp(prefix="dagster-daemon-", suffix=".log")
            os.close(fd)
            self.log_file = Path(name)
        self.started_at = time.time()
        with open(self.log_file, "ab") as out:
            self.proc = subprocess.Popen(
                self.command(),
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        return self

    def command(self) -> list[str]:
        """The daemon's command line."""
        from dagster._serdes import serialize_value

        ref = [] if self.instance_ref is None else ["--instance-ref", serialize_value(self.instance_ref)]
        return [sys.executable, "-m", "dagster._daemon", "run", *ref, "-w", self.workspace]

    def why_dead(self, lines: int = 12) -> str | None:
        """None while the daemon runs; once it exited, its exit code and the last ``lines`` lines of its log."""

        if not self.proc or self.proc.poll() is None:
            return None
        tail = log_tail(Path(self.log_file), lines=lines, max_bytes=16384) if self.log_file else ""
        return (f"dagster-daemon exited with code {self.proc.returncode}; the last lines of its log {self.log_file}:\n"
                + (tail.strip() or "(empty)"))

    def __exit__(self, *exc) -> None:
        """Stop the daemon's process group, then whatever it started in other sessions (its code
        server and run workers): SIGTERM, and SIGKILL for those alive 10 s (30 s for the daemon) later;
        then forget its heartbeats (see the class)."""
        try:
            self._stop()
        finally:
            if self.instance is not None:
                forget_heartbeats(self.instance, self.started_at)

    def _stop(self) -> None:
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


def forget_heartbeats(instance: dg.DagsterInstance, since: float) -> bool:
    """Delete the instance's daemon heartbeats when every one was written since ``since`` (epoch seconds) by
    a single daemon (the one that was started then and has stopped); True when deleted. Heartbeats of any
    other daemon, or older ones, are left alone."""
    beats = instance.get_daemon_heartbeats()
    if not beats or len({b.daemon_id for b in beats.values()}) != 1 or min(b.timestamp for b in beats.values()) < since:
        return False
    instance.wipe_daemon_heartbeats()
    return True


def abandon_backfill(instance: dg.DagsterInstance, backfill_id: str) -> str:
    """Cancel a backfill whose daemon is gone, so that no later daemon picks it up: its queued runs are
    canceled; with no run in flight it is marked CANCELED, else CANCELING (the next daemon on the instance
    terminates those runs and then marks it CANCELED: ``dagster._core.execution.backfill.
    cancel_backfill_runs_and_cancellation_complete``). Returns one line saying which."""
    from dagster._core.storage.dagster_run import NOT_FINISHED_STATUSES

    bf = instance.get_backfill(backfill_id)
    if bf is None or bf.status in _DONE_BACKFILL:
        return f"backfill {backfill_id} is {bf.status.value.lower() if bf else 'gone'}; nothing to cancel"
    from dagster._core.storage.tags import BACKFILL_ID_TAG

    queued = instance.get_runs(RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}, statuses=[dg.DagsterRunStatus.QUEUED]))
    for run in queued:
        instance.report_run_canceling(run, message="Canceled from the queue: dagster-gpu backfill stopped following it.")
        instance.report_run_canceled(run)
    in_flight = instance.get_run_ids(RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}, statuses=NOT_FINISHED_STATUSES))
    if in_flight:
        instance.update_backfill(bf.with_status(BulkActionStatus.CANCELING))
        return (f"backfill {backfill_id} marked CANCELING: the next dagster-daemon on this instance terminates its "
                f"{len(in_flight)} run(s) still in flight ({', '.join(in_flight)}) and marks it canceled")
    instance.update_backfill(bf.with_status(BulkActionStatus.CANCELED).with_end_timestamp(time.time()))
    return f"backfill {backfill_id} canceled ({len(queued)} queued run(s) canceled; no run was in flight)"


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
    daemon: DaemonProcess | RunningDaemon | None = None,
    partitions_def_name: str | None = None,
) -> BackfillProgress:
    """Poll until the backfill's status is final and no run is in flight; raises BackfillTimeout, and
    DaemonDied when ``daemon`` stops first (its ``why_dead()`` as the message).
    ``partitions_def_name`` resolves ranged runs' partitions (required when the asset has a BackfillPolicy)."""
    deadline = time.monotonic() + timeout_s
    runs = BackfillRuns(instance, backfill_id, partitions_def_name)
    while True:
        p = backfill_progress(instance, backfill_id, total, runs)
        p.runs_in_flight = _runs_in_flight(instance, backfill_id)
        if on_progress:
            on_progress(p)
        if BulkActionStatus(p.status) in _DONE_BACKFILL and p.running == 0 and not p.runs_in_flight:
            return p
        if daemon is not None and (why := daemon.why_dead()) is not None:
            raise DaemonDied(f"backfill {backfill_id} not finished ({p.done}/{p.total} partitions done): {why}")
        if time.monotonic() > deadline:
            raise BackfillTimeout(
                f"backfill {backfill_id}: {p.done}/{p.total} partitions done after {timeout_s:.0f} s ({p.running} running)"
            )
        time.sleep(poll_s)


@dataclass(frozen=True)
class IndexLoad:
    """What loading one partition into a vector index did (an index asset's materialization,
    :func:`dagster_gpu.definitions.vector_index.vector_index_asset`): ``mode`` ``append`` (the partition was new
    to the table) or ``replace``; ``deleted``: rows of the partition the commit removed (those its new output no longer has);
    ``version``: the table version it committed."""

    mode: str | None
    deleted: int | None
    version: int | None


@dataclass(frozen=True)
class PartitionSummary(PendingBill):
    """One partition's outcome: its materialization figures, or the failure (with the run that failed it).

    Units: seconds, USD. ``cost_usd`` is the measured cost on the materialization; ``bill`` the partition's
    share of its unit's scheduler bill (``billed_cost_usd``, ``bill_source``: sacct, pod-interval, process),
    None until that bill lands; a failed partition has a billed share too (the time its unit spent on it).
    ``unit``: the (metadata key, value) naming the work unit that last ran it (:data:`dagster_gpu.instance.bills.UNIT_KEYS`).
    """

    partition_key: str
    ok: bool
    rows: int | None = None
    reused_rows: int | None = None
    seconds: float | None = None
    texts_per_second: float | None = None
    backend: str | None = None
    gpu_seconds: float | None = None
    cost_usd: float | None = None
    useful_fraction: float | None = None
    billed_seconds: float | None = None
    error: str | None = None
    run_id: str | None = None
    bill: BilledShare | None = None
    unit: tuple[str, str] | None = None
    index: IndexLoad | None = None
    #: the rate card's device type the step measured on (``billing/device_type``: ``cpu`` on a CPU run)
    device_type: str | None = None


def summarize_partitions(
    instance: dg.DagsterInstance,
    asset_key: dg.AssetKey,
    partition_keys: Sequence[str],
    backfill_id: str | None = None,
    partitions_def_name: str | None = None,
) -> list[PartitionSummary]:
    """The latest materialization of each partition (or the failure of the backfill run that covered it:
    the failed partition's own line of the run's failure message when the unit named it), with the
    partition's share of its unit's scheduler bill once that has landed (``bill``:
    :func:`dagster_gpu.instance.bills.billed_share`; a failed partition's share too)."""
    failures: dict[str, tuple[str, str]] = {}
    if backfill_id:
        messages: dict[str, str] = {}
        for key, (st, run) in BackfillRuns(instance, backfill_id, partitions_def_name).partition_states().items():
            if st != "failed":
                continue
            if run.run_id not in messages:
                messages[run.run_id] = step_failure_message(instance, run.run_id) or run.status.value
            failures[key] = (partition_line(messages[run.run_id], key), run.run_id)
    launches: dict[str, tuple[str, str] | None] = {}

    def launched_unit(run_id: str | None) -> tuple[str, str] | None:
        if run_id and run_id not in launches:
            launches[run_id] = unit_of(launch_metadata(instance, run_id))
        return launches.get(run_id) if run_id else None

    out = []
    for pk in partition_keys:
        recs = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[pk]), limit=1).records
        if pk in failures or not recs:
            error, run_id = failures.get(pk, ("not materialized", None))
            unit = launched_unit(run_id)
            out.append(PartitionSummary(pk, ok=False, error=error, run_id=run_id, unit=unit,
                                        bill=billed_share(instance, asset_key, pk, unit)))
            continue
        md = {k: v.value for k, v in recs[0].asset_materialization.metadata.items()}
        unit = unit_of(md) or launched_unit(recs[0].run_id)
        if "index/rows" in md:  # an index asset's partition: its load, not an embedding
            out.append(index_summary(pk, md, recs[0].run_id, bill=billed_share(instance, asset_key, pk, unit), unit=unit))
            continue
        out.append(
            PartitionSummary(
                pk,
                ok=True,
                rows=md.get("embedding/rows"),
                reused_rows=md.get("embedding/reused_rows"),
                seconds=md.get("embedding/seconds"),
                texts_per_second=md.get("embedding/texts_per_second"),
                backend=md.get("dagster_gpu/backend"),
                gpu_seconds=md.get(GPU_SECONDS),
                cost_usd=md.get(COST_USD),
                useful_fraction=md.get("embedding/useful_fraction"),
                billed_seconds=md.get(WALL_SECONDS),
                run_id=recs[0].run_id,
                bill=billed_share(instance, asset_key, pk, unit),
                unit=unit,
                device_type=md.get(DEVICE_TYPE),
            )
        )
    return out


def index_summary(pk: str, md: Mapping[str, Any], run_id: str | None, **bill: Any) -> PartitionSummary:
    """The summary of an index asset's partition from its materialization's plain metadata ``md``: rows in
    the index, the load's wall seconds and rows per second (``index/seconds``), its :class:`IndexLoad`."""
    rows, seconds = md.get("index/rows"), md.get("index/seconds")
    return PartitionSummary(
        pk, ok=True, rows=rows, seconds=seconds, run_id=run_id,
        texts_per_second=rows / seconds if rows is not None and seconds else None,
        index=IndexLoad(mode=md.get("index/mode"), deleted=md.get("index/deleted"), version=md.get("index/version")),
        **bill,
    )


def wait_for_bills(
    instance: dg.DagsterInstance,
    asset_key: dg.AssetKey,
    rows: Sequence[PartitionSummary],
    *,
    timeout_s: float = 60.0,
    poll_s: float = 2.0,
    on_wait: Callable[[int], None] | None = None,
) -> list[PartitionSummary]:
    """``rows`` with the bills of those pending (:attr:`~dagster_gpu.instance.bills.PendingBill.bill_pending`) read
    again every ``poll_s`` seconds until none is pending or ``timeout_s`` seconds passed. A unit's bill lands
    after the backfill's runs end: the run worker bills its units at its exit (each backend's
    ``settle_wait_seconds``) and the bills sensor sweeps what it could not, so the daemon must still be
    running. ``on_wait(n)`` before each wait."""
    rows = list(rows)
    deadline = time.monotonic() + timeout_s
    while (pending := [i for i, r in enumerate(rows) if r.bill_pending]) and time.monotonic() < deadline:
        if on_wait:
            on_wait(len(pending))
        time.sleep(poll_s)
        for i in pending:
            rows[i] = replace(rows[i], bill=billed_share(instance, asset_key, rows[i].partition_key, rows[i].unit))
    return rows


@dataclass(frozen=True)
class OtherWork:
    """What a daemon's sensors started on the instance while a backfill ran (the index's automation sensor
    following the embeddings, the corpus sensor), other than that backfill: runs ``running`` (starting,
    started or canceling), runs ``queued`` (the daemon's run queue starts them) and backfills ``requested``
    (an automation sensor's backfill over many partitions; the daemon's backfill loop makes its runs)."""

    running: tuple[dg.DagsterRun, ...] = ()
    queued: tuple[dg.DagsterRun, ...] = ()
    requested: tuple[PartitionBackfill, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.running or self.queued or self.requested)

    def describe(self) -> str:
        """``2 run(s) queued (id, id) and 1 backfill(s) requested (id)``: the queued and requested only."""
        parts = [f"{len(self.queued)} run(s) queued ({', '.join(r.run_id for r in self.queued)})"] if self.queued else []
        if self.requested:
            parts.append(f"{len(self.requested)} backfill(s) requested ({', '.join(b.backfill_id for b in self.requested)})")
        return " and ".join(parts)

    def asset_keys(self) -> list[str]:
        """The assets the queued runs and requested backfills materialize, '/'-separated, sorted."""
        keys = {k for r in self.queued for k in (r.asset_selection or ())}
        keys |= {k for b in self.requested for k in (b.asset_selection or ())}
        return sorted(k.to_user_string() for k in keys)


def other_work(instance: dg.DagsterInstance, since: float, backfill_id: str) -> OtherWork:
    """The runs and backfills created since ``since`` (epoch s), other than backfill ``backfill_id`` and its
    runs, that are not finished: those a daemon's sensors started meanwhile (:class:`OtherWork`). Stopping the
    daemon that runs them would kill the running ones' run workers and fail them ("Execution was interrupted
    unexpectedly") and leave the queued and requested ones for the next daemon."""
    import datetime as dt

    from dagster._core.execution.backfill import BulkActionsFilter

    after = dt.datetime.fromtimestamp(since, dt.timezone.utc)
    S = dg.DagsterRunStatus
    recs = instance.get_run_records(RunsFilter(statuses=[S.QUEUED, S.STARTING, S.STARTED, S.CANCELING], created_after=after))
    runs = [r.dagster_run for r in recs if r.dagster_run.tags.get("dagster/backfill") != backfill_id]
    backfills = instance.get_backfills(filters=BulkActionsFilter(statuses=[BulkActionStatus.REQUESTED], created_after=after))
    return OtherWork(running=tuple(r for r in runs if r.status != S.QUEUED),
                     queued=tuple(r for r in runs if r.status == S.QUEUED),
                     requested=tuple(b for b in backfills if b.backfill_id != backfill_id))


@dataclass(frozen=True)
class FailedOtherRun:
    """A run a daemon's sensors started meanwhile (:func:`other_work`) that failed.

    Attributes:
        run_id: its id. assets: the assets it materialized, '/'-separated. partitions: ``a`` (one partition),
        ``a … b`` (a ranged run) or ``""``. error: the first lines of its step failure (the unit's failure names
        each failed partition, ``key: why``), else its status.
    """

    run_id: str
    assets: str
    partitions: str
    error: str


def failed_other_runs(instance: dg.DagsterInstance, since: float, backfill_id: str, lines: int = 3) -> list[FailedOtherRun]:
    """The runs created since ``since`` (epoch s), other than backfill ``backfill_id``'s, that ended FAILURE: what a
    daemon's sensors started meanwhile and failed (the index following the embeddings), oldest first, each with
    the first ``lines`` lines of its step failure (:func:`dagster_gpu.instance.failures.step_failure_message`)."""
    import datetime as dt

    after = dt.datetime.fromtimestamp(since, dt.timezone.utc)
    recs = instance.get_run_records(RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE], created_after=after))
    out = []
    for rec in sorted(recs, key=lambda r: r.create_timestamp):
        run = rec.dagster_run
        if run.tags.get("dagster/backfill") == backfill_id:
            continue
        rng = range_tags(run.tags)
        part = run.tags.get("dagster/partition") or (f"{rng[0]} … {rng[1]}" if rng else "")
        message = step_failure_message(instance, run.run_id) or "run failed (no step failure recorded)"
        out.append(FailedOtherRun(run.run_id, ", ".join(sorted(k.to_user_string() for k in run.asset_selection or ())),
                                  part, "\n".join(message.strip().splitlines()[:lines])))
    return out


def sensors_ticked_since(instance: dg.DagsterInstance, daemon_started: float, since: float) -> bool:
    """True when every sensor that ticked under a daemon started at ``daemon_started`` (epoch s) has finished a tick
    that began at or after ``since`` (epoch s): whatever such a sensor requests for the work that ended before
    ``since`` is then in the instance. Sensors with no tick since ``daemon_started`` (stopped ones) are not waited
    for."""
    from dagster._core.scheduler.instigation import InstigatorType, TickStatus

    for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
        ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id, after=daemon_started, limit=2)
        if not ticks:
            continue
        if not any(t.timestamp >= since and t.status != TickStatus.STARTED for t in ticks):
            return False
    return True


def wait_for_other_work(instance: dg.DagsterInstance, since: float, backfill_id: str, *, timeout_s: float,
                        poll_s: float = 2.0, alive: Callable[[], bool] | None = None,
                        next_ticks: bool = False) -> OtherWork:
    """:func:`other_work` polled every ``poll_s`` seconds until none is left, ``timeout_s`` seconds passed or
    ``alive()`` (the daemon that would run it) is False; returns what is left. With ``next_ticks``, once none is
    left it also waits, within the same bound, until each sensor that ticked since ``since`` has finished a tick
    that began after that moment (:func:`sensors_ticked_since`), and waits on if one requested more: a sensor that
    requests in steps (the automation condition sensor following the runs it watches) is not cut off between two
    of its requests."""
    deadline = time.monotonic() + timeout_s
    quiet_at: float | None = None
    while True:
        work = other_work(instance, since, backfill_id)
        if work:
            quiet_at = None
        elif not next_ticks:
            return work
        else:
            quiet_at = quiet_at or time.time()
            if sensors_ticked_since(instance, since, quiet_at):
                return work
        if time.monotonic() >= deadline or (alive is not None and not alive()):
            return work
        time.sleep(poll_s)


def _runs_in_flight(instance: dg.DagsterInstance, backfill_id: str) -> int:
    return sum(rec.dagster_run.status not in _FINISHED
               for rec in instance.get_run_records(RunsFilter.for_backfill(backfill_id)))
