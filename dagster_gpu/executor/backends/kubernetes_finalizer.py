"""The Kubernetes backend's finalizer: every step pod gets its pod-interval bill and is deleted once it ends.

The step handler may never health-check a step again once its outcome is in the event log, so the backend
cannot rely on ``state`` calls to notice a pod's end. A daemon thread checks every pod this process launched
(or re-attached to) once a second; every 5 s it also sweeps the namespace for ended dagster-gpu pods of any
orchestrator (a run worker may exit, or be killed, between its step recording success and its pod ending);
and at interpreter exit :meth:`PodFinalizer.finalize_all` waits a bounded time for the pods still running.
Finishing itself (bill, delete) is the backend's ``_finish``: exactly one process reports a pod, the one whose
delete with the pod's UID precondition succeeded.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from datetime import datetime
from typing import TYPE_CHECKING

from dagster_gpu.contracts import TERMINAL, Handle
from dagster_gpu.executor.backends.kubernetes_pod_state import pod_state, terminated
from dagster_gpu.k8s import manifests as m

if TYPE_CHECKING:  # the backend owns its finalizer; annotation only
    from dagster_gpu.executor.backends.kubernetes import KubernetesBackend

log = logging.getLogger("dagster_gpu.executor.backends.kubernetes")


def _epoch(ts: str | None) -> float | None:
    """Unix seconds of an RFC 3339 timestamp as the API serialises it (``2026-11-30T15:32:50+00:00``)."""
    if not ts:
        return None
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


class PodFinalizer:
    """Finalizes the pods of one backend (see the module docstring).

    Args:
        backend: the backend whose ``state`` / ``_finish`` decide and finish each pod.
        wait_s: at interpreter exit, wait at most this long for tracked pods to end (0: no exit hook).
        sweep_grace_s: sweep other processes' pods that ended this many seconds ago; negative: never sweep.
    """

    def __init__(self, backend: KubernetesBackend, wait_s: float, sweep_grace_s: float):
        self.backend = backend
        self.wait_s = wait_s
        self.sweep_grace_s = sweep_grace_s
        self.active: dict[str, Handle] = {}  # pod uid -> handle, launched here and not yet finalized
        self._lock = threading.Lock()
        self._started = False

    def is_tracked(self, uid: str) -> bool:
        with self._lock:
            return uid in self.active

    def track(self, handle: Handle) -> None:
        """Finalize ``handle``'s pod when it ends; starts the thread (and the exit hook) on first use."""
        with self._lock:
            self.active[str(handle["pod_uid"])] = handle
            start = not self._started
            self._started = True
        if start:
            threading.Thread(target=self._loop, name="dagster-gpu-k8s-finalizer", daemon=True).start()
            if self.wait_s > 0:
                atexit.register(self.finalize_all, self.wait_s)

    def pass_once(self) -> int:
        """Check every tracked handle once (finalizing ended pods); returns how many are still tracked."""
        with self._lock:
            handles = list(self.active.values())
        for h in handles:
            if self.backend.state(h).status in TERMINAL:
                with self._lock:
                    self.active.pop(str(h["pod_uid"]), None)
        with self._lock:
            return len(self.active)

    def _loop(self) -> None:
        last_sweep = 0.0
        while True:
            try:
                self.pass_once()
                if self.sweep_grace_s >= 0 and time.monotonic() - last_sweep >= 5.0:
                    last_sweep = time.monotonic()
                    self.sweep(self.sweep_grace_s)
            except Exception:  # noqa: BLE001 - keep finalizing
                log.exception("kubernetes finalizer pass failed")
            time.sleep(1.0)

    def sweep(self, grace_s: float = 10.0) -> int:
        """Finalize ended pods of *any* orchestrator: every dagster-gpu pod in the namespace that ended more
        than ``grace_s`` seconds ago gets its observation written and is deleted, exactly once across
        processes (the delete's UID precondition decides who reports). Returns how many this call finalized."""
        n = 0
        now = time.time()
        for pod in self.backend.kube.list_pods(f"{m.LABEL_MANAGED_BY}={m.MANAGED_BY}"):
            if pod.status.phase not in ("Succeeded", "Failed"):
                continue
            body = m.to_dict(pod)
            term = terminated(body)
            ended = _epoch(term.get("finishedAt")) if term is not None else None
            if ended is not None and now - ended < grace_s:
                continue
            uid = pod.metadata.uid
            if self.is_tracked(uid) or self.backend.is_final(uid):
                continue
            self.backend._finish(m.handle_from_pod(pod), pod, pod_state(body, 0.0, self.backend.timeouts).state)
            n += 1
        return n

    def finalize_all(self, wait_s: float) -> int:
        """Finalize ended pods, waiting at most ``wait_s`` for the others to end; returns how many remain
        (-1 when a pass failed)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                left = self.pass_once()
            except Exception:  # noqa: BLE001
                log.exception("kubernetes finalize at exit failed")
                return -1
            if left == 0 or time.monotonic() > deadline:
                # wait for a finish (observation write) the finalizer thread may be in the middle of
                with self.backend._finish_lock:
                    return left
            time.sleep(0.5)
