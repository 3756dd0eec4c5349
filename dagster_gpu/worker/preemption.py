"""A graceful stop: SIGTERM or SIGUSR1 asks the unit to stop after the read batch on the device, commit it, and exit.

Who sends what (the worker handles both signals the same way):

- Kubernetes: a pod deleted by preemption (``DisruptionTarget`` / ``PreemptionByScheduler``), eviction, a node drain
  or the executor's terminate: the kubelet sends SIGTERM to the container's main process, waits the pod's
  ``terminationGracePeriodSeconds``, then sends SIGKILL (kubernetes.io, "Pod Lifecycle: Termination of Pods").
- Slurm, a preempting QOS with ``GraceTime`` and ``PreemptMode=REQUEUE``: when GraceTime starts slurmctld signals
  the job's steps only (preempt.c ``job_signal(SIGTERM)`` without the batch flag), not the batch script, which is
  this worker (the job script execs the task runner, which execs the worker:
  :data:`dagster_gpu.slurm.script.JOB_SCRIPT`). So the worker gets SIGTERM when GraceTime ends (SIGKILL after
  ``KillWait``), unless the job asked for a warning signal (``sbatch --signal=B:USR1@<s>``, the
  ``slurm.signal_lead_seconds`` setting) and the site set ``PreemptParameters=send_user_signal``: then SIGUSR1
  arrives as GraceTime starts (measured on 22.05 and 24.11: tests/test_slurm_preempt_e2e.py). The same SIGUSR1
  comes ``<s>`` seconds before the time limit. ``scancel`` without ``--signal``: SIGCONT + SIGTERM, SIGKILL
  after ``KillWait``.

On the signal the handler only sets :attr:`GracefulStop.event` (and notes when and which). The embedding loop
(:func:`dagster_gpu.embedding.pipeline.embed_partition`) polls it after each read batch: it finishes the batch on
the device, commits what it embedded as a checkpoint part and raises ``Preempted``; the unit records one engine
event saying so and exits with :data:`EXIT_PREEMPTED` without a step outcome (:func:`exit_preempted`), so the
step is neither failed nor successful: Slurm's requeue runs it again (:mod:`dagster_gpu.slurm.requeue` reruns a
step without an outcome), and the rerun continues after the committed parts.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Callable

from dagster_gpu.slurm.self_requeue import requeue_after_warning

#: The worker's exit status after a graceful stop: 128 + SIGTERM, what a shell and the schedulers report for a
#: process that SIGTERM ended.
EXIT_PREEMPTED = 128 + signal.SIGTERM
#: The signals that ask for a graceful stop.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class GracefulStop:
    """Turns :data:`STOP_SIGNALS` into :attr:`event`, set once, for threads to poll.

    ``install()`` from the main thread (Python runs signal handlers there only; from another thread it installs
    nothing and the signals keep their previous handlers). ``restore()`` puts the previous handlers back.
    """

    def __init__(self, signals: tuple[int, ...] = STOP_SIGNALS):
        self.signals = tuple(signals)
        self.event = threading.Event()
        self.signum: int | None = None
        self.requested_at: float | None = None  # time.monotonic() of the first signal
        self._previous: dict[int, object] = {}
        self._undo_dagster = None

    def install(self) -> "GracefulStop":
        """Handle :attr:`signals` from now on, and keep Dagster from taking SIGTERM back (see :func:`_dagster_keeps_off`)."""
        if threading.current_thread() is not threading.main_thread():
            return self
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handle)
        self._undo_dagster = _dagster_keeps_off(self.signals)
        return self

    def restore(self) -> None:
        """The previous handlers back, and Dagster's own mapping of SIGTERM."""
        if getattr(self, "_undo_dagster", None) is not None:
            self._undo_dagster()
            self._undo_dagster = None
        for s, h in self._previous.items():
            signal.signal(s, h)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if not self.event.is_set():
            self.signum, self.requested_at = signum, time.monotonic()
            self.event.set()

    @property
    def requested(self) -> bool:
        return self.event.is_set()

    @property
    def signal_name(self) -> str:
        """``SIGTERM``, ``SIGUSR1``, or "" before any signal."""
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def seconds_since(self) -> float:
        """Seconds since the first stop signal (0.0 before any)."""
        return time.monotonic() - self.requested_at if self.requested_at is not None else 0.0


#: The stop the step worker's entry point (:mod:`dagster_gpu.worker.step_main`) installed before Dagster ran, or None.
_PROCESS_STOP: GracefulStop | None = None


def install_process_stop() -> GracefulStop:
    """Take :data:`STOP_SIGNALS` for the whole step worker, before Dagster runs (the entry point's first call).

    Without it a SIGTERM between the worker's start and the asset body reaches Dagster's own handling: ``dagster
    api execute_step`` runs the step inside ``capture_interrupts()`` (Dagster 1.13 ``dagster/_cli/api.py``
    ``execute_step_command``), which maps SIGTERM onto a SIGINT handler that records the interrupt
    (``dagster/_utils/interrupts.py`` ``setup_interrupt_handlers``); the op's error boundary then raises it as
    ``DagsterExecutionInterruptedError`` on entry (``raise_interrupts_as``), before the body's first line, and the
    step is recorded failed. Here the signal is only recorded, and Dagster's mapping keeps to SIGINT for the
    process's life (:func:`_dagster_keeps_off`); the unit adopts this stop (:func:`process_stop`) and treats a
    signal already received as a preemption at once. Idempotent; from the main thread only (elsewhere it records
    nothing, as :meth:`GracefulStop.install`)."""
    global _PROCESS_STOP
    if _PROCESS_STOP is None:
        _PROCESS_STOP = GracefulStop().install()
    return _PROCESS_STOP


def process_stop() -> GracefulStop | None:
    """The stop :func:`install_process_stop` installed, while its handlers are still the signals' (None otherwise:
    not a step worker started by the entry point, e.g. ``materialize()`` in a test)."""
    stop = _PROCESS_STOP
    if stop is None or not stop._previous or signal.getsignal(signal.SIGTERM) != stop._handle:
        return None
    return stop


def _dagster_keeps_off(signals: tuple[int, ...]):
    """Keep Dagster's interrupt handling on SIGINT only while a unit runs; returns the undo function (None when
    Dagster's module does not have the hook this relies on).

    Dagster 1.13 (``dagster/_utils/interrupts.py``) maps SIGTERM onto its SIGINT handler
    (``setup_interrupt_handlers``) each time ``_replace_interrupt_signal`` runs, which is on every entry to and
    exit from the op's error boundary, i.e. around every ``next()`` of the asset body
    (``dagster/_core/execution/plan/compute.py``: ``iterate_with_context(op_execution_error_boundary, ...)``).
    Inside the body that handler raises ``DagsterExecutionInterruptedError`` (the step is recorded failed); between
    two ``next()`` calls it is recorded and raised on the next one. Either way a preempted unit would fail its
    step instead of committing its part. While ours is installed, ``_replace_interrupt_signal`` sets SIGINT only,
    so Ctrl-C still interrupts the step as Dagster does, and ``signals`` stay ours."""
    try:
        from dagster._utils import interrupts  # optional: the worker also runs without Dagster (bench, test children)
    except ImportError:  # a worker without Dagster (the bench, the tests' child processes)
        return None
    original = getattr(interrupts, "_replace_interrupt_signal", None)
    if original is None:
        return None

    def replace_sigint_only(handler) -> None:
        signal.signal(signal.SIGINT, handler)

    interrupts._replace_interrupt_signal = replace_sigint_only

    def undo() -> None:
        interrupts._replace_interrupt_signal = original

    return undo


#: What :func:`exit_preempted` runs before ``os._exit`` (e.g. the relay writer's last upload), in order.
_BEFORE_EXIT: list[Callable[[], None]] = []


def before_exit_preempted(fn: Callable[[], None]) -> Callable[[], None]:
    """Run ``fn`` in :func:`exit_preempted` before the process ends (no ``finally`` runs there): e.g. upload what
    a relay channel writer still buffers. Returns a function that removes it again."""
    _BEFORE_EXIT.append(fn)
    return lambda: _BEFORE_EXIT.remove(fn) if fn in _BEFORE_EXIT else None


def exit_preempted(code: int = EXIT_PREEMPTED, signum: int | None = None) -> None:
    """Flush the logs and standard streams and end the process at once with ``code``: no ``finally`` block,
    atexit handler or Dagster step-outcome event runs after this (``os._exit``). ``signum``: the stop signal;
    a Slurm array task that stopped on its warning SIGUSR1 first asks to be requeued
    (:func:`dagster_gpu.slurm.self_requeue.requeue_after_warning`: 22.05 would not run it again)."""
    said = requeue_after_warning(signum)
    if said:
        print(f"dagster-gpu: {said}", file=sys.stderr)
    for fn in list(_BEFORE_EXIT):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the process ends regardless; say why the hook failed
            print(f"dagster-gpu: before exiting: {type(e).__name__}: {e}", file=sys.stderr)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not keep the process alive
            pass
    os._exit(code)
