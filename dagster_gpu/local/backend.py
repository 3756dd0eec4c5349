"""The ``local`` backend: each step worker is a subprocess on this host, in its own process group.

The worker runs under ``dagster_gpu.local.supervise``, which records the exit code in a status file,
so health checks work after the orchestrating process restarts (no parent to ``wait()`` on) and a
worker that dies without its step recording an outcome is reported with its exit code.

No scheduler bills a local worker, so the process is its own bill (``billing/source: process``): once it
ended, ``accounting`` gives its interval from creation to the exit recorded in the status file, priced by
the observation writer at the devices and device type the unit's materializations report (``cpu`` on a
host without GPUs when none does). Like ``sacct`` for a Slurm array task, that covers what the
materializations' measured shares do not: a failed partition's time, and the unit's tail after its last
partition. Only the launching process knows the step's arguments a bill is written with (kept in memory,
never on disk), so a unit whose orchestrator restarted is not billed; the run worker waits at exit up to
``settle_wait_seconds`` for its workers to end and be billed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import dagster as dg
import psutil

from dagster_gpu.billing.keys import SOURCE
from dagster_gpu.contracts import LOCAL_UNIT_ENV as UNIT_ENV
from dagster_gpu.contracts import (
    STEP_CONTEXT_ENV,
    Backend,
    Handle,
    StepLaunch,
    UnitBill,
    WorkerState,
    WorkerStatus,
    read_step_context,
)
from dagster_gpu.core.extras import require_extra
from dagster_gpu.core.log_tail import log_tail
from dagster_gpu.instance.step_args import ENV_VAR as STEP_ARGS_ENV
from dagster_gpu.local import forkserver, slots
from dagster_gpu.local.supervise import read_status
from dagster_gpu.policy.snapshot import DeviceGroup, LocalState
from dagster_gpu.settings.schema import config_field as settings_config_field
from dagster_gpu.settings.schema import from_section, setting
from dagster_gpu.telemetry.nvml import list_gpus

#: Seconds a launch waits for a fork server it started (its imports take 5-10 s on 2 cores) before it
#: launches cold.
FORKSERVER_START_WAIT_S = 120.0


@dataclass(frozen=True)
class LocalSettings:
    """The ``local:`` section of gpu_executor's config (the one place its defaults are written)."""

    enabled: bool = setting(True, "False: never place a step on this host (backend: auto).")
    log_dir: str | None = setting(None, "Worker logs and status files (default: <instance>/dagster_gpu/local-workers).")
    cuda_visible_devices: str | None = setting(None, "CUDA_VISIBLE_DEVICES exported to every worker (default: inherited).")
    terminate_grace_seconds: float = setting(10.0, "Seconds between SIGTERM and SIGKILL of a worker's process group.")
    settle_wait_seconds: float = setting(30.0, "Seconds the run worker waits at exit for its workers to end and be "
                                               "billed (0: no wait; a worker still running then is not billed).")
    max_units: int | None = setting(
        None, "Local units running at once on this host, across runs and processes (a unit waits for a slot and "
              "says so in its log). None: the cores this host gives the process (os.sched_getaffinity), as each "
              "unit runs torch on threads of its own; 0: no limit.")
    forkserver_idle_seconds: float | None = setting(
        None, "Start workers from a fork server that has imported dagster, torch and sentence-transformers once "
              "(a unit starts in milliseconds, not seconds); it exits after this many seconds without a launch. "
              "None: every worker is a fresh interpreter.")


def config_field() -> dg.Field:
    """The ``local:`` section of gpu_executor's config, generated from :class:`LocalSettings`."""
    return settings_config_field(LocalSettings, "Local backend: step workers as subprocesses on this host.")


def configured(section: Mapping[str, Any] | None) -> bool:
    """The registry hook: the local backend is configured unless its section (optional) disables it."""
    return from_section(LocalSettings, section or {}).enabled


def build_backend(section: Mapping[str, Any] | None, config: Mapping[str, Any], default_log_dir: Path) -> "LocalBackend":
    """The registry hook: a LocalBackend from the ``local:`` section (None: the defaults); its workers' logs go
    to the section's ``log_dir``, else ``default_log_dir``."""
    s = from_section(LocalSettings, section or {})
    return LocalBackend(log_dir=s.log_dir or default_log_dir, cuda_visible_devices=s.cuda_visible_devices,
                        terminate_grace_s=s.terminate_grace_seconds, settle_wait_s=s.settle_wait_seconds,
                        forkserver_idle_s=s.forkserver_idle_seconds, max_units=s.max_units)


@dataclass(frozen=True)
class LocalHandle:
    """A local work unit's handle, as the executor records it in the event log.

    Attributes:
        pid: the supervisor process (its own process group: terminate signals the whole tree).
        create_time: the process's creation time (Unix seconds, psutil): a reused pid is not this worker.
        start_ticks: its start in clock ticks since boot (:func:`start_ticks`), which a step of the wall clock
            does not move; None where /proc has none (then ``create_time`` identifies the process).
        status_file: the JSON file the supervisor writes the exit code and end time to.
        log_file: the worker's stdout/stderr file.
        host: the host it runs on (``os.uname().nodename``).
        unit: the unit's name (run, step, attempt), the key of its process bill; "" in handles recorded
            before units were named.
        forked: started by the fork server (:mod:`dagster_gpu.local.forkserver`), not as a fresh interpreter.
    """

    pid: int
    create_time: float
    status_file: str
    log_file: str
    host: str = ""
    unit: str = ""
    start_ticks: int | None = None
    forked: bool = False

    def to_handle(self) -> dict[str, Any]:
        """The handle as the executor stores it (JSON values)."""
        return {"pid": self.pid, "create_time": self.create_time, "status_file": self.status_file,
                "log_file": self.log_file, "host": self.host, "unit": self.unit,
                **({} if self.start_ticks is None else {"start_ticks": self.start_ticks}),
                **({"forked": True} if self.forked else {})}

    @classmethod
    def from_handle(cls, handle: Mapping[str, Any]) -> "LocalHandle":
        """The handle from its stored form. Raises KeyError without pid, create time or files."""
        return cls(pid=int(handle["pid"]), create_time=float(handle["create_time"]),
                   status_file=str(handle["status_file"]), log_file=str(handle["log_file"]),
                   host=str(handle.get("host") or ""), unit=str(handle.get("unit") or ""),
                   start_ticks=None if handle.get("start_ticks") is None else int(handle["start_ticks"]),
                   forked=bool(handle.get("forked", False)))


class LocalBackend(Backend):
    """Subprocess workers.

    Args:
        log_dir: where worker stdout/stderr and status files go (created).
        cuda_visible_devices: if set, exported to every worker (e.g. ``"0"``); else inherited.
        terminate_grace_s: seconds between SIGTERM and SIGKILL of the worker's process group.
        settle_wait_s: seconds the run worker waits at exit for its workers to end and be billed.
        forkserver_idle_s: start workers from a fork server that exits after this many idle seconds
            (:mod:`dagster_gpu.local.forkserver`); None: each worker is a fresh interpreter.
        max_units: local units running at once on this host (:mod:`dagster_gpu.local.slots`); None: the host's
            cores (:func:`dagster_gpu.local.slots.host_cores`); 0: no limit. Raises ValueError below 0.
        slots_dir: the slots' lock files (default: the fork server's runtime directory + ``unit-slots``).
        nvml: the NVML module to ask for this host's GPUs (default ``pynvml``).
    """

    name = "local"
    workers_survive_orchestrator = False
    preemption_pool = "local"

    def __init__(self, log_dir: str | Path, cuda_visible_devices: str | None = None,
                 terminate_grace_s: float = LocalSettings.terminate_grace_seconds,
                 settle_wait_s: float = LocalSettings.settle_wait_seconds,
                 forkserver_idle_s: float | None = LocalSettings.forkserver_idle_seconds,
                 max_units: int | None = LocalSettings.max_units, slots_dir: str | Path | None = None, nvml=None):
        self.log_dir = Path(log_dir)
        if max_units is not None and (isinstance(max_units, bool) or not isinstance(max_units, int) or max_units < 0):
            raise ValueError(f"local.max_units must be an integer >= 0 (0: no limit) or None, got {max_units!r}")
        self.max_units = slots.host_cores() if max_units is None else max_units
        self._slots_dir = Path(slots_dir) if slots_dir is not None else None
        self._nvml = nvml  # pynvml by default (tests inject one)
        self.cuda_visible_devices = cuda_visible_devices
        self.terminate_grace_s = terminate_grace_s
        self.settle_wait_s = settle_wait_s
        self.forkserver_idle_s = forkserver_idle_s
        self._children: dict[int, subprocess.Popen | _Forked] = {}
        self._bill_env: dict[str, dict[str, str]] = {}  # unit -> what its bill is written with (module doc)
        self._forkserver_failed: set[str] = set()  # fork server keys that did not come up: launched cold

    def launch(self, launch: StepLaunch) -> Handle:
        """Start the step's worker on this host. Raises MissingExtra (one line) for a step that embeds
        (a GPU request of one device or more) where the embed extra is not installed."""
        if launch.request.count > 0:
            require_extra("embed", "the local backend")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        stem = f"{launch.run_id}-{launch.step_key}-{launch.attempt}"
        stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)
        status_file = self.log_dir / f"{stem}.status.json"
        log_file = self.log_dir / f"{stem}.log"
        status_file.unlink(missing_ok=True)
        env = {**os.environ, **launch.env, UNIT_ENV: stem}
        env.pop(slots.ENV_VAR, None)
        if self.max_units:
            directory = self._slots_dir or forkserver.socket_dir() / "unit-slots"
            env[slots.ENV_VAR] = slots.env_value(self.max_units, directory)
        if self.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.cuda_visible_devices
        pid = self._fork(launch, env, log_file, status_file) if self.forkserver_idle_s is not None else None
        if pid is not None:
            self._children[pid] = _Forked(pid)
        else:
            with open(log_file, "ab") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "dagster_gpu.local.supervise", "--status-file", str(status_file), "--", *launch.argv],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own process group: terminate kills the whole tree
                    close_fds=True,
                )
            pid = proc.pid
            self._children[pid] = proc
        self._bill_env[stem] = {k: launch.env[k] for k in (STEP_ARGS_ENV, STEP_CONTEXT_ENV) if k in launch.env}
        child = self._children[pid]
        forked = isinstance(child, _Forked)
        return LocalHandle(
            pid=pid, create_time=child.create_time if forked else psutil.Process(pid).create_time(),
            status_file=str(status_file), log_file=str(log_file), host=os.uname().nodename, unit=stem,
            start_ticks=child.ticks if forked else start_ticks(pid), forked=forked,
        ).to_handle()

    def _fork(self, launch: StepLaunch, env: Mapping[str, str], log_file: Path, status_file: Path) -> int | None:
        """The supervisor's pid from the fork server of this launch's key, or None (launch cold). With no
        server answering, one is started and waited for up to :data:`FORKSERVER_START_WAIT_S` seconds (its
        imports: this process waits, no device is held); one that does not come up, or refuses, is named in
        the unit's log, and this process launches its units for that key cold from then on."""
        python, cwd = launch.argv[0], os.getcwd()
        if len(launch.argv) < 3 or launch.argv[1] != "-m":
            return None
        key = forkserver.server_key(python, cwd, env)
        if key in self._forkserver_failed:
            return None
        sock = forkserver.socket_dir() / f"{key}.sock"
        server_log = self.log_dir / f"forkserver-{key}.log"
        request = forkserver.Launch(tuple(launch.argv), dict(env), cwd, str(log_file.resolve()), str(status_file.resolve()))
        try:
            pid = forkserver.request_launch(sock, request)
            if pid is None:
                server_env = {k: v for k, v in env.items() if k not in launch.env and k not in (UNIT_ENV, slots.ENV_VAR)}  # no run's secrets
                server = forkserver.start_server(python, sock, server_env, cwd, server_log,
                                                 float(self.forkserver_idle_s or 0))
                deadline = time.monotonic() + FORKSERVER_START_WAIT_S
                while pid is None and time.monotonic() < deadline and server.poll() in (None, 0):  # 0: another one serves
                    time.sleep(0.2)
                    pid = forkserver.request_launch(sock, request)
                if pid is None and server.poll() not in (None, 0):
                    raise RuntimeError(f"the fork server for {sock} exited with code {server.returncode}")
            if pid is None:
                raise RuntimeError(f"no fork server answered on {sock} within {FORKSERVER_START_WAIT_S:g} s")
        except (RuntimeError, OSError) as e:
            self._forkserver_failed.add(key)
            with open(log_file, "a") as log:
                log.write(f"dagster-gpu: {e} (its log: {server_log}); this unit starts a fresh interpreter\n")
            return None
        return pid

    def state(self, handle: Handle) -> WorkerState:
        h = LocalHandle.from_handle(handle)
        pid = h.pid
        child = self._children.get(pid)
        if child is not None and child.poll() is not None:
            self._children.pop(pid, None)
        status = read_status(Path(h.status_file))
        if status is not None and "exit_code" in status:
            code = int(status["exit_code"])
            message = status.get("message", f"worker exited with code {code}")
            if code != 0:
                message += f"; last lines of {h.log_file}:\n{log_tail(Path(h.log_file))}"
            return WorkerState(WorkerStatus.SUCCEEDED if code == 0 else WorkerStatus.FAILED, exit_code=code, message=message)
        if _alive(pid, h.create_time, h.start_ticks):
            return WorkerState(WorkerStatus.RUNNING)
        code = child.returncode if child is not None else None
        return WorkerState(
            WorkerStatus.FAILED,
            exit_code=code,
            message=f"worker process {pid} is gone without an exit status (killed? exit code {code}); log: {h.log_file}",
        )

    def terminate(self, handle: Handle) -> None:
        h = LocalHandle.from_handle(handle)
        pid = h.pid
        if not _alive(pid, h.create_time, h.start_ticks):
            return
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + self.terminate_grace_s
        while time.monotonic() < deadline:
            if not _alive(pid, h.create_time, h.start_ticks):
                break
            time.sleep(0.1)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child = self._children.pop(pid, None)
        if child is not None:
            child.wait(timeout=5)

    def accounting(self, handle: Handle) -> UnitBill | None:
        """The ended worker's process bill (module doc): its wall seconds from process creation to the exit
        in its status file. None while it runs; ``UnitBill.nothing`` when another process launched it or it
        left no exit time (killed with its supervisor)."""
        h = LocalHandle.from_handle(handle)
        env = self._bill_env.get(h.unit)
        if env is None:
            return UnitBill.nothing("launched by another process: the step's arguments are not known here")
        status = read_status(Path(h.status_file))
        if status is None or "finished" not in status:
            if _alive(h.pid, h.create_time, h.start_ticks):
                return None
            return UnitBill.nothing(f"worker process {h.pid} left no exit time")
        wall = max(0.0, float(status["finished"]) - h.create_time)
        rates = read_step_context(env).get("rates") or {"default": 0.0}
        return UnitBill(
            gpu_seconds=0.0, wall_seconds=wall, rate_usd_per_gpu_hour=None, rates=rates,
            device_type=self._device_type(),
            metadata={SOURCE: "process", "dagster_gpu/backend": "local", "local/unit": h.unit,
                      "local/pid": h.pid, "local/host": h.host, "local/unit_wall_seconds": wall,
                      "local/exit_code": int(status.get("exit_code", -1))},
            match=("local/unit", h.unit), env=env,
        )

    def _device_type(self) -> str | None:
        """What a unit that materialized nothing is priced as: ``cpu`` on a host without GPUs, the product on
        a host with one GPU product, else None (the rate table's ``default``)."""
        products = {g.product for g in list_gpus(self._nvml)}
        if not products:
            return "cpu"
        return products.pop() if len(products) == 1 else None

    def elect_bill_writer(self, handle: Handle) -> bool:
        """True once per unit, for this process (the only one that can bill it)."""
        return self._bill_env.pop(LocalHandle.from_handle(handle).unit, None) is not None

    def policy_state(self) -> LocalState:
        """This host as a ``LocalState``: one pool per GPU product NVML sees (free = total minus our running
        workers), none on a CPU-only host."""
        running = sum(1 for p in list(self._children.values()) if p.poll() is None)
        gpus = list_gpus(self._nvml)
        pools = []
        for product in sorted({g.product for g in gpus}):
            same = [g for g in gpus if g.product == product]
            pools.append(
                DeviceGroup(
                    device=product, product=product, memory_gib=min(g.memory_gib for g in same),
                    free=max(0, len(same) - running), total=len(same),
                )
            )
        return LocalState(pools=tuple(pools), preemption_pool=self.preemption_pool)

    def handle_metadata(self, handle: Handle):
        h = LocalHandle.from_handle(handle)
        return {"local/pid": h.pid, "local/log_file": h.log_file, "local/host": h.host,
                **({"local/unit": h.unit} if h.unit else {}), **({"local/forked": True} if h.forked else {})}


def start_ticks(pid: int) -> int | None:
    """Process ``pid``'s start time in clock ticks since boot: field 22 (``starttime``) of ``/proc/<pid>/stat``
    (proc(5)). It never changes for a process, unlike psutil's ``create_time()``, which adds the boot time of
    ``/proc/stat``'s ``btime`` and so moves when the wall clock is stepped (psutil's own docstring: "affected by
    changes such as manual adjustments or time synchronization (e.g. NTP)"). None where there is no such file
    (not Linux, or the process is gone)."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces and ')': split after the last one;
    # the first field after it is field 3 (state), so field 22 is index 19
    return int(data[data.rindex(b")") + 2:].split()[19])


class _Forked:
    """A worker the fork server started, as the backend tracks a ``subprocess.Popen``: ``poll`` (None while
    it runs), ``wait`` and ``returncode`` (None: not this process's child, its exit code is in its status file)."""

    returncode = None

    def __init__(self, pid: int):
        self.pid = pid
        self.ticks = start_ticks(pid)
        try:
            self.create_time = psutil.Process(pid).create_time()
        except psutil.NoSuchProcess:  # ended (and reaped by the server) already: its status file has the rest
            self.create_time, self.ticks = time.time(), None

    def poll(self) -> int | None:
        return None if _alive(self.pid, self.create_time, self.ticks) else 0

    def wait(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.05)


def _alive(pid: int, create_time: float, ticks: int | None = None) -> bool:
    """True if ``pid`` is the same process we started (guards against pid reuse) and not a zombie: the same
    start ticks (:func:`start_ticks`) where both are known, else the same ``create_time``."""
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        now = start_ticks(pid) if ticks is not None else None
        return now == ticks if now is not None else abs(p.create_time() - create_time) < 0.01
    except psutil.NoSuchProcess:
        return False
