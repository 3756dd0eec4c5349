"""Pools where a shared (TimeSlicing / MPS) claim failed to prepare, remembered so the policy stops choosing
shared placements there (read into ``KubernetesState.no_sharing``).

Why: since NVIDIA/k8s-dra-driver-gpu 25.8 the kubelet plugin rejects a ``GpuConfig``/``MigDeviceConfig``
sharing config at NodePrepareResources unless the driver's ``TimeSlicingSettings`` / ``MPSSupport`` feature
gates are on (``pkg/featuregates/featuregates.go``: alpha, off by default); the pod then stays in
ContainerCreating with a ``FailedPrepareDynamicResources`` event. The gates are set once per driver
installation, so a pool that failed once fails again: the next steps placed there get an unshared device.

A pool is a policy pool's device type (``NVIDIA A100-SXM4-80GB``, ``mig-1g.10gb``), or ``*`` for every pool
(a failure of a step placed without a device, e.g. on a forced backend). Entries expire after ``ttl_s``
(default 6 h) so that enabling the gates takes effect without a restart. The memory is a small JSON file
(``{"<pool>": {"reason": str, "at": unix seconds}}``, replaced atomically) shared by the run workers of one
Dagster instance, or in-process only without a path.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Mapping

from dagster_gpu.core.jsonfile import read_json, write_json

ALL_POOLS = "*"
DEFAULT_TTL_S = 6 * 3600.0


def default_path(env: Mapping[str, str] | None = None) -> Path | None:
    """``$DAGSTER_HOME/dagster_gpu/sharing-failures.json``, or None (in-process memory) without DAGSTER_HOME."""
    home = (env if env is not None else os.environ).get("DAGSTER_HOME")
    return Path(home) / "dagster_gpu" / "sharing-failures.json" if home else None


class SharingFailures:
    """``record(pool, reason)`` after a shared claim failed to prepare; ``blocked()`` -> ``{pool: reason}``.

    Args:
        path: the JSON file, or None for an in-process memory. A file that cannot be read or parsed counts
            as empty (the memory is advisory: the worst case is one more failed shared prepare).
        ttl_s: seconds an entry is kept (> 0).
    """

    def __init__(self, path: str | Path | None = None, ttl_s: float = DEFAULT_TTL_S):
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
        self.path = Path(path) if path is not None else None
        self.ttl_s = float(ttl_s)
        self._lock = threading.Lock()
        self._mem: dict[str, dict] = {}

    def _load(self) -> dict[str, dict]:
        if self.path is None:
            return dict(self._mem)
        d = read_json(self.path)
        return {k: v for k, v in d.items() if isinstance(v, dict) and isinstance(v.get("at"), (int, float))} \
            if isinstance(d, dict) else {}

    def _save(self, d: dict[str, dict]) -> None:
        if self.path is None:
            self._mem = d
            return
        write_json(self.path, d, mode=0o600, sort_keys=True)

    def record(self, pool: str | None, reason: str, now: float | None = None) -> None:
        """Remember that a shared claim on ``pool`` (None: :data:`ALL_POOLS`) failed to prepare."""
        now = time.time() if now is None else now
        with self._lock:
            d = self._live(self._load(), now)
            d[pool or ALL_POOLS] = {"reason": str(reason)[:500], "at": float(now)}
            self._save(d)

    def blocked(self, now: float | None = None) -> dict[str, str]:
        """``{pool: reason}`` of the unexpired failures."""
        now = time.time() if now is None else now
        with self._lock:
            return {k: str(v.get("reason", "")) for k, v in self._live(self._load(), now).items()}

    def allows_sharing(self, device: str | None, now: float | None = None) -> bool:
        """Whether a step placed on pool ``device`` (None: placed without a device) may still get a shared
        claim: neither that pool nor :data:`ALL_POOLS` has an unexpired failure."""
        blocked = self.blocked(now)
        return ALL_POOLS not in blocked and (device or ALL_POOLS) not in blocked

    def _live(self, d: dict[str, dict], now: float) -> dict[str, dict]:
        return {k: v for k, v in d.items() if now - float(v["at"]) < self.ttl_s}
