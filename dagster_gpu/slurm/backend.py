"""The ``slurm`` backend: each step is one task of a job array on a Slurm cluster. Its settings, with their
descriptions and defaults, are :class:`dagster_gpu.slurm.settings.SlurmSettings` (the ``slurm:`` section).

Waits: a task that stays longer than its limit (``wait_limits_seconds``) in a non-terminal state (measured
from when this process first saw it there) fails its step with a message naming the state, its reason and
the limit, and is cancelled (``scancel``) so it never runs later: a held task (``scontrol requeuehold``,
SPECIAL_EXIT) otherwise waits for an administrator forever (:mod:`dagster_gpu.slurm.status`).

Multi-cluster: when ``sbatch --parsable`` names a cluster (``123;gpu2``: ``--clusters=gpu2`` in
``extra_sbatch_args``, or a federation), the handle keeps it (``cluster``) and every later squeue, sacct
and scancel of the task carries ``-M gpu2``.

GRES: ``--gres=gpu:<count>``; a step tagged ``dagster-gpu/shared-ok: true`` gets ``--gres=shard:N`` and a
device fraction of N ÷ shards_per_gpu; a step with ``gpu-count: 0`` requests no GRES. With ``gpu_types``, a
typed step (``gpu-product``, ``gpu-memory-gib``) gets the entry it fits (:func:`dagster_gpu.slurm.gpu_types.select_gpu_type`):
``--gres=gpu:<type>:<count>`` and/or ``--constraint=<feature>``, priced as that entry's product; a MIG type
(``mig-ok`` only) as its fraction of the parent GPU. A typed step no entry fits fails at launch (GpuTypeError
naming the entries).

Bills: without ``gres/gpu`` in AccountingStorageTRES (read once from ``scontrol show config``) sacct's
AllocTRES has no GPUs, so a task is billed its requested GPU equivalents × ElapsedRaw (``billing/source:
sacct-requested``); on Slurm >= 23.02 the steps' ``gres/gpuutil``/``gres/gpumem`` usage goes on the bill.

The step worker's metadata (``slurm/job_id``, ``slurm/array_job_id``, ``slurm/array_task_id``) comes from
Slurm's environment in the worker. ``state`` only reads (one shared squeue + sacct poll). After the task
ends, :meth:`SlurmBackend.accounting` is its sacct bill (every attempt; None until sacct has the final
record and squeue no longer runs it) and :meth:`SlurmBackend.elect_bill_writer` its spool marker, so exactly one
process writes it (:mod:`dagster_gpu.slurm.accounting`); the settler
(:mod:`dagster_gpu.executor.settle`) calls them, waits up to ``settle_wait_seconds`` at the orchestrating
process's exit, and settles other processes' finished tasks from the spool (:meth:`SlurmBackend.unsettled`).

Shared hosts (``docs/security.md``): the spool refuses a directory another user owns or can write
(:class:`~dagster_gpu.slurm.trust.UntrustedPathError`, naming path, owner, group and mode) unless
``spool_shared_group`` says it is shared on purpose; array tasks verify their manifest before running
anything and a refused task fails its step with the reason from its log.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

import dagster as dg

from dagster_gpu.contracts import (
    TERMINAL,
    Backend,
    Handle,
    StepLaunch,
    UnitBill,
    WorkerState,
    WorkerStatus,
    describe_partitions,
    with_step_context,
)
from dagster_gpu.core.log_tail import log_tail
from dagster_gpu.policy.preemption import pool_key
from dagster_gpu.policy.snapshot import DeviceGroup, SlurmState
from dagster_gpu.relay.channel import read_from as read_local_channel
from dagster_gpu.relay.objects import object_log_tail, put_new_object, read_object_channel
from dagster_gpu.relay.parts import is_object_channel
from dagster_gpu.settings.schema import config_field as settings_config_field
from dagster_gpu.slurm.accounting import elect_task_bill_writer, step_gpu_usage, task_bill, task_env, unsettled_tasks
from dagster_gpu.slurm.client import SlurmClient, SlurmError
from dagster_gpu.slurm.coalescer import ArrayCoalescer, ObjectStore, TaskRequest, default_python
from dagster_gpu.slurm.gpu_types import GpuType, sbatch_gres, select_gpu_type
from dagster_gpu.slurm.gres import gpu_capacity, pending_for_type
from dagster_gpu.slurm.handle import SlurmHandle
from dagster_gpu.slurm.object_runner import job_script as object_job_script
from dagster_gpu.slurm.object_runner import log_prefix as object_log_prefix
from dagster_gpu.slurm.parse import SlurmParseError
from dagster_gpu.slurm.poller import SharedPoller
from dagster_gpu.slurm.requeue import MODULE as REQUEUE_MODULE
from dagster_gpu.slurm.rest import client_from_settings as rest_client_from_settings
from dagster_gpu.slurm.self_requeue import ENV_VAR as REQUEUE_ON_WARNING
from dagster_gpu.slurm.settings import SlurmSettings
from dagster_gpu.slurm.spool import Spool
from dagster_gpu.slurm.ssh import transport_from_settings
from dagster_gpu.slurm.status import records_for, sacct_caught_up, task_state, task_wait_class
from dagster_gpu.slurm.transport import TransportError
from dagster_gpu.slurm.trust import UntrustedPathError
from dagster_gpu.slurm.window import WindowRule

log = logging.getLogger(__name__)


SPOOL_ENV = "DAGSTER_GPU_SLURM_SPOOL"


def default_spool_dir() -> str:
    """The spool when ``spool_dir`` is not configured, never a predictable name under /tmp:

    ``$DAGSTER_GPU_SLURM_SPOOL``, else ``$DAGSTER_HOME/dagster_gpu/slurm-spool``, else
    ``$XDG_RUNTIME_DIR/dagster-gpu/slurm-spool`` (this host only: right for a single-host cluster),
    else a new directory made exclusively by ``tempfile.mkdtemp`` (mode 0700). That last one is logged
    (WARNING) and exported as ``$DAGSTER_GPU_SLURM_SPOOL`` so this process and its children share it;
    a deployment sets ``spool_dir`` or ``DAGSTER_HOME`` instead."""
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


class SlurmBackend(Backend):
    """Steps as job array tasks (see module doc). One instance per orchestrating process."""

    name = "slurm"
    workers_survive_orchestrator = True
    coalesces_launches = True

    def __init__(self, settings: SlurmSettings, client: SlurmClient | None = None):
        self.settings = settings
        if client is None and (settings.transport or "").lower() == "rest":
            client = rest_client_from_settings(settings)
        if client is None:
            transport = transport_from_settings(settings)
            client = SlurmClient(slurm_conf=settings.slurm_conf, bin_dir=settings.slurm_bin_dir,
                                 **({"transport": transport} if transport else {}))
        self.client = client
        self.spool = Spool(settings.spool_dir or default_spool_dir(), shared_group=settings.spool_shared_group)
        self._cfg_lock = threading.Lock()
        self._max_array_size: tuple[float, int] | None = None
        self._gpus: tuple[float, int] | None = None
        self._typed: dict[str, tuple[float, int]] = {}  # GRES type -> (asked at, usable GPUs of it)
        self._step_usage: dict[int, tuple[float, list]] = {}  # array job id -> (asked at, its steps' usage)
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
            # a submitter may hold the spool lock while it waits for a renewed token: a launch past its own
            # timeout waits that long for the lock before it withdraws (its launch may be the one being submitted)
            lock_wait_s=30.0 + float(self.client.token_wait_s),
            max_tasks_per_array=settings.max_tasks_per_array,
            max_array_size=self.max_array_size,
            env_files=settings.env_files,
            pending_tasks=self.pending_tasks,
            object_store=self._object_store() if self.nothing_shared else None,
        )
        self.poller = SharedPoller(self.spool, self.client, settings.poll_interval_seconds)
        self.wait_limits = settings.wait_limits  # validated now: a bad key fails at executor start
        self._waiting_since: dict[tuple[int, int], tuple[str, float]] = {}  # task -> (wait class, first seen)
        self.settle_wait_s = settings.settle_wait_seconds
        needs = self.shared_paths_needed()
        if needs:
            log.warning("slurm transport rest without slurm.relay_url: the compute nodes must see %s at %s, the same "
                        "path as this host (a shared file system); with events: relay and relay_url nothing is shared",
                        " and ".join(needs), self.spool.root)

    @property
    def nothing_shared(self) -> bool:
        """Whether the compute nodes need no file system shared with this host: ``transport: rest`` with
        ``relay_url`` (the manifest, the task runner and the tasks' logs travel through slurmrestd and the object
        store: :mod:`dagster_gpu.slurm.object_runner`)."""
        return (self.settings.transport or "").lower() == "rest" and bool(self.settings.relay_url)

    def _object_store(self) -> ObjectStore:
        """The coalescer's :class:`~dagster_gpu.slurm.coalescer.ObjectStore` for ``relay_url``."""
        options = dict(self.settings.relay_storage_options)
        return ObjectStore(url=self.settings.relay_url.rstrip("/"), storage_options=options,
                           put_new=functools.partial(put_new_object, storage_options=options),
                           job_script=object_job_script, log_prefix=object_log_prefix)

    def shared_paths_needed(self) -> list[str]:
        """What the compute nodes must see of this host's file system with these settings, by setting name, for
        the launch's warning: empty when nothing is shared (:attr:`nothing_shared`) or the spool is on the
        cluster (``transport: ssh``)."""
        if self.nothing_shared or self.client.transport.remote_spool:
            return []
        if (self.settings.transport or "").lower() != "rest":
            return []  # local transport: Dagster is on a login node, the spool is the cluster's file system
        what = ["slurm.spool_dir (the manifests, the task runner and the tasks' logs)"]
        if self.settings.events == "relay":
            what.append("the events relay's channel files in slurm.spool_dir (set slurm.relay_url)")
        return what

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

    def typed_gpus(self, gres_type: str) -> int:
        """GPUs of one GRES type on the slurm partition's usable nodes, cached 5 minutes."""
        with self._cfg_lock:
            hit = self._typed.get(gres_type)
            if hit is None or time.time() - hit[0] > 300:
                hit = (time.time(), self.client.gpu_capacity(self.settings.slurm_partition, gres_type).usable)
                self._typed[gres_type] = hit
            return hit[1]

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
    def gpu_type(self, launch: StepLaunch) -> GpuType | None:
        """The ``gpu_types`` entry a step's typed request fits (None: untyped request, or no types configured).
        Raises GpuTypeError when it is typed and nothing fits."""
        req = launch.request
        if req.count <= 0 or req.shared_ok:
            return None
        return select_gpu_type(self.settings.gpu_types, req.product, req.memory_gib, req.mig_ok)

    def gres_options(self, launch: StepLaunch) -> tuple[list[str], float | None]:
        """(``--gres=…`` [and ``--constraint=…``], device fraction for a shard or MIG slice, else None)."""
        req = launch.request
        if req.count <= 0:
            return [], None
        if req.shared_ok:
            n = self.settings.shards_per_shared_task
            return [f"--gres=shard:{n}"], n / max(1, self.settings.shards_per_gpu)
        t = self.gpu_type(launch)
        return sbatch_gres(t, req.count), (t.fraction if t is not None and t.mig_profile else None)

    def sbatch_options(self, launch: StepLaunch) -> list[str]:
        """Options shared by the array (no --array/--job-name/--output: the coalescer adds those)."""
        opts, _ = self.gres_options(launch)
        return self._options(*opts)

    def sbatch_options_for(self, gpus: int) -> list[str]:
        """The options of a step asking ``gpus`` whole GPUs (for ``--test-only`` estimates)."""
        return self._options(*([f"--gres=gpu:{gpus}"] if gpus > 0 else []))

    def _options(self, *gres: str) -> list[str]:
        s = self.settings
        opts = []
        for flag, value in (("--account", s.account), ("--partition", s.slurm_partition), ("--qos", s.qos), ("--time", s.time_limit)):
            if value:
                opts.append(f"{flag}={value}")
        opts.append("--requeue" if s.requeue else "--no-requeue")
        if s.signal_lead_seconds:
            opts.append(f"--signal=B:USR1@{int(s.signal_lead_seconds)}")
        opts.extend(gres)
        return opts + list(s.extra_sbatch_args)

    def throttle_for(self, launch: StepLaunch) -> int:
        """The array's ``%T``: the configured throttle, else GPUs in the slurm partition per task's GPUs
        (shared tasks: shards in those GPUs per task's shards)."""
        if self.settings.throttle is not None:
            return max(0, int(self.settings.throttle))
        t = self.gpu_type(launch)
        gpus = self.gpus_in_partition() if t is None or not t.gres else self.typed_gpus(t.gres)
        req = launch.request
        if req.count <= 0 or gpus <= 0:
            return 0
        if req.shared_ok:
            return max(1, gpus * self.settings.shards_per_gpu // max(1, self.settings.shards_per_shared_task))
        return max(1, gpus // req.count)

    # ------------------------------------------------------------------------------ Backend
    def launch(self, launch: StepLaunch) -> Handle:
        # before any Slurm call: an expired slurmrestd token is waited for here, outside the spool lock
        self.client.await_credentials(f"the launch of step {launch.step_key!r} ({describe_partitions(launch.partition_keys)})")
        gres, fraction = self.gres_options(launch)
        t = self.gpu_type(launch)
        # what sbatch asks, for the bill: GPU equivalents (shards and MIG slices as fractions) and the
        # product to price them at (the requested type's, else the slurm partition's)
        asked = launch.request
        if asked.count <= 0:
            gpus = 0.0
        elif asked.shared_ok:  # shard:N of one GPU
            gpus = float(fraction or 0.0)
        else:  # whole GPUs, or MIG slices as their fraction of the parent
            gpus = float(asked.count * (fraction if fraction is not None else 1.0))
        slurm_request = {
            "gres": " ".join(gres),
            "gpus": gpus,
            "product": t.product if t is not None else self.settings.gpu_product,
            "fraction_per_gpu_gres": t.fraction if t is not None else 1.0,
        }
        env = with_step_context(launch.env, slurm_request=slurm_request,
                                **({"device_fraction": fraction} if fraction is not None else {}))
        if self.settings.requeue and self.settings.signal_lead_seconds:  # the worker requeues itself on the warning
            env[REQUEUE_ON_WARNING] = "1"
        req = TaskRequest(
            options=tuple(self.sbatch_options(launch)),
            throttle=self.throttle_for(launch),
            argv=tuple(launch.argv),
            env=env,
            run_id=launch.run_id,
            step_key=launch.step_key,
            partition_keys=tuple(launch.partition_keys),
            attempt=launch.attempt,
            launches_to_come=launch.launches_to_come,
            requeue_module=REQUEUE_MODULE,
        )
        a = self.coalescer.submit(req)
        return SlurmHandle(
            array_job_id=a.array_job_id, array_task_id=a.array_task_id, batch=a.batch, submitted_at=a.submitted_at,
            tasks_in_array=a.tasks_in_array, log_file=a.log_file, spool=str(self.spool.root), cluster=a.cluster,
        ).to_handle()

    def state(self, handle: Handle) -> WorkerState:
        """The task's state from the shared poll (:func:`dagster_gpu.slurm.status.task_state`). Only reads:
        a task over its wait limit is FAILED and ``abandoned`` (the settler cancels it); the message of a
        FAILED task ends with the last lines of its log."""
        h = SlurmHandle.from_handle(handle)
        aid, tid, submitted = h.array_job_id, h.array_task_id, h.submitted_at
        try:
            snap = self.poller.poll({aid}, not_before=submitted, clusters={aid: h.cluster})
        except (SlurmError, TimeoutError) as e:
            return WorkerState(WorkerStatus.UNKNOWN, message=f"could not poll Slurm: {e}")
        if not snap.ok:
            return WorkerState(WorkerStatus.UNKNOWN, message=f"could not poll Slurm: {snap.error}")
        recs = records_for(aid, tid, snap.queue, snap.acct, submitted)
        key = (aid, tid)
        wait = task_wait_class(recs)
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
        # over its wait limit: the settler cancels it, so a held task released later does not run a failed step
        # again (a runaway task is not the controller's any more: nothing to cancel)
        abandoned = wait not in (None, "runaway") and st.status == WorkerStatus.FAILED and 0 < self.wait_limits.limit(wait) <= waited
        if st.status == WorkerStatus.FAILED and h.log_file:
            # the task's own words: e.g. why it refused its manifest (exit 3) before running anything
            st = WorkerState(st.status, st.exit_code, f"{st.message}; last lines of {h.log_file}:\n{self._log_tail(h.log_file)}")
        return WorkerState(st.status, st.exit_code, st.message, abandoned=abandoned)

    def relay_channel(self, launch: StepLaunch) -> str | None:
        """With ``events: relay``: the task's channel, ``<spool the tasks see>/relay/<run id>/<digest>.jsonl``, or
        with ``relay_url`` the object channel ``<relay_url>/<run id>/<digest>`` (a prefix of parts); the digest
        over the step key, attempt and preemptions (no key or user text in a path). None with ``direct``."""
        if self.settings.events == "direct":
            return None
        digest = hashlib.sha256(f"{launch.step_key}\0{launch.attempt}\0{launch.preemptions}".encode()).hexdigest()[:20]
        run = launch.run_id if re.fullmatch(r"[A-Za-z0-9-]{1,64}", launch.run_id) else hashlib.sha256(launch.run_id.encode()).hexdigest()[:32]
        if self.settings.relay_url:
            return f"{self.settings.relay_url.rstrip('/')}/{run}/{digest}"
        root = self.client.transport.remote_spool or str(self.spool.root)
        return f"{root}/relay/{run}/{digest}.jsonl"

    def read_channel(self, path: str, offset: int) -> bytes:
        """Relay channel ``path`` from byte ``offset``: from the object store for a URL (``relay_url``), over the
        transport when the spool the tasks write is on the cluster (``transport: ssh``), else from this host's
        spool. b"" while the task has not written it."""
        if is_object_channel(path):
            return read_object_channel(path, offset, self.settings.relay_storage_options)
        transport = self.client.transport
        if transport.remote_spool:
            return transport.read_from(path, offset)
        return read_local_channel(path, offset)

    def relay_storage_options(self) -> Mapping[str, Any]:
        """``relay_storage_options`` when the channels are on an object store (``relay_url``), else {}."""
        return dict(self.settings.relay_storage_options) if self.settings.relay_url else {}

    def _task_log(self, batch: str, task: int) -> str:
        """Where array task ``task`` of ``batch`` writes its log (``sbatch --output``): under the spool the
        tasks see (the cluster's, with ``transport: ssh``), or the prefix it ships it to when nothing is shared."""
        if self.nothing_shared:
            return object_log_prefix(f"{self.settings.relay_url.rstrip('/')}/batches/{batch}", task)
        remote = self.client.transport.remote_spool
        return f"{remote}/batches/{batch}/{task}.out" if remote else str(self.spool.batch_dir(batch) / f"{task}.out")

    def _log_tail(self, path: str) -> str:
        """The last lines of an array task's log: on this host, over the transport when the spool the
        tasks write is on the cluster (``transport: ssh``), or from the object store when it ships its log there."""
        if is_object_channel(path):
            return object_log_tail(path, storage_options=self.settings.relay_storage_options)
        transport = self.client.transport
        if transport.remote_spool:
            return transport.tail(path)
        return log_tail(Path(path))

    def terminate(self, handle: Handle) -> None:
        """``scancel [-M <cluster>] <array_job_id>_<array_task_id>``: exactly this task, pending or running."""
        h = SlurmHandle.from_handle(handle)
        self.client.scancel([h.job_id], cluster=h.cluster)

    def policy_state(self) -> SlurmState:
        """The slurm partition as a ``SlurmState``: one ``sinfo`` for its GPUs on nodes that take jobs and
        those allocated (however the jobs asked: ``--gres``, ``--gpus``, multi-node), one ``squeue`` for the
        tasks pending, our array throttle, and, when a pool's free GPUs do not outnumber the pending tasks,
        the controller's start estimate for one more task (``sbatch --test-only``; nothing is submitted).
        With ``gpu_types``, one pool per entry that names a GRES type (its typed GPUs; a MIG type as
        ``mig-<profile>``), else one pool of ``gpu_product``. Raises SlurmError when the controller does not answer."""
        s = self.settings
        nodes = self.client.node_gres(s.slurm_partition)
        pending_gres = self.client.pending_gres(s.slurm_partition)
        all_gpus = gpu_capacity(nodes)
        typed = [t for t in s.gpu_types if t.gres]
        pools = []
        for t in typed or [None]:
            cap = gpu_capacity(nodes, t.gres) if t is not None else all_gpus
            # pending jobs that may take this pool's GPUs: asking its type, or no type
            pending = pending_for_type(pending_gres, t.gres if t is not None else None)
            opts = sbatch_gres(t, 1) if t is not None else ["--gres=gpu:1"]
            pools.append(DeviceGroup(
                device=t.device if t else s.gpu_product, product=t.product if t else s.gpu_product,
                memory_gib=(t.memory_gib if t and t.memory_gib is not None else s.gpu_memory_gib),
                free=cap.free, total=cap.usable, pending=pending, mig_profile=t.mig_profile if t else None,
                start_estimate_s=None if cap.free > pending else self.start_estimate_s(options=opts),
            ))  # fmt: skip
        return SlurmState(
            pools=tuple(pools), slurm_partition=s.slurm_partition or "", array_throttle=s.throttle,
            running_tasks=min(all_gpus.used, all_gpus.usable),
            preemptions_per_gpu_hour=float(s.preemptions_per_gpu_hour), preemption_pool=self.preemption_pool,
        )

    @property
    def preemption_pool(self) -> str:
        """``slurm:<slurm partition>/<qos>`` (:func:`~dagster_gpu.policy.preemption.pool_key`)."""
        return pool_key("slurm", slurm_partition=self.settings.slurm_partition, qos=self.settings.qos)

    def start_estimate_s(self, gpus: int = 1, options: list[str] | None = None) -> float | None:
        """Seconds until the controller expects to start a task like ours (``sbatch --test-only`` with
        this backend's account, slurm partition, QOS, time limit and ``--gres=gpu:<gpus>``), or None when
        it cannot say: a rejected test, or a start more than a day ahead (Slurm 22.05 prints year 6109
        when the running jobs have no time limit). Assumes the controller's clock and time zone are
        this host's (its estimate is printed in local time)."""

        try:
            opts = self._options(*options) if options is not None else self.sbatch_options_for(gpus)
            est = self.client.test_only(opts, self.coalescer.job_script_for_sbatch()[0])
        except (SlurmError, SlurmParseError, TransportError, UntrustedPathError) as e:
            log.info("no Slurm start estimate: %s", e)
            return None
        if est.start is None:
            return None
        wait = (est.start - datetime.now()).total_seconds()
        return max(0.0, wait) if wait < 86400 else None

    def handle_metadata(self, handle: Handle) -> Mapping[str, str | int | float]:
        h = SlurmHandle.from_handle(handle)
        return {
            "slurm/job_id": h.job_id,
            "slurm/array_job_id": h.array_job_id,
            "slurm/array_task_id": h.array_task_id,
            "slurm/state": "PENDING",
            "slurm/tasks_in_array": h.tasks_in_array,
            "slurm/log_file": dg.MetadataValue.path(h.log_file),
            **({"slurm/cluster": h.cluster} if h.cluster else {}),
        }

    # ------------------------------------------------------------------------------ accounting
    def accounting(self, handle: Handle) -> UnitBill | None:
        """The ended task's sacct bill (:func:`~dagster_gpu.slurm.accounting.task_bill`:
        every attempt, priced at the rate table of its step context), read from the shared poll. None
        while Slurm has not billed it: squeue still runs it, sacct has no final record yet or no record of
        the attempt squeue shows (slurmdbd lags or is down: :func:`~dagster_gpu.slurm.status.sacct_caught_up`),
        or Slurm could not be asked. ``UnitBill.nothing`` when its manifest is unreadable."""
        h = SlurmHandle.from_handle(handle)
        aid, tid, submitted = h.array_job_id, h.array_task_id, h.submitted_at
        try:
            snap = self.poller.poll({aid}, not_before=submitted, clusters={aid: h.cluster})
        except (SlurmError, TimeoutError):
            return None
        if not snap.ok:
            return None
        recs = records_for(aid, tid, snap.queue, snap.acct, submitted or None)
        if recs.queue is not None and recs.queue.state.status not in TERMINAL:
            return None
        if not recs.acct or not recs.acct[-1].state.final or not sacct_caught_up(recs.queue, recs.acct):
            return None
        env = task_env(self.spool, h.batch, tid)
        if env is None:
            return UnitBill.nothing(f"no manifest entry for Slurm array task {aid}_{tid} in the spool")
        try:
            tracked = self.client.gpu_tres_tracked()
            usage = step_gpu_usage(self._steps_of(aid, tid, h.cluster)) if self.client.gpu_usage_tracked() else {}
        except (SlurmError, SlurmParseError) as e:
            log.info("no Slurm accounting config or step usage for %s_%s yet: %s", aid, tid, e)
            return None
        return task_bill(env, recs.acct, self.settings.shards_per_gpu, gpu_tres_tracked=tracked, step_usage=usage)

    def _steps_of(self, aid: int, tid: int, cluster: str | None) -> list:
        """The steps of task ``aid``_``tid`` from one ``sacct`` per array job, re-asked at most once per poll
        interval while this task's steps are not in it."""
        with self._cfg_lock:
            cached = self._step_usage.get(aid)
            mine = lambda steps: [s for s in steps if s.id.job_id == aid and s.id.task_id == tid]  # noqa: E731
            if cached is None or (not mine(cached[1]) and time.time() - cached[0] > self.settings.poll_interval_seconds):
                cached = (time.time(), self.client.sacct_steps([aid], cluster=cluster))
                self._step_usage[aid] = cached
            return mine(cached[1])

    def elect_bill_writer(self, handle: Handle) -> bool:
        """The task's spool marker (O_EXCL): True for the one process that writes its bill."""
        h = SlurmHandle.from_handle(handle)
        return elect_task_bill_writer(self.spool, h.batch, h.array_task_id)

    def unsettled(self) -> list[Handle]:
        """Tasks of finished job arrays in the spool (any process's) whose bill nobody wrote, as handles;
        one shared poll covers them all, so their ``accounting`` reads it. Empty when Slurm cannot be asked.

        A job array counts as finished once a poll saw every task final (``done``); while any is not
        marked yet, the shared poll is refreshed first (at most once per ``poll_interval_seconds``): when
        every run worker exited before sacct had the final records (slurmdbd down), nobody else polls."""
        try:
            if self.spool.active_batches():
                self.poller.poll(set())  # covers every active job array; marks the final ones done
            tasks = unsettled_tasks(self.spool)
            if not tasks:
                return []
            clusters = {int(sub["array_job_id"]): sub.get("cluster") for _, sub, _ in tasks}
            snap = self.poller.poll(set(clusters), clusters=clusters)
        except (SlurmError, TimeoutError) as e:
            log.info("no sweep of finished Slurm tasks: %s", e)
            return []
        if not snap.ok:
            return []
        return [
            SlurmHandle(
                array_job_id=int(sub["array_job_id"]), array_task_id=i, batch=batch,
                submitted_at=float(sub.get("submitted_at", 0.0)), tasks_in_array=int(sub.get("tasks", 0)),
                log_file=self._task_log(batch, i), spool=str(self.spool.root),
                cluster=sub.get("cluster"),
            ).to_handle()
            for batch, sub, i in tasks
        ]


def config_field() -> dg.Field:
    """The ``slurm:`` section of gpu_executor's config, generated from :class:`SlurmSettings`."""
    return settings_config_field(SlurmSettings, "Slurm backend settings (dagster_gpu.slurm.settings).")


def configured(section: Mapping[str, Any] | None) -> bool:
    """The registry hook: the Slurm backend is configured when gpu_executor's config has a ``slurm:`` section."""
    return section is not None


def build_backend(section: Mapping[str, Any], config: Mapping[str, Any] | None = None,
                  default_log_dir: Path | None = None) -> SlurmBackend:
    """The registry hook: a SlurmBackend from the ``slurm:`` section (its logs go to the spool)."""
    return SlurmBackend(SlurmSettings.from_section(section))


__all__ = ["SlurmBackend", "SlurmSettings", "build_backend", "config_field", "configured", "default_spool_dir"]
