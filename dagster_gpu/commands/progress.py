"""Terminal rendering (rich): backfill progress and the per-partition summary table."""

from __future__ import annotations

import time
from typing import Callable, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dagster_gpu.billing.metering import useful_fraction as ratio_of_sums
from dagster_gpu.commands.backfill import (
    BackfillProgress,
    BackfillTimeout,
    DaemonDied,
    DaemonProcess,
    PartitionSummary,
    RunningDaemon,
    abandon_backfill,
    backfill_error,
    failed_other_runs,
    other_work,
    submit_asset_backfill,
    summarize_partitions,
    wait_for_backfill,
    wait_for_bills,
    wait_for_other_work,
)
from dagster_gpu.commands.index_wait import index_lag, lag_lines, wait_for_indexes
from dagster_gpu.instance.bills import SCHEDULERS_BILL, billed_total
from dagster_gpu.instance.failures import FailureDetail, failure_detail
from dagster_gpu.k8s.settings import KubernetesSettings
from dagster_gpu.local.backend import LocalSettings
from dagster_gpu.slurm.backend import SlurmSettings


def progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def progress_detail(p: BackfillProgress) -> str:
    return f"ok {p.succeeded}  failed {p.failed}  running {p.running}  runs {p.runs}  [{p.status.lower()}]"


def useful_fraction(rows: Sequence[PartitionSummary]) -> float | None:
    """The materialized partitions' useful fraction: Σ embedding seconds ÷ Σ measured seconds
    (``billing/wall_seconds``), :func:`dagster_gpu.billing.metering.useful_fraction`; None when nothing was
    measured."""

    return ratio_of_sums((r.seconds, r.billed_seconds) for r in rows if r.ok)


def summary_table(rows: Sequence[PartitionSummary], title: str = "Per-partition summary") -> Table:
    """Columns: partition, rows, reused (rows whose vector was reused from the previous output; shown when a
    partition reused any), seconds (embedding), texts/s (texts that reached the model; "all reused" when every row was
    reused), backend, measured
    GPU-seconds (CPU-seconds, "measured CPU-s", when every materialized partition ran on the CPU) and measured
    cost (USD): the step worker's own measurement; useful fraction (embedding ÷ measured seconds; its footer the
    ratio of sums, as in the HTML report); scheduler's bill (USD): the partition's share of its unit's bill from sacct / the pod interval / the process ("pending" until it
    lands; failed partitions have one too). Failures in red."""
    if any(r.index for r in rows):
        return index_summary_table(rows, title)
    t = Table(title=title, show_footer=True)
    ok = [r for r in rows if r.ok]
    reuse = any(r.reused_rows for r in ok)  # the column only when a partition reused vectors
    t.add_column("partition", footer=f"{len(ok)}/{len(rows)} ok")
    t.add_column("rows", justify="right", footer=str(sum(r.rows or 0 for r in ok)))
    if reuse:
        t.add_column("reused", justify="right", footer=str(sum(r.reused_rows or 0 for r in ok)))
    t.add_column("seconds", justify="right", footer=f"{sum(r.seconds or 0 for r in ok):.1f}")
    t.add_column("texts/s", justify="right")
    t.add_column("backend")
    seconds = "CPU-s" if ok and all(r.device_type == "cpu" for r in ok) else "GPU-s"  # a CPU run counts CPU seconds
    t.add_column(f"measured {seconds}", justify="right", footer=f"{sum(r.gpu_seconds or 0 for r in ok):.1f}")
    t.add_column("measured (USD)", justify="right", footer=f"{sum(r.cost_usd or 0 for r in ok):.6f}")
    uf = useful_fraction(rows)
    t.add_column("useful", justify="right", footer="" if uf is None else f"{uf:.2f}")
    t.add_column("scheduler's bill (USD)", justify="right", footer=billed_total(rows))  # failed partitions' shares too
    for r in rows:
        billed = f"{r.billed_cost_usd:.6f}" if r.billed_cost_usd is not None else ("pending" if r.bill_pending else "")
        reused = [str(r.reused_rows or 0)] if reuse else []
        if r.ok:
            all_reused = bool(r.rows) and r.reused_rows == r.rows  # nothing reached the model: no throughput
            t.add_row(
                r.partition_key, str(r.rows), *reused, f"{r.seconds or 0:.2f}",
                "all reused" if all_reused else f"{r.texts_per_second or 0:.1f}", r.backend or "",
                f"{r.gpu_seconds or 0:.2f}", f"{r.cost_usd or 0:.6f}",
                "" if r.useful_fraction is None else f"{r.useful_fraction:.2f}", billed,
            )
        else:
            t.add_row(f"[red]{r.partition_key}[/red]", "[red]failed[/red]", *([""] * len(reused)), "", "", "", "", "",
                      "", billed)
    return t


def index_summary_table(rows: Sequence[PartitionSummary], title: str) -> Table:
    """An index asset's summary: partition, rows now in the index, how the commit wrote them (``append`` for a
    partition new to the table, ``replace``), rows of the partition it removed (those the new output no longer has), the load's wall
    seconds and rows/s, the table version committed, and the scheduler's bill (USD) of the CPU step. Failures
    in red."""
    t = Table(title=title, show_footer=True)
    ok = [r for r in rows if r.ok]
    seconds = sum(r.seconds or 0 for r in ok)
    total = sum(r.rows or 0 for r in ok)
    t.add_column("partition", footer=f"{len(ok)}/{len(rows)} ok")
    t.add_column("rows", justify="right", footer=str(total))
    t.add_column("write")
    t.add_column("removed", justify="right", footer=str(sum(r.index.deleted or 0 for r in ok if r.index)))
    t.add_column("seconds", justify="right", footer=f"{seconds:.2f}")
    t.add_column("rows/s", justify="right", footer=f"{total / seconds:.0f}" if seconds else "")
    t.add_column("table version", justify="right")
    t.add_column("scheduler's bill (USD)", justify="right", footer=billed_total(rows))
    for r in rows:
        billed = f"{r.billed_cost_usd:.6f}" if r.billed_cost_usd is not None else ("pending" if r.bill_pending else "")
        if r.ok and r.index:
            t.add_row(r.partition_key, str(r.rows), r.index.mode or "", str(r.index.deleted or 0),
                      "" if r.seconds is None else f"{r.seconds:.2f}",
                      "" if r.texts_per_second is None else f"{r.texts_per_second:.0f}",
                      "" if r.index.version is None else str(r.index.version), billed)
        else:
            t.add_row(f"[red]{r.partition_key}[/red]", "[red]failed[/red]", "", "", "", "", "", billed)
    return t


#: Partitions named in a group's row of the failures table; the rest are counted.
GROUP_NAMES_SHOWN = 3


def _same_error(d: FailureDetail) -> str:
    """``d.error`` with the partition's own key (as written, or quoted as ``describe_partitions`` quotes it)
    replaced by ``<partition>``, so that partitions that failed for the same reason compare equal. Pure."""
    text = d.error
    for form in (repr(d.partition_key), d.partition_key):
        text = text.replace(form, "<partition>")
    return text


def group_failures(details: Sequence[FailureDetail]) -> list[list[FailureDetail]]:
    """``details`` grouped by their error with the partition's own key left out (:func:`_same_error`), the
    largest group first, then in the order first seen. Pure."""
    groups: dict[str, list[FailureDetail]] = {}
    for d in details:
        groups.setdefault(_same_error(d), []).append(d)
    return sorted(groups.values(), key=lambda g: -len(g))


def failures_table(details: Sequence[FailureDetail]) -> Table:
    """Below the summary: each failed partition's key, run id, first line of the error, where the full log is;
    partitions that failed for the same reason (:func:`group_failures`) share one row: ``N partitions: a, b,
    c … (+k)``, the number of runs, the error once (the first partition's key as ``<partition>``) and the first
    partition's log."""
    groups = group_failures(details)
    title = f"{len(details)} failed partition(s)" + (f", {len(groups)} distinct error(s)" if len(groups) < len(details) else "")
    t = Table(title=title, title_style="bold red", show_lines=True)
    t.add_column("partition", style="red", overflow="fold")
    t.add_column("run id", no_wrap=True)
    t.add_column("error (first line)", overflow="fold")
    t.add_column("full log", overflow="fold")
    for g in groups:
        d = g[0]
        if len(g) == 1:
            t.add_row(d.partition_key, d.run_id or "–", d.error, d.log)
            continue
        names = ", ".join(x.partition_key for x in g[:GROUP_NAMES_SHOWN])
        more = f" … (+{len(g) - GROUP_NAMES_SHOWN})" if len(g) > GROUP_NAMES_SHOWN else ""
        runs = {x.run_id for x in g if x.run_id}
        t.add_row(f"{len(g)} partitions: {names}{more}", d.run_id if len(runs) == 1 else f"{len(runs)} runs",
                  _same_error(d), d.log)
    return t


def print_summary(console: Console, instance, rows: Sequence[PartitionSummary], title: str) -> None:
    """The summary table, then the failed partitions (if any) with their run, error and log."""
    console.print(summary_table(rows, title=title))
    console.print(f"{SCHEDULERS_BILL[0].upper()}{SCHEDULERS_BILL[1:]}: {billed_total(rows)} USD", soft_wrap=True)
    failed = [failure_detail(instance, r.partition_key, r.run_id, r.error) for r in rows if not r.ok]
    if failed:
        console.print(failures_table(failed))


def progress_line(p: BackfillProgress, elapsed_s: float) -> str:
    """One plain line of a backfill's progress, for a log: ``backfill: 12/43 partitions done, 1 failed, 2 run(s)
    going, 3:10 elapsed [requested]`` (``elapsed_s``: seconds since it was submitted)."""
    m, sec = divmod(int(elapsed_s), 60)
    h, m = divmod(m, 60)
    elapsed = f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"
    return (f"backfill: {p.done}/{p.total} partitions done, {p.failed} failed, {p.runs_in_flight} run(s) going, "
            f"{elapsed} elapsed [{p.status.lower()}]")


class BackfillFollower:
    """The progress of a backfill (context manager; call it with each :class:`BackfillProgress`), and
    one line, once, when every partition is done but runs are still in flight (their run workers billing
    their work units), with how long that takes at most.

    On a terminal it is a rich progress bar. Elsewhere (a log file, a pipe) rich's bar would show only once,
    at the end, so it prints :func:`progress_line` instead: when the done or failed count changes (at most one
    line per ``min_gap_s`` seconds; changes between are in the next line), else every ``every_s`` seconds, and
    the last state at the end when the last line did not say it (e.g. only the backfill's status changed).
    ``clock``: monotonic seconds."""

    def __init__(self, console: Console, total: int, *, every_s: float = 30.0, min_gap_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self.console, self.every_s, self.min_gap_s, self.clock = console, every_s, min_gap_s, clock
        self.plain = not console.is_terminal or console.is_dumb_terminal
        self.bar = None if self.plain else progress_bar(console)
        self.task = None if self.bar is None else self.bar.add_task("backfill", total=total, detail="")
        self.said_settling = False
        self.started = clock()
        self.last: BackfillProgress | None = None
        self.printed: tuple[float, tuple[int, int]] | None = None  # (when, (done, failed)) of the last line
        self.printed_line: str | None = None

    def __enter__(self) -> "BackfillFollower":
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
        elif self.last is not None and self.printed_line != progress_line(self.last, 0):
            self._line(self.last)

    def _line(self, p: BackfillProgress) -> None:
        now = self.clock()
        self.console.print(progress_line(p, now - self.started), soft_wrap=True, markup=False, highlight=False)
        self.printed = (now, (p.done, p.failed))
        self.printed_line = progress_line(p, 0)  # what it said, but the time

    def __call__(self, p: BackfillProgress) -> None:
        self.last = p
        if self.bar is not None:
            self.bar.update(self.task, completed=p.done, detail=progress_detail(p))
        else:
            since = None if self.printed is None else self.clock() - self.printed[0]
            changed = self.printed is None or self.printed[1] != (p.done, p.failed)
            if since is None or since >= self.every_s or (changed and since >= self.min_gap_s):
                self._line(p)
        if p.done == p.total and p.runs_in_flight and not self.said_settling:
            self.said_settling = True
            self.console.print(f"All {p.total} partitions done; waiting for {p.runs_in_flight} run(s) to end while "
                               f"their run workers bill their work units: {settle_wait_note()}", soft_wrap=True)


class BackfillAbandoned(RuntimeError):
    """``dagster-gpu backfill`` stopped following a backfill before it ended (its daemon died, the timeout
    passed, or Ctrl-C): the message says why and what became of the backfill (canceled, or still running)."""


class BackfillFailed(RuntimeError):
    """The backfill ended with an error the daemon stored on it (:func:`dagster_gpu.commands.backfill.backfill_error`,
    e.g. its code location did not load): the message is that error; ``rows`` the summary already printed
    (a partition materialized before this backfill shows as ok there)."""

    def __init__(self, message: str, rows: Sequence[PartitionSummary]):
        super().__init__(message)
        self.rows = list(rows)


def settle_wait_note() -> str:
    """How long a run worker may stay up after its partitions are done, billing its work units: each backend's
    default ``settle_wait_seconds`` (its settings class), as one phrase."""

    waits = (("local", LocalSettings), ("slurm", SlurmSettings), ("kubernetes", KubernetesSettings))
    return ("each waits at most its backend's settle_wait_seconds (default "
            + ", ".join(f"{b} {cls.settle_wait_seconds:.0f} s" for b, cls in waits) + ")")


def drain_other_runs(instance, daemon: DaemonProcess, backfill_id: str, console: Console, timeout_s: float,
                     code_location: str = "-m MODULE") -> int:
    """Before ``daemon`` (started by this command) is stopped: wait, while it runs and up to ``timeout_s``
    seconds, for the runs and backfills its sensors started meanwhile
    (:func:`dagster_gpu.commands.backfill.other_work`: running, queued, requested), saying so, and, once they
    ended, for each sensor that ticked to finish one more tick (what it requests in steps, such as the index
    following the embeddings partition by partition, is not stranded between two requests). Then one line
    names the runs still in flight (stopping the daemon fails them) and one the runs still queued and backfills
    still requested (left for the next daemon), with how to finish them (``dagster-gpu backfill <code_location>
    -a ASSET --stale``; ``code_location``: the command's own ``-m`` arguments). Returns how many runs are still in
    flight."""
    others = other_work(instance, daemon.started_at, backfill_id)
    if others and timeout_s > 0:
        runs = others.running + others.queued
        jobs = ", ".join(sorted({r.job_name for r in runs} | {b.title or b.backfill_id for b in others.requested}))
        what = " and ".join(([f"{len(runs)} run(s)"] if runs else [])
                            + ([f"{len(others.requested)} backfill(s)"] if others.requested else []))
        console.print(f"Waiting up to {timeout_s:.0f} s for {what} "
                      f"the daemon's sensors started meanwhile ({jobs}; e.g. the index following these embeddings): "
                      "stopping the daemon would fail or strand them", soft_wrap=True)
        alive = getattr(daemon, "why_dead", None)
        others = wait_for_other_work(instance, daemon.started_at, backfill_id, timeout_s=timeout_s, next_ticks=True,
                                     alive=None if alive is None else lambda: alive() is None)
    if others.running:
        console.print(f"{len(others.running)} run(s) still in flight will be interrupted and fail: "
                      + ", ".join(r.run_id for r in others.running), soft_wrap=True)
    if others.queued or others.requested:
        assets = others.asset_keys()
        redo = ("; to run them now: " + "; ".join(f"dagster-gpu backfill {code_location} -a {a} --stale" for a in assets)
                if assets else "")
        console.print(f"{others.describe()} by the daemon's sensors meanwhile stay for the next dagster-daemon on this "
                      f"instance (`dagster dev` or `dagster-daemon run`){redo}", soft_wrap=True, markup=False)
    return len(others.running)


def report_failed_other_runs(instance, since: float, backfill_id: str, console: Console) -> int:
    """Print the runs the daemon's sensors started since ``since`` (epoch s) that failed
    (:func:`dagster_gpu.commands.backfill.failed_other_runs`: the index runs following the embeddings), each with
    its assets, partitions and the first lines of its failure; returns how many."""
    failed = failed_other_runs(instance, since, backfill_id)
    if failed:
        console.print(f"[bold red]{len(failed)} run(s) the daemon's sensors started meanwhile failed[/bold red] "
                      "(e.g. the index following these embeddings):", soft_wrap=True)
        for f in failed:
            head = f"  run {f.run_id} ({f.assets}" + (f", partitions {f.partitions}" if f.partitions else "") + "): "
            console.print(head + f.error.replace("\n", "\n    "), soft_wrap=True, markup=False, highlight=False)
    return len(failed)


def follow_indexes(instance, daemon, asset_key, rows: Sequence[PartitionSummary], indexes: Sequence, console: Console,
                   timeout_s: float) -> tuple[list, float]:
    """Wait, while ``daemon`` runs and up to ``timeout_s`` seconds, until the ``indexes`` (index assets following
    ``asset_key``) have loaded the partitions ``rows`` materialized (:func:`dagster_gpu.commands.index_wait.wait_for_indexes`),
    saying so when one is behind; returns (their last :class:`~dagster_gpu.commands.index_wait.IndexLag`, the
    seconds waited)."""
    keys = [r.partition_key for r in rows if r.ok]
    if not indexes or not keys:
        return [], 0.0

    def lags():
        return [index_lag(instance, ix, asset_key, keys) for ix in indexes]

    got = lags()
    behind = [g for g in got if g.behind and g.automated]
    if not behind or timeout_s <= 0:
        return got, 0.0
    console.print(f"Waiting up to {timeout_s:.0f} s (--runs-wait) for "
                  + ", ".join(f"index {g.index} to load {len(g.behind)} partition(s)" for g in behind)
                  + " (its automation requests the runs; the daemon keeps running them)", soft_wrap=True)
    started = time.monotonic()
    got = wait_for_indexes(lags, timeout_s=timeout_s, alive=lambda: daemon.why_dead() is None)
    return got, time.monotonic() - started


def run_backfill_with_progress(
    instance,
    defs,
    asset_key,
    partition_keys: Sequence[str],
    workspace,
    *,
    title: str,
    timeout_s: float,
    daemon_log=None,
    console: Console | None = None,
    partitions_def_name: str | None = None,
    run_config=None,
    bills_wait_s: float = 60.0,
    runs_wait_s: float = 300.0,
    running_daemon=None,
    code_location: str = "-m MODULE",
    daemon_instance_ref=None,
    indexes: Sequence = (),
) -> list[PartitionSummary]:
    """Submit an asset backfill, follow it with a progress bar until it ends, print the summary.

    ``running_daemon``: the heartbeat of a daemon already serving the instance
    (:func:`dagster_gpu.commands.backfill.live_backfill_daemon`): the backfill is left to it and followed in the
    instance, as the UI does. Without one a daemon is started on ``workspace`` (its output in ``daemon_log``,
    else a temporary file; ``daemon_instance_ref``, when given, the instance it builds: see
    :class:`dagster_gpu.commands.backfill.DaemonProcess`) and stopped at the end.
    ``run_config`` applies to every run (e.g. ``{"execution": {"config": {"backend": "slurm", ...}}}``).
    After the runs end the daemon keeps running up to ``bills_wait_s`` seconds, until every work unit's
    scheduler bill has landed (:func:`dagster_gpu.commands.backfill.wait_for_bills`); stopping it at once would stop
    run workers still waiting for sacct. Then, up to ``runs_wait_s`` seconds, until the runs and backfills its sensors started
    meanwhile (:func:`drain_other_runs`; ``code_location`` the ``-m`` arguments its hint repeats) ended: stopping the daemon would fail or strand them. Each wait is said on the console with its bound.
    ``indexes``: the vector index assets following ``asset_key``
    (:func:`dagster_gpu.commands.index_wait.index_assets_following`): before that, within the same
    ``runs_wait_s``, it waits until each one with an automation condition has materialized every partition the
    backfill materialized (:func:`dagster_gpu.commands.index_wait.wait_for_indexes`: the index's state in the
    instance, whatever requests its runs), a running daemon's too; an index still behind after it is named with
    why and the command that loads it (:func:`dagster_gpu.commands.index_wait.lag_lines`). Returns the
    per-partition summary (see :func:`dagster_gpu.commands.backfill.summarize_partitions`).

    Raises BackfillAbandoned when the daemon dies, ``timeout_s`` passes or the user interrupts: a backfill
    whose daemon this command started (or whose daemon is gone) is canceled first
    (:func:`dagster_gpu.commands.backfill.abandon_backfill`), so that no later daemon runs it unasked.
    Raises BackfillFailed, after the summary, when the backfill ended with an error stored on it (printed in
    red before the summary), or when a run the daemon this command started ran for its sensors meanwhile (the
    index following the embeddings) failed (each named with its failure: :func:`report_failed_other_runs`).
    """
    from contextlib import nullcontext

    console = console or Console()
    backfill_id = submit_asset_backfill(instance, defs, asset_key, partition_keys, title=title, run_config=run_config)
    console.print(f"Backfill [bold]{backfill_id}[/bold]: {len(partition_keys)} partitions of {asset_key.to_user_string()}")
    if running_daemon is not None:
        console.print(f"Submitted to the dagster-daemon already running on this instance (id {running_daemon.daemon_id}, "
                      f"last heartbeat {max(0.0, time.time() - running_daemon.timestamp):.0f} s ago); following it",
                      soft_wrap=True)
        daemon_cm = nullcontext(RunningDaemon(instance, running_daemon))
    else:
        daemon_cm = DaemonProcess(workspace, log_file=daemon_log, instance=instance, instance_ref=daemon_instance_ref)
    try:
        with daemon_cm as daemon:
            with BackfillFollower(console, len(partition_keys)) as follow:
                final = wait_for_backfill(instance, backfill_id, len(partition_keys), timeout_s=timeout_s, daemon=daemon,
                                          on_progress=follow, partitions_def_name=partitions_def_name)
            rows = summarize_partitions(instance, asset_key, partition_keys, backfill_id, partitions_def_name)
            pending = sum(r.bill_pending for r in rows)
            if pending and bills_wait_s > 0:
                console.print(f"Waiting up to {bills_wait_s:.0f} s (--bills-wait) for the schedulers' bills of "
                              f"{pending} partition(s)", soft_wrap=True)
            rows = wait_for_bills(instance, asset_key, rows, timeout_s=bills_wait_s)
            others_failed = 0
            lags, waited = follow_indexes(instance, daemon, asset_key, rows, indexes, console, runs_wait_s)
            daemon_gone = bool(lags) and daemon.why_dead() is not None
            if running_daemon is None:
                drain_other_runs(instance, daemon, backfill_id, console, max(0.0, runs_wait_s - waited), code_location)
                console.print(f"Stopping the dagster-daemon this command started (up to {DaemonProcess.STOP_S} s)")
        if running_daemon is None:  # the runs it waited for: their failures are this command's to report
            others_failed = report_failed_other_runs(instance, daemon.started_at, backfill_id, console)
        if lags:  # as they stand now: runs the drain waited for may have loaded more
            lags = [index_lag(instance, ix, asset_key, [r.partition_key for r in rows if r.ok]) for ix in indexes]
        for line in lag_lines(lags, waited, daemon_gone, code_location):
            console.print(line, soft_wrap=True, markup=False, highlight=False, style="bold yellow")
    except (DaemonDied, BackfillTimeout, KeyboardInterrupt) as e:
        why = "interrupted" if isinstance(e, KeyboardInterrupt) else str(e)
        if running_daemon is not None and not isinstance(e, DaemonDied):
            what = (f"backfill {backfill_id} goes on in the running dagster-daemon (cancel it in the UI: "
                    f"Overview → Backfills → {backfill_id} → Cancel)")
        else:
            what = abandon_backfill(instance, backfill_id)
        raise BackfillAbandoned(f"{why}\n{what}") from (None if isinstance(e, KeyboardInterrupt) else e)
    error = backfill_error(instance, backfill_id)
    if error is not None:
        console.print(f"[bold red]Backfill {backfill_id} {final.status.lower()}:[/bold red] ", end="")
        console.print(error, soft_wrap=True, markup=False, highlight=False)
    print_summary(console, instance, rows, title=f"Backfill {backfill_id}: {final.status.lower()} in {final.runs} run(s)")
    uf = useful_fraction(rows)
    if uf is not None:
        console.print(f"Useful fraction (Σ embedding seconds ÷ Σ measured seconds, materialized partitions): {uf:.3f}")
    if error is not None:
        raise BackfillFailed(f"backfill {backfill_id} {final.status.lower()}: {error.splitlines()[0]}", rows)
    if others_failed:
        raise BackfillFailed(f"{others_failed} run(s) the daemon's sensors started meanwhile failed (listed above the "
                             f"summary)", rows)
    return rows
