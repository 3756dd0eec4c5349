"""When the coalescer submits its pending launches: the coalescing window rule (pure logic).

A job array is worth more the more steps it carries (one ``sbatch``, one scheduling decision and one
accounting record for all of them), and a launch held back costs start latency only if a GPU it could
use would otherwise idle. So pending launches are submitted when:

1. they fill an array (``chunk`` tasks: MaxArraySize or ``max_tasks_per_array``); or
2. the oldest has waited ``hard_cap_s`` (no hold outlasts it); else they are held while
3. our earlier job arrays with the same sbatch options hold at least ``backlog_tasks`` pending tasks
   (default: the array throttle %T): Slurm starts one of those whenever one of our tasks ends, so
   every GPU the arrays may use stays busy and holding costs nothing; or while
4. the newest launch's backfill has more runs that can start now (``to_come``, see
   :mod:`dagster_gpu.executor.backfill_hint`), the waiting launches carry fewer than ``target_tasks``
   partitions, and launches keep coming (the last one less than ``max_window_s`` ago): the next ones
   are seconds away; otherwise they are submitted when
5. no launch arrived for ``window_s`` (a quiet gap), or the oldest has waited ``max_window_s``.

A launch outside a backfill (a materialization from the UI, a sensor's run) therefore waits only for
the quiet gap. With ``backlog_tasks = 0`` and ``target_tasks = 0`` this is the plain quiet-gap window.

Rule 4 counts partitions, not launches: a ranged run's launch (``BackfillPolicy.multi_run``) is a unit
that embeds its whole range, already an array's worth of work, and holding it for the next run costs
that run's creation time (Dagster writes one planned event per partition: ~15 s for 500 on the
benchmark host) of idle GPU. A one-partition launch counts one, as before.
Figures: docs/benchmarks.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class WindowRule:
    """The coalescing window (seconds; see module doc).

    Attributes:
        window_s: quiet gap that ends a window.
        max_window_s: longest wait of a launch while our earlier arrays have no backlog.
        hard_cap_s: longest wait of a launch in any case (bounds the backlog hold).
        backlog_tasks: hold launches while at least this many tasks of our earlier arrays with the same
            sbatch options are pending; None: the array's throttle %T (1 when unthrottled); 0: never.
        target_tasks: while a backfill has more runs starting, hold launches until they carry this many
            partitions (0: never hold for a backfill).
    """

    window_s: float = 2.0
    max_window_s: float = 15.0
    hard_cap_s: float = 120.0
    backlog_tasks: int | None = None
    target_tasks: int = 10

    def __post_init__(self):
        if min(self.window_s, self.max_window_s, self.hard_cap_s, self.target_tasks, self.backlog_tasks or 0) < 0:
            raise ValueError(f"coalescing window settings must not be negative: {self}")


@dataclass(frozen=True)
class FlushDecision:
    """``due``: submit now; ``reason``: why (or why not), for logs and the step's launch message."""

    due: bool
    reason: str


def decide_flush(
    rule: WindowRule,
    now: float,
    created: Sequence[float],
    chunk: int,
    backlog: int | None,
    throttle: int = 0,
    to_come: int | None = None,
    partitions: int | None = None,
) -> FlushDecision:
    """Whether launches created at ``created`` (epoch s, one per launch of one sbatch-options group) are due.

    Args:
        rule: the window settings.
        now: epoch seconds.
        created: creation times of the group's pending launches (non-empty).
        chunk: tasks per array (>= 1).
        backlog: pending tasks of our earlier arrays with the same options, None when unknown (no
            fresh poll): unknown never holds a launch.
        throttle: the group's array throttle %T (0: none), the default hold threshold.
        to_come: launches the newest launch's backfill is about to make (None: not a backfill).
        partitions: partitions the pending launches embed together (None: one each).

    Raises:
        ValueError: ``created`` is empty.
    """
    if not created:
        raise ValueError("no pending launches")
    waited = now - min(created)
    quiet = now - max(created)
    if len(created) >= chunk:
        return FlushDecision(True, f"{len(created)} launches fill an array of {chunk}")
    if waited >= rule.hard_cap_s:
        return FlushDecision(True, f"oldest launch waited {waited:.1f}s (cap {rule.hard_cap_s:g}s)")
    hold_at = rule.backlog_tasks if rule.backlog_tasks is not None else max(1, throttle)
    if hold_at and backlog is not None and backlog >= hold_at:
        return FlushDecision(False, f"earlier arrays still have {backlog} pending tasks (hold at >= {hold_at})")
    held = len(created) if partitions is None else partitions
    if to_come and held < rule.target_tasks and quiet < rule.max_window_s:
        return FlushDecision(
            False, f"{to_come} more run(s) of the backfill can start: holding {len(created)} launch(es) "
                   f"({held} partition(s)) for an array of {rule.target_tasks}"
        )
    if quiet >= rule.window_s:
        return FlushDecision(True, f"no launch for {quiet:.1f}s (window {rule.window_s:g}s)")
    if waited >= rule.max_window_s:
        return FlushDecision(True, f"oldest launch waited {waited:.1f}s (max window {rule.max_window_s:g}s)")
    return FlushDecision(False, f"window open: last launch {quiet:.1f}s ago")
