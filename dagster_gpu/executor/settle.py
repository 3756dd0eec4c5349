"""Settling a work unit after its worker ended: the one place a scheduler's bill reaches Dagster.

A backend's ``state(handle)`` only reads. What happens once a unit's worker ended is done here, through
the backend contract (``dagster_gpu.contracts``), in this order:

1. the state is terminal (``Backend.state``); an ``abandoned`` worker (the backend gave up on it while
   its scheduler still holds it) is terminated first (``Backend.terminate``), once; then the unit's
   ``before_bill`` hook, when it was tracked with one (a relayed step: its channel is read to the end, so the
   materializations the bill is split over are in the instance before the bill is written);
2. ``Backend.accounting(handle)``: the scheduler's bill, or None while it has not billed yet (sacct lags the
   task's end; slurmdbd is down): the unit stays tracked and is asked again on the next pass;
3. ``Backend.elect_bill_writer(handle)``: the end-of-unit cleanup (the Kubernetes pod's graceful delete with its UID
   precondition; the Slurm spool's O_EXCL marker); True for exactly one caller across processes;
4. that caller writes the bill with :class:`~dagster_gpu.executor.bill_writer.ObservationWriter`: one
   AssetObservation per partition of the unit (``billing/source``: ``sacct`` or ``pod-interval``), one
   storage batch. A write that fails after the election (the Dagster storage restarting at that moment)
   keeps the bill in this settler, which tracks the unit and writes it on its next pass; only this
   process's death in between loses it.

When: the step handler tracks every handle it launches or re-attaches to (:meth:`Settler.track`). The step
handler stops health-checking a step once its outcome is in the event log, usually before its worker
process (and so its Slurm task or pod) has ended, so a daemon thread settles tracked units once a second
and, every 5 s, the units that ``Backend.unsettled()`` lists (ended units of any orchestrating process
that nobody settled: a run worker exited or was killed first; a relayed unit of a run still going is left to its
own run worker, which reads its channel before billing it). At interpreter exit, :meth:`Settler.finish`
waits up to each backend's ``settle_wait_s`` for the units it launched to end and be billed; what is still
not billed then (a long sacct lag, slurmdbd down) is settled later by another process's sweep. Exactly one
bill per unit across processes: ``elect_bill_writer`` decides.
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
import time
from typing import Callable

from dagster_gpu.contracts import TERMINAL, Backend, Handle, UnitBill
from dagster_gpu.executor.bill_writer import ObservationWriter

log = logging.getLogger(__name__)


def _key(backend: Backend, handle: Handle) -> tuple[str, str]:
    return backend.name, json.dumps(dict(handle), sort_keys=True, default=str)


class Settler:
    """Settles the units of this process's backends (see the module doc).

    Args:
        write: writes one unit's bill and returns the observations written (default: an
            :class:`ObservationWriter`'s ``write``; tests pass a recorder).
        pass_s: seconds between two passes over the tracked units (the daemon thread).
        sweep_s: seconds between two sweeps of ``Backend.unsettled()``.
        background: start the daemon thread and the exit hook at the first :meth:`track` (False: the caller
            drives :meth:`settle`, :meth:`pass_once` and :meth:`finish` itself).
        ready: whether a unit a sweep found, and this process does not track with a ``before_bill`` hook, may be
            billed now (default: :meth:`ObservationWriter.ready`: not a relayed unit whose run is still going, whose
            own run worker bills it once it read the unit's channel to the end; every unit with ``write`` given).
    """

    def __init__(self, write: Callable[[UnitBill], int] | None = None, pass_s: float = 1.0, sweep_s: float = 5.0,
                 background: bool = True, ready: Callable[[UnitBill], bool] | None = None):
        self._writer = ObservationWriter() if write is None else None
        self._write = write or self._writer.write  # type: ignore[union-attr]
        self._ready = ready or (self._writer.ready if self._writer is not None else (lambda bill: True))
        self.pass_s = pass_s
        self.sweep_s = sweep_s
        self._tracked: dict[tuple[str, str], tuple[Backend, Handle]] = {}
        self._before_bill: dict[tuple[str, str], Callable[[], object]] = {}
        self._backends: dict[str, Backend] = {}
        self._terminated: set[tuple[str, str]] = set()
        self._owed: dict[tuple[str, str], UnitBill] = {}  # released here, not written yet (a failed write)
        self._failing: set[tuple[str, str]] = set()  # units whose settling raised once (logged with a traceback)
        self._lock = threading.Lock()
        # One settle at a time: the thread and the exit hook may both reach a unit; holding it through the
        # write also makes the exit hook wait for a bill the thread is writing.
        self._settling = threading.RLock()
        self._started = not background
        self.written = 0  # observations written by this settler (tests, logs)

    # -- what to settle ---------------------------------------------------------------------------------
    def track(self, backend: Backend, handle: Handle, before_bill: Callable[[], object] | None = None) -> None:
        """Settle ``handle``'s unit once it ends (idempotent); the first call starts the thread and the exit hook.
        ``before_bill``: called once the unit is seen ended, before its bill is asked for (see the module doc); an
        exception it raises is logged and the unit is tried again on the next pass."""
        with self._lock:
            self._tracked.setdefault(_key(backend, handle), (backend, handle))
            if before_bill is not None:
                self._before_bill[_key(backend, handle)] = before_bill
            self._backends.setdefault(backend.name, backend)
            start = not self._started
            self._started = True
        if start:
            threading.Thread(target=self._loop, name="dagster-gpu-settler", daemon=True).start()
            atexit.register(self.finish)

    def tracked(self) -> int:
        """Units tracked and not settled yet."""
        with self._lock:
            return len(self._tracked)

    # -- settling ----------------------------------------------------------------------------------------
    def settle(self, backend: Backend, handle: Handle, ended: bool = False) -> bool:
        """Settle one unit if its worker ended (steps 1-4 of the module doc); True when nothing is left to do
        for it (settled here or by another process), False while it runs or its bill is not in yet.
        ``ended``: the backend already said it ended (``unsettled``): skip the state. Errors are logged:
        billing never breaks a run."""
        key = _key(backend, handle)
        with self._settling:
            try:
                bill = self._owed.pop(key, None)
                if bill is None:
                    if not ended:
                        st = backend.state(handle)
                        if st.status not in TERMINAL:
                            return False
                        if st.abandoned and key not in self._terminated:
                            self._terminated.add(key)
                            backend.terminate(handle)
                    self._run_hooks(key, ended)
                    bill = backend.accounting(handle)
                    if bill is None:
                        return False
                    if ended and key not in self._before_bill and not self._ready(bill):
                        return False  # another live process relays this unit's events: it bills the unit
                    if not backend.elect_bill_writer(handle) or bill.empty:
                        self._before_bill.pop(key, None)
                        return True
                self._owed[key] = bill  # until written: released here, nobody else will write it
                n = self._write(bill)
                del self._owed[key]
                self._before_bill.pop(key, None)
                self.written += n
                log.info("%s unit %s settled: %d observation(s)", backend.name, dict(handle), n)
                return True
            except Exception as e:  # noqa: BLE001 - billing never breaks a run; the unit is tried again
                if key in self._failing:  # a unit tried once a second: its traceback once, then one line at DEBUG
                    log.debug("settling the %s unit %s failed again: %s", backend.name, dict(handle), e)
                else:
                    self._failing.add(key)
                    log.exception("settling the %s unit %s failed (tried again every pass; repeats are logged at "
                                  "DEBUG)", backend.name, dict(handle))
                if key in self._owed:  # a unit found by a sweep is not tracked: track it so the bill is retried
                    with self._lock:
                        self._tracked.setdefault(key, (backend, handle))
                return False

    def _run_hooks(self, key: tuple[str, str], ended: bool) -> None:
        """The ``before_bill`` hook of the unit ``key``; for a unit a sweep found (``ended``: its handle as the
        spool or the API lists it, which need not match the tracked one), every hook still registered here, so
        that a unit of this process is never billed before its relay channel was read."""
        with self._lock:
            hooks = [self._before_bill[key]] if key in self._before_bill else (list(self._before_bill.values()) if ended else [])
        for hook in hooks:
            hook()

    def pass_once(self) -> int:
        """Settle every tracked unit once; returns how many are still tracked."""
        with self._lock:
            items = list(self._tracked.items())
        for key, (backend, handle) in items:
            if self.settle(backend, handle):
                with self._lock:
                    self._tracked.pop(key, None)
        return self.tracked()

    def sweep(self, backend: Backend) -> int:
        """Settle every unit ``backend.unsettled()`` lists; returns how many were settled."""
        try:
            handles = list(backend.unsettled())
        except Exception:  # noqa: BLE001
            log.exception("listing the %s backend's unsettled units failed", backend.name)
            return 0
        return sum(1 for h in handles if self.settle(backend, h, ended=True))

    def _loop(self) -> None:
        last_sweep = 0.0
        while True:
            try:
                self.pass_once()
                if time.monotonic() - last_sweep >= self.sweep_s:
                    last_sweep = time.monotonic()
                    with self._lock:
                        backends = list(self._backends.values())
                    for b in backends:
                        self.sweep(b)
            except Exception:  # noqa: BLE001 - keep settling
                log.exception("settler pass failed")
            time.sleep(self.pass_s)

    def finish(self, wait_s: float | None = None) -> int:
        """The exit hook: settle tracked units, waiting at most ``wait_s`` (default: each backend's
        ``settle_wait_s``; a backend with 0 is not waited for) for them to end and be billed, then sweep
        those backends once. Returns how many tracked units are left unsettled."""
        with self._lock:
            backends = dict(self._backends)
        waits = {n: (b.settle_wait_s if wait_s is None else wait_s) for n, b in backends.items()}
        start = time.monotonic()
        while True:
            with self._lock:
                pending = [(k, b, h) for k, (b, h) in self._tracked.items() if time.monotonic() - start <= waits[b.name]
                           and waits[b.name] > 0]
            if not pending:
                break
            for key, backend, handle in pending:
                if self.settle(backend, handle):
                    with self._lock:
                        self._tracked.pop(key, None)
            time.sleep(0.5)
        for name, b in backends.items():
            if waits[name] > 0:
                self.sweep(b)
        with self._settling:  # a bill the thread is writing now
            if self._writer is not None:
                self._writer.close()
            return self.tracked()
