"""The ``slurm`` backend: each step is one task of a job array on a Slurm cluster.

Config (``execution: config: slurm:``)::

    slurm:
      slurm_conf: /etc/slurm/slurm.conf        # default: $SLURM_CONF / Slurm's default
      spool_dir: /shared/dagster-gpu-spool     # default: see default_spool_dir(); must be ours, not group/other-writable
      spool_shared_group: gpu-team             # opt in to a spool shared by this Unix group (dirs 2770); default: private (0700)
      account: research                        # sbatch --account
      slurm_partition: gpu                     # sbatch --partition (default: the cluster's default)
      qos: normal                              # sbatch --qos
      time_limit: "01:00:00"                   # sbatch --time
      throttle: 4                              # %T of each array (default: GPUs in the slurm partition / GPUs per task)
      coalesce_window_seconds: 2.0             # launches share one sbatch until none arrived for this long…
      coalesce_max_window_seconds: 15.0        # …or the first of them has waited this long
      coalesce_backlog_tasks: 4                # hold launches while our earlier arrays have this many pending tasks
                                               # (default: the array throttle; 0: never hold)
      coalesce_target_tasks: 10                # while a backfill is starting more runs, hold launches until this many wait
                                               # (keep it below the run queue's max_concurrent_runs; 0: never)
      coalesce_hold_max_seconds: 120.0         # longest any launch is held (must stay under submit_timeout_seconds)
      max_tasks_per_array: 1000                # cap per sbatch (MaxArraySize from the controller also applies)
      poll_interval_seconds: 2.0               # one squeue + one sacct per interval, for every array in the spool
      shards_per_gpu: 4                        # shard GRES per GPU (the gres.conf Count per device)
      shards_per_shared_task: 1                # --gres=shard:N for a step with dagster-gpu/shared-ok
      extra_sbatch_args: ["--constraint=a100"] # appended as argv items, never through a shell
      env_files: ["~/.dagster-gpu.env"]        # KEY=VALUE secrets (mode 0600) loaded by each task
      python: /shared/venv/bin/python          # interpreter on the compute nodes (default: this one)
      wait_limits_seconds:                     # longest wait in each non-terminal state (0 = no limit);
        held: 1800                             #   REQUEUE_HOLD, SPECIAL_EXIT, PENDING JobHeldAdmin/JobHeldUser
        preempted: 300                         #   PREEMPTED and not requeued
        suspended: 3600                        #   SUSPENDED, STOPPED
        pending: 86400                         #   PENDING/CONFIGURING/REQUEUED for any other reason
        completing: 1800                       #   COMPLETING, SIGNALING, STAGE_OUT

Waits: a task that stays longer than its limit in a non-terminal state (measured from when this process
first saw it there) fails its step with a message naming the state, its reason and the limit, and is
cancelled (``scancel``) so it never runs later: a held task (``scontrol requeuehold``, SPECIAL_EXIT)
otherwise waits for an administrator forever (:mod:`dagster_gpu.slurm.status`).

Multi-cluster: when ``sbatch --parsable`` names a cluster (``123;gpu2``: ``--clusters=gpu2`` in
``extra_sbatch_args``, or a federation), the handle keeps it (``cluster``) and every later squeue, sacct
and scancel of the task carries ``-M gpu2``.

GRES: ``--gres=gpu:<count>``; a step tagged ``dagster-gpu/shared-ok: true`` gets ``--gres=shard:N`` and a
device fraction of N ÷ shards_per_gpu; a step with ``gpu-count: 0`` requests no GRES.

The step worker's metadata (``slurm/job_id``, ``slurm/array_job_id``, ``slurm/array_task_id``) comes from
Slurm's environment in the worker; after the task ends, sacct figures are reported per partition as an
AssetObservation with ``billing/source: sacct`` (:mod:`dagster_gpu.executor.backends.slurm_accounting`) by whichever process
polls next, and by each orchestrating process before it exits (``reconcile_wait_seconds``).

Shared hosts (``docs/security.md``): the spool refuses a directory another user owns or can write
(:class:`~dagster_gpu.slurm.trust.UntrustedPathError`, naming path, owner, group and mode) unless
``spool_shared_group`` says it is shared on purpose; array tasks verify their manifest before running
anything and a refused task fails its step with the reason from its log.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

import dagster as dg

from dagster_gpu.executor.backends.base import Backend, Handle, StepLaunch, WorkerState, WorkerStatus
from dagster_gpu.executor.backends.local import log_tail
from dagster_gpu.executor.backends.slurm_accounting import report_sacct_bills
from dagster_gpu.executor.settings import config_field as settings_config_field
from dagster_gpu.executor.settings import from_section, setting
from dagster_gpu.policy.snapshot import DeviceGroup, SlurmState
from dagster_gpu.slurm.client import SlurmClient, SlurmError
from dagster_gpu.slurm.coalescer import ArrayCoalescer, TaskRequest, default_python
from dagster_gpu.slurm.parse import SlurmParseError
from dagster_gpu.slurm.poller import SharedPoller
from dagster_gpu.slurm.script import write_job_script
from dagster_gpu.slurm.spool import Spool
from dagster_gpu.slurm.status import WaitLimits, queue_wait_class, records_for, task_state
from dagster_gpu.slurm.window import WindowRule
from dagster_gpu.worker.context import ENV_VAR as STEP_CONTEXT_ENV

log = logging.getLogger(__name__)


SPOOL_ENV = "DAGSTER_GPU_SLURM_SPOOL"


def default_spool_dir() -> str:
    """The spool when ``spool_dir`` is not configured, never a predictable name under /tmp:

    ``$DAGSTER_GPU_SLURM_SPOOL``, else ``$DAGSTER_HOME/dagster_gpu/slurm-spool``, else
    ``$XDG_RUNTIME_DIR/dagster-gpu/slurm-spool`` (this host only: right for a single-host cluster),
    else a new directory made exclusively by ``tempfile.mkdtemp`` (mode 0700). That last one is logged
    (WARNING) and exported as ``$DAGSTER_GPU_SLURM_SPOOL`` so this process and its children share it;
    a deployment sets ``spool_dir`` or ``DAGSTER_HOME`` instead."""
    import tempfile

    if os.environ.get(SPOOL_ENV):
        return os.environ[SPOOL_ENV]
    if os.environ.get("DAGSTER_HOME"):
        return str(Path(os.environ["DAGSTER_HOME"]) / "dagster_gpu" / "slurm-spool")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg) and os.path.isdir(xdg):
        return str(Path(xdg) / "dagster-gpu" / "slurm-spool")
    path = tempfile.mkdtemp(prefix="dagster-gpu-slurm-spool-")
    os.environ[SPOOL_ENV] = path
    log.warning(
        "no spool_dir, DAGSTER_HOME or XDG_RUNTIME_DIR: the Slurm spool is the new directory %s "
        "(exported as %s for this process's children); set slurm.spool_dir to share one across run workers",
        path, SPOOL_ENV,
    )  # fmt: skip
    return path


@dataclass(frozen=True)
class SlurmSettings:
    """The ``slurm:`` section, typed: the one place its defaults are written (:func:`config_field` generates
    the Dagster schema from it). Seconds for all durations."""

    slurm_conf: str | None = setting(None, "slurm.conf path (default $SLURM_CONF).")
    spool_dir: str | None = setting(None, "Spool shared by run workers (and compute nodes); owned by this user, not "
                                          "writable by group/others (default: $DAGSTER_GPU_SLURM_SPOOL, else under "
                                          "$DAGSTER_HOME or $XDG_RUNTIME_DIR, else a new private directory).")
    spool_shared_group: str | None = setting(None, "Unix group that shares the spool on purpose (dirs 2770; manifests, "
                                                   "logs and the job script are still verified). Default: a private spool.")
    account: str | None = setting(None, "sbatch --account.")
    slurm_partition: str | None = setting(None, "sbatch --partition (a slurm partition).")
    qos: str | None = setting(None, "sbatch --qos.")
    time_limit: str | None = setting(None, "sbatch --time, e.g. 01:00:00.")
    throttle: int | None = setting(None, "%T of each job array (default: GPUs in the slurm partition).")
    coalesce_window_seconds: float = setting(2.0, "Quiet gap (s) that ends a coalescing window.")
    coalesce_max_window_seconds: float = setting(15.0, "Longest wait (s) of a launch for others.")
    coalesce_backlog_tasks: int | None = setting(None, "Hold launches while our earlier arrays have this many pending "
                                                       "tasks (default: the array throttle; 0: never).")
    coalesce_hold_max_seconds: float = setting(120.0, "Longest hold (s) of a launch; below submit_timeout_seconds.")
    coalesce_target_tasks: int = setting(10, "While a backfill is starting more runs, hold launches until this many "
                                             "wait (0: never).")
    max_tasks_per_array: int | None = setting(None, "Tasks per sbatch cap (MaxArraySize also applies).")
    poll_interval_seconds: float = setting(2.0, "Seconds between squeue+sacct polls.")
    shards_per_gpu: int = setting(4, "shard GRES per GPU (gres.conf).")
    shards_per_shared_task: int = setting(1, "--gres=shard:N for shared-ok steps.")
    extra_sbatch_args: tuple[str, ...] = setting((), "More sbatch argv items.")
    env_files: tuple[str, ...] = setting((), "KEY=VALUE secret files (0600) loaded by each task (~ expanded).")
    python: str | None = setting(None, "Interpreter on compute nodes (default: this one).")
    submit_timeout_seconds: float = setting(180.0, "Longest wait (s) of a launch for its sbatch.")
    vanish_grace_seconds: float = setting(60.0, "Seconds a task may be unknown to squeue and sacct after submission.")
    reconcile_wait_seconds: float = setting(20.0, "Wait at exit for sacct billing.")
    gpu_product: str = setting("NVIDIA A100-SXM4-80GB", "Product of the slurm partition's GPUs (rate card device "
                                                        "type; untyped GRES do not say).")
    gpu_memory_gib: float = setting(80.0, "Memory of one of those GPUs (GiB).")
    #: seconds per wait class; missing keys keep the defaults of :class:`dagster_gpu.slurm.status.WaitLimits`
    wait_limits_seconds: Mapping[str, float] = setting(
        default_factory=dict, show_default=False,
        description="Longest wait (s) of a task in each non-terminal state before its step fails and the task is "
                    "cancelled (0 = no limit).",
        schema={
            k: dg.Field(float, is_required=False, description=d)
            for k, d in (
                ("held", "REQUEUE_HOLD, SPECIAL_EXIT, or PENDING held (JobHeldAdmin/JobHeldUser): default 1800."),
                ("preempted", "PREEMPTED and not requeued: default 300."),
                ("suspended", "SUSPENDED or STOPPED: default 3600."),
                ("pending", "PENDING/CONFIGURING/REQUEUED for any other reason: default 86400."),
                ("completing", "COMPLETING/SIGNALING/STAGE_OUT after the batch script ended: default 1800."),
            )
        },
    )

    def __post_init__(self):
        object.__setattr__(self, "extra_sbatch_args", tuple(self.extra_sbatch_args))
        object.__setattr__(self, "env_files", tuple(os.path.expanduser(x) for x in self.env_files))

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> "SlurmSettings":
        """Settings from the ``slurm:`` section (absent keys take the defaults above)."""
        return from_section(cls, section)

    @property
    def wait_limits(self):
        """:class:`~dagster_gpu.slurm.status.WaitLimits` from ``wait_limits_seconds``. Raises ValueError."""
        return WaitLimits.from_mapping(self.wait_limits_seconds)


class SlurmBackend(Backend):
    """Steps as job array tasks (see module doc). One instance per orchestrating process."""

    name = "slurm"
    workers_survive_orchestrator = True
    coalesces_launches = True

    def __init__(self, settings: SlurmSettings, client: SlurmClient | None = None):
        self.settings = settings
        self.client = client or SlurmClient(slurm_conf=settings.slurm_conf)
        self.spool = Spool(settings.spool_dir or default_spool_dir(), shared_group=settings.spool_shared_group)
        self._cfg_lock = threading.Lock()
        self._max_array_size: tuple[float, int] | None = None
        self._gpus: tuple[float, int] | None = None
        self.coalescer = ArrayCoalescer(
            self.spool,
            self.client,
            python=settings.python or default_python(),
            rule=WindowRule(
                window_s=settings.coalesce_window_seconds,
                max_window_s=settings.coalesce_max_window_seconds,
                hard_cap_s=max(settings.coalesce_max_window_seconds, settings.coalesce_hold_max_seconds),
                backlog_tasks=settings.coalesce_backlog_tasks,
                target_tasks=settings.coalesce_target_tasks,
            ),
            max_wait_s=settings.submit_timeout_seconds,
            max_tasks_per_array=settings.max_tasks_per_array,
            max_array_size=self.max_array_size,
            env_files=settings.env_files,
            pending_tasks=self.pending_tasks,
        )
        self.poller = SharedPoller(self.spool, self.client, settings.poll_interval_seconds)
        self.wait_limits = settings.wait_limits  # validated now: a bad key fails at executor start
        self._launched: set[int] = set()
        self._waiting_since: dict[tuple[int, int], tuple[str, float]] = {}  # task -> (wait class, first seen)
        self._atexit = False

    # ------------------------------------------------------------------------------ cluster facts
    def max_array_size(self) -> int:
        """The controller's MaxArraySize, cached 5 minutes."""
        with self._cfg_lock:
            if self._max_array_size is None or time.time() - self._max_array_size[0] > 300:
                self._max_array_size = (time.time(), self.client.max_array_size())
            return self._max_array_size[1]

    def gpus_in_partition(self) -> int:
        """GPUs (gpu GRES) in the configured slurm partition, cached 5 minutes."""
        with self._cfg_lock:
            if self._gpus is None or time.time() - self._gpus[0] > 300:
                self._gpus = (time.time(), self.client.gpus_in_partition(self.settings.slurm_partition))
            return self._gpus[1]

    def pending_tasks(self) -> dict[int, int] | None:
        """Pending tasks per array job id of the spool's active job arrays, from the shared poll (at
        most one squeue + sacct per poll interval across processes); None when Slurm did not answer."""
        try:
            snap = self.poller.poll(set())
        except (SlurmError, TimeoutError):
            return None
        if not snap.ok:
            return None
        counts: dict[int, int] = {}
        for r in snap.queue:
            if r.state.name == "PENDING":
                n = sum(hi - lo + 1 for lo, hi in r.array_task_ids) or 1
                counts[r.array_job_id] = counts.get(r.array_job_id, 0) + n
        return counts

    # ------------------------------------------------------------------------------ sbatch options
    def gres_option(self, launch: StepLaunch) -> tuple[str | None, float | None]:
        """(``--gres=…`` or None, device fraction for a shared GPU or None)."""
        req = launch.request
        if req.count <= 0:
            return None, None
        if req.shared_ok:
            n = self.settings.shards_per_shared_task
            return f"--gres=shard:{n}", n / max(1, self.settings.shards_per_gpu)
        return f"--gres=gpu:{req.count}", None

    def sbatch_options(self, launch: StepLaunch) -> list[str]:
        """Options shared by the array (no --array/--job-name/--output: the coalescer adds those)."""
        gres, _ = self.gres_option(launch)
        return self._options(gres)

    def sbatch_options_for(self, gpus: int) -> list[str]:
        """The options of a step asking ``gpus`` whole GPUs (for ``--test-only`` estimates)."""
        return self._options(f"--gres=gpu:{gpus}" if gpus > 0 else None)

    def _options(self, gres: str | None) -> list[str]:
        s = self.settings
        opts = []
        for flag, value in (("--account", s.account), ("--partition", s.slurm_partition), ("--qos", s.qos), ("--time", s.time_limit)):
            if value:
                opts.append(f"{flag}={value}")
        if gres:
            opts.append(gres)
        return opts + list(s.extra_sbatch_args)

    def throttle_for(self, launch: StepLaunch) -> int:
        """The array's ``%T``: the configured throttle, else GPUs in the slurm partition per task's GPUs
        (shared tasks: shards in those GPUs per task's shards)."""
        if self.settings.throttle is not None:
            return max(0, int(self.settings.throttle))
        gpus = self.gpus_in_partition()
        req = launch.request
        if req.count <= 0 or gpus <= 0:
            return 0
        if req.shared_ok:
            return max(1, gpus * self.settings.shards_per_gpu // max(1, self.settings.shards_per_shared_task))
        return max(1, gpus // req.count)

    # ------------------------------------------------------------------------------ Backend
    def launch(self, launch: StepLaunch) -> Handle:
        _, fraction = self.gres_option(launch)
        env = dict(launch.env)
        if fraction is not None and STEP_CONTEXT_ENV in env:
            ctx = json.loads(env[STEP_CONTEXT_ENV])
            ctx["device_fraction"] = fraction
            env[STEP_CONTEXT_ENV] = json.dumps(ctx, sort_keys=True)
        req = TaskRequest(
            options=tuple(self.sbatch_options(launch)),
            throttle=self.throttle_for(launch),
            argv=tuple(launch.argv),
            env=env,
            run_id=launch.run_id,
            step_key=launch.step_key,
            partition_key=launch.partition_key,
            attempt=launch.attempt,
            launches_to_come=launch.launches_to_come,
        )
        a = self.coalescer.submit(req)
        self._launched.add(a.array_job_id)
        self._register_atexit()
        return {
            "job_id": f"{a.array_job_id}_{a.array_task_id}",
            "cluster": a.cluster,
            "array_job_id": a.array_job_id,
            "array_task_id": a.array_task_id,
            "batch": a.batch,
            "submitted_at": a.submitted_at,
            "tasks_in_array": a.tasks_in_array,
            "log_file": a.log_file,
            "spool": str(self.spool.root),
        }

    def state(self, handle: Handle) -> WorkerState:
        aid, tid = int(handle["array_job_id"]), int(handle["array_task_id"])
        submitted = float(handle["submitted_at"])
        if aid not in self._launched:  # launched by an earlier process (a resumed run re-attached): bill it from here
            self._launched.add(aid)
            self._register_atexit()
        try:
            snap = self.poller.poll({aid}, not_before=submitted, clusters={aid: handle.get("cluster")})
        except (SlurmError, TimeoutError) as e:
            return WorkerState(WorkerStatus.UNKNOWN, message=f"could not poll Slurm: {e}")
        if not snap.ok:
            return WorkerState(WorkerStatus.UNKNOWN, message=f"could not poll Slurm: {snap.error}")
        recs = records_for(aid, tid, snap.queue, snap.acct)
        key = (aid, tid)
        wait = queue_wait_class(recs)
        if wait is None:
            self._waiting_since.pop(key, None)
        elif self._waiting_since.get(key, ("", 0.0))[0] != wait:
            self._waiting_since[key] = (wait, time.time())
        waited = time.time() - self._waiting_since[key][1] if wait else 0.0
        st = task_state(
            recs,
            job_label=f"{aid}_{tid}",
            submitted_age_s=max(0.0, snap.started_at - submitted),
            waited_s=waited,
            wait_limits=self.wait_limits,
            vanish_grace_s=self.settings.vanish_grace_seconds,
        )
        if wait and st.status == WorkerStatus.FAILED and 0 < self.wait_limits.limit(wait) <= waited:
            # over its wait limit: cancel it, so a held task released later does not run a failed step again
            try:
                self.terminate(handle)
            except SlurmError as e:
                log.warning("could not cancel Slurm array task %s_%s after its wait limit: %s", aid, tid, e)
            self._waiting_since.pop(key, None)
        if st.status in (WorkerStatus.SUCCEEDED, WorkerStatus.FAILED):
            self._report_bills(snap)
        if st.status == WorkerStatus.FAILED and handle.get("log_file"):
            # the task's own words: e.g. why it refused its manifest (exit 3) before running anything
            st = WorkerState(st.status, st.exit_code, f"{st.message}; last lines of {handle['log_file']}:\n{log_tail(Path(str(handle['log_file'])))}")
        return st

    def terminate(self, handle: Handle) -> None:
        """``scancel [-M <cluster>] <array_job_id>_<array_task_id>``: exactly this task, pending or running."""
        self.client.scancel([f"{int(handle['array_job_id'])}_{int(handle['array_task_id'])}"], cluster=handle.get("cluster"))

    def policy_state(self):
        """The slurm partition as a ``SlurmState``: its GPUs (``sinfo``), those held and the tasks pending
        (one ``squeue``), our array throttle, and, when the free GPUs do not outnumber the pending tasks,
        the controller's start estimate for one more task (``sbatch --test-only``; nothing is submitted). Raises SlurmError when the
        controller does not answer."""
        s = self.settings
        total = self.gpus_in_partition()
        busy, pending = self.client.gpu_queue(s.slurm_partition)
        free = max(0, total - busy)
        pool = DeviceGroup(
            device=s.gpu_product, product=s.gpu_product, memory_gib=s.gpu_memory_gib,
            free=free, total=total, pending=pending,
            start_estimate_s=None if free > pending else self.start_estimate_s(),
        )  # fmt: skip
        return SlurmState(
            pools=(pool,), slurm_partition=s.slurm_partition or "", array_throttle=s.throttle,
            running_tasks=min(busy, total),
        )

    def start_estimate_s(self, gpus: int = 1) -> float | None:
        """Seconds until the controller expects to start a task like ours (``sbatch --test-only`` with
        this backend's account, slurm partition, QOS, time limit and ``--gres=gpu:<gpus>``), or None when
        it cannot say: a rejected test, or a start more than a day ahead (Slurm 22.05 prints year 6109
        when the running jobs have no time limit). Assumes the controller's clock and time zone are
        this host's (its estimate is printed in local time)."""

        try:
            est = self.client.test_only(self.sbatch_options_for(gpus), write_job_script(self.spool.job_script.parent, self.spool.job_script.name))
        except (SlurmError, SlurmParseError) as e:
            log.info("no Slurm start estimate: %s", e)
            return None
        if est.start is None:
            return None
        wait = (est.start - datetime.now()).total_seconds()
        return max(0.0, wait) if wait < 86400 else None

    def handle_metadata(self, handle: Handle) -> Mapping[str, str | int | float]:
        return {
            "slurm/job_id": str(handle["job_id"]),
            "slurm/array_job_id": int(handle["array_job_id"]),
            "slurm/array_task_id": int(handle["array_task_id"]),
            "slurm/state": "PENDING",
            "slurm/tasks_in_array": int(handle["tasks_in_array"]),
            "slurm/log_file": dg.MetadataValue.path(str(handle["log_file"])),
            **({"slurm/cluster": str(handle["cluster"])} if handle.get("cluster") else {}),
        }

    # ------------------------------------------------------------------------------ billing
    def _report_bills(self, snap) -> None:
        try:
            report_sacct_bills(self.spool, snap.acct, self.settings.shards_per_gpu)
        except Exception:  # noqa: BLE001 - billing never breaks a run
            log.exception("writing sacct bills failed")

    def report_bills_now(self, wait_s: float | None = None) -> int:
        """Poll until every job array this process launched is done (at most ``wait_s``, default
        ``reconcile_wait_seconds``), then report sacct observations. Returns observations written."""
        deadline = time.monotonic() + (self.settings.reconcile_wait_seconds if wait_s is None else wait_s)
        written = 0
        while True:
            try:
                snap = self.poller.poll(set(self._launched))
            except (SlurmError, TimeoutError):
                return written
            if snap.ok:
                written += report_sacct_bills(self.spool, snap.acct, self.settings.shards_per_gpu)
            pending = [b for b, sub in self.spool.active_batches() if int(sub["array_job_id"]) in self._launched]
            if not pending or time.monotonic() > deadline:
                return written
            time.sleep(max(0.2, self.settings.poll_interval_seconds))

    def _register_atexit(self) -> None:
        if not self._atexit and self.settings.reconcile_wait_seconds > 0:
            self._atexit = True
            atexit.register(self._report_bills_at_exit)

    def _report_bills_at_exit(self) -> None:
        try:
            self.report_bills_now()
        except Exception:  # noqa: BLE001
            log.exception("writing sacct bills at exit failed")


def config_field() -> dg.Field:
    """The ``slurm:`` section of gpu_executor's config, generated from :class:`SlurmSettings`."""
    return settings_config_field(SlurmSettings, "Slurm backend settings (dagster_gpu.executor.backends.slurm).")


def build_backend(section: Mapping[str, Any], config: Mapping[str, Any] | None = None) -> SlurmBackend:
    """The registry hook: a SlurmBackend from the ``slurm:`` section."""
    return SlurmBackend(SlurmSettings.from_section(section))
