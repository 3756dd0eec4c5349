"""How many CPUs this worker was given, and torch's share of them when several workers share a host.

``os.cpu_count()`` is the host's core count, not the worker's: a Slurm array task gets
``SLURM_CPUS_PER_TASK``, a Kubernetes pod a cgroup CPU quota (``cpu.max`` in cgroup v2,
``cpu.cfs_quota_us``/``cpu.cfs_period_us`` in v1), a pinned process an affinity mask. torch's default
intra-op thread count is the host's, so a 2-CPU pod on a 64-core node runs 64 threads on 2 CPUs.

Several local workers on one host each see the whole affinity mask; each taking all of it
oversubscribes the cores (2 workers × 2 threads on 2 cores). ``CpuShare`` counts the live workers that
share this worker's CPU set through lock files in a host-wide directory (a held ``flock`` = a live
worker; the kernel drops it when the process dies, so a killed worker never counts) and gives each
``max(1, cpus // workers)`` threads, re-read while the worker runs so a worker that ends frees its share.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

#: Set to ``0`` to switch the host-wide sharing off (each worker then takes every CPU it was given).
SHARE_ENV = "DAGSTER_GPU_CPU_SHARE"
#: Directory of the sharing lock files (default ``<tmp>/dagster-gpu-cpu-share-<uid>``).
SHARE_DIR_ENV = "DAGSTER_GPU_CPU_SHARE_DIR"


@dataclass(frozen=True)
class CpuAllotment:
    """``cpus`` (>= 1) this process may use, ``source`` says which limit set it (for the metadata)."""

    cpus: int
    source: str


def parse_cgroup_v2_cpu_max(text: str) -> float | None:
    """CPUs of a cgroup v2 ``cpu.max`` (``"<quota> <period>"`` in µs, or ``"max <period>"``): quota ÷ period,
    None when unlimited. Raises ValueError on anything else."""
    parts = text.split()
    if len(parts) != 2:
        raise ValueError(f"cpu.max: expected '<quota> <period>', got {text!r}")
    if parts[0] == "max":
        return None
    quota, period = int(parts[0]), int(parts[1])
    if quota <= 0 or period <= 0:
        raise ValueError(f"cpu.max: non-positive quota or period in {text!r}")
    return quota / period


def parse_cgroup_v1_quota(quota_text: str, period_text: str) -> float | None:
    """CPUs of cgroup v1 ``cpu.cfs_quota_us`` ÷ ``cpu.cfs_period_us``; None when the quota is -1 (unlimited)."""
    quota, period = int(quota_text.strip()), int(period_text.strip())
    if quota < 0:
        return None
    if period <= 0:
        raise ValueError(f"cpu.cfs_period_us must be > 0, got {period}")
    return quota / period


def allotment_from(slurm_cpus_per_task: str | None, cgroup_cpus: float | None, affinity_cpus: int) -> CpuAllotment:
    """The smallest of the three limits (pure): Slurm's ``SLURM_CPUS_PER_TASK``, a cgroup quota in CPUs
    (rounded up: 1.5 CPUs of quota keep 2 threads busy 75 % of the time), the affinity mask's size.

    A malformed ``SLURM_CPUS_PER_TASK`` is ignored (the cgroup and the mask still bound the worker).
    """
    best = CpuAllotment(max(1, int(affinity_cpus)), f"affinity mask ({affinity_cpus} CPUs)")
    if cgroup_cpus is not None:
        n = max(1, math.ceil(cgroup_cpus - 1e-9))
        if n < best.cpus:
            best = CpuAllotment(n, f"cgroup CPU quota ({cgroup_cpus:g} CPUs)")
    if slurm_cpus_per_task:
        try:
            n = int(slurm_cpus_per_task)
        except ValueError:
            n = 0
        if n >= 1 and n < best.cpus:
            best = CpuAllotment(n, f"SLURM_CPUS_PER_TASK={n}")
    return best


def _cgroup_cpus(proc_self_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The tightest CPU quota on this process's cgroup path (v2 unified, else v1 ``cpu``), None if none."""
    try:
        lines = proc_self_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas: list[float] = []
    for line in lines:
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        rel = path.lstrip("/")
        if hid == "0" and controllers == "":  # v2: check the path and its ancestors
            p = root / rel
            while True:
                try:
                    q = parse_cgroup_v2_cpu_max((p / "cpu.max").read_text())
                    if q is not None:
                        quotas.append(q)
                except (OSError, ValueError):
                    pass
                if p == root or root not in p.parents:
                    break
                p = p.parent
        elif "cpu" in controllers.split(","):
            for mount in ("cpu,cpuacct", "cpu", "cpuacct,cpu"):
                d = root / mount / rel
                try:
                    q = parse_cgroup_v1_quota((d / "cpu.cfs_quota_us").read_text(), (d / "cpu.cfs_period_us").read_text())
                except (OSError, ValueError):
                    continue
                if q is not None:
                    quotas.append(q)
                break
    return min(quotas) if quotas else None


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def allotted_cpus(env: Mapping[str, str] | None = None) -> CpuAllotment:
    """The CPUs this process was given: min(SLURM_CPUS_PER_TASK, cgroup CPU quota, affinity mask)."""
    env = os.environ if env is None else env
    return allotment_from(env.get("SLURM_CPUS_PER_TASK"), _cgroup_cpus(), len(_affinity()))


def share_threads(cpus: int, workers: int) -> int:
    """Threads for one of ``workers`` live workers sharing ``cpus`` CPUs: ``max(1, cpus // workers)``."""
    return max(1, cpus // max(1, workers))


class CpuShare:
    """This worker's place among the live workers sharing its CPU set (see the module docstring).

    ``threads()`` is ``share_threads(allotment.cpus, live workers)``, re-counted at most every
    ``recount_s`` seconds. ``close()`` (or process exit) leaves the share. With ``DAGSTER_GPU_CPU_SHARE=0``
    (or ``enabled=False``) no lock file is made and ``threads()`` is the whole allotment.
    """

    def __init__(self, allotment: CpuAllotment | None = None, *, directory: str | Path | None = None,
                 enabled: bool | None = None, recount_s: float = 2.0, env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        self.allotment = allotment or allotted_cpus(env)
        self.enabled = (env.get(SHARE_ENV, "1") != "0") if enabled is None else enabled
        self.recount_s = recount_s
        self._dir = Path(directory or env.get(SHARE_DIR_ENV) or Path(tempfile.gettempdir()) / f"dagster-gpu-cpu-share-{os.getuid()}")
        cpus = ",".join(str(c) for c in sorted(_affinity()))
        self._key = hashlib.sha256(f"{cpus}|{self.allotment.cpus}".encode()).hexdigest()[:12]
        self._fd: int | None = None
        self._path: Path | None = None
        self._workers = 1
        self._counted_at = float("-inf")
        if self.enabled:
            self._join()

    def _join(self) -> None:
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Locked under a name the others do not count, then renamed into place: a file that appeared unlocked
        # (between open and flock) would be taken for a dead worker's and removed by a worker counting.
        name = f"{self._key}-{os.getpid()}-{time.monotonic_ns()}.lock"
        staging = self._dir / f".{name}.new"
        fd = os.open(staging, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(staging, self._dir / name)  # the flock belongs to the open file, not the name
        except BaseException:
            os.close(fd)
            staging.unlink(missing_ok=True)
            raise
        self._path = self._dir / name
        self._fd = fd

    def workers(self) -> int:
        """Live workers sharing this CPU set, this one included (stale lock files are removed)."""
        if self._fd is None:
            return 1
        live = 0
        for p in self._dir.glob(f"{self._key}-*.lock"):
            try:
                fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    live += 1  # held by a live worker (our own file is held through another descriptor)
                continue
            finally:
                os.close(fd)
            try:  # nobody holds it: its worker died without cleaning up
                p.unlink()
            except FileNotFoundError:
                pass
        return max(1, live)

    def threads(self) -> int:
        """torch intra-op threads for this worker now."""
        if self._fd is None:
            return self.allotment.cpus
        now = time.monotonic()
        if now - self._counted_at >= self.recount_s:
            self._workers = self.workers()
            self._counted_at = now
        return share_threads(self.allotment.cpus, self._workers)

    def close(self) -> None:
        if self._fd is not None:
            try:
                if self._path is not None:
                    self._path.unlink(missing_ok=True)
            finally:
                os.close(self._fd)
                self._fd = None
