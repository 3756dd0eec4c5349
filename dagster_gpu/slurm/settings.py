"""The ``slurm:`` section of gpu_executor's config: :class:`SlurmSettings` (its core) with the ``ssh:``
(:class:`~dagster_gpu.slurm.ssh_settings.SlurmSshSettings`) and ``rest:``
(:class:`~dagster_gpu.slurm.rest_settings.SlurmRestSettings`) sections; the fields' descriptions are the
settings' documentation and the generated Dagster schema's. The flat keys those sections replace
(``ssh_host``, ``rest_url``, …: :func:`~dagster_gpu.settings.schema.moved_keys`) are still accepted, with
a DeprecationWarning naming the new key."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Mapping

import dagster as dg

from dagster_gpu.relay.parts import check_relay_settings
from dagster_gpu.settings.schema import apply_renamed, from_section, nest_sections, renamed, setting
from dagster_gpu.slurm.gpu_types import from_settings as gpu_types_from_settings
from dagster_gpu.slurm.rest_settings import SlurmRestSettings
from dagster_gpu.slurm.ssh_settings import SlurmSshSettings
from dagster_gpu.slurm.status import WaitLimits

__all__ = ["SlurmRestSettings", "SlurmSettings", "SlurmSshSettings"]


#: What each wait class of :class:`~dagster_gpu.slurm.status.WaitLimits` covers (the schema's descriptions;
#: the keys and defaults come from WaitLimits itself, so the schema cannot miss one).
_WAIT_LIMIT_DOCS = {
    "held": "REQUEUE_HOLD, SPECIAL_EXIT, or PENDING held (JobHeldAdmin/JobHeldUser)",
    "preempted": "PREEMPTED and not requeued",
    "suspended": "SUSPENDED or STOPPED",
    "pending": "PENDING/CONFIGURING/REQUEUED/EXPEDITING for any other reason",
    "completing": "COMPLETING/SIGNALING/STAGE_OUT after the batch script ended",
    "runaway": "gone from squeue, not final in sacct (sacctmgr show runawayjobs)",
}


@dataclass(frozen=True)
class SlurmSettings:
    """The ``slurm:`` section, typed: the one place its defaults are written (:func:`config_field` generates
    the Dagster schema from it). Seconds for all durations."""

    slurm_conf: str | None = setting(None, "slurm.conf path (default $SLURM_CONF).")
    slurm_bin_dir: str | None = setting(None, "Directory of sbatch, squeue, sacct, sinfo, scancel and scontrol where the "
                                              "transport runs them (on the login node with ssh), e.g. /opt/slurm/bin "
                                              "when a non-interactive login shell lacks them on PATH (default: PATH).")
    spool_dir: str | None = setting(None, "Spool shared by run workers (and compute nodes); owned by this user, not "
                                          "writable by group/others (default: $DAGSTER_GPU_SLURM_SPOOL, else under "
                                          "$DAGSTER_HOME or $XDG_RUNTIME_DIR, else a new private directory).")
    spool_shared_group: str | None = setting(None, "Unix group that shares the spool on purpose (dirs 2770; manifests, "
                                                   "logs and the job script are still verified). Default: a private spool.")
    account: str | None = setting(None, "sbatch --account.")
    slurm_partition: str | None = setting(None, "sbatch --partition (a slurm partition).")
    qos: str | None = setting(None, "sbatch --qos (e.g. a preemptible QOS of a cluster shared with online inference).")
    preemptions_per_gpu_hour: float = setting(
        0.0, "The cost policy's prior for how often this slurm partition and QOS preempt a task, per GPU-hour; "
             "blended with the preemptions the instance observed there (dagster_gpu/policy/preemption.py). "
             "0: not preemptible until preemptions are observed.")
    requeue: bool = setting(True, "sbatch --requeue (a preempted or failed-node task runs again, continuing after its "
                                  "checkpoint parts); False: --no-requeue (a preempting QOS then cancels the task).")
    signal_lead_seconds: int | None = setting(
        None, "sbatch --signal=B:USR1@<s>: SIGUSR1 to the task <s> seconds before its time limit (Slurm sends it up "
              "to 60 s early) and, where slurm.conf has PreemptParameters=send_user_signal (22.05: SlurmctldParameters="
              "preempt_send_user_signal), as soon as a preempting QOS chooses it: the worker commits its checkpoint "
              "part, asks scontrol requeue for itself (22.05 never requeues a job that ended by itself), and exits. Without it a "
              "preempted worker gets SIGTERM only when GraceTime ends (Slurm signals the job's steps, not the batch "
              "script, when GraceTime starts), then SIGKILL after KillWait.")
    time_limit: str | None = setting(None, "sbatch --time, e.g. 01:00:00.")
    throttle: int | None = setting(None, "%T of each job array (default: GPUs in the slurm partition).")
    coalesce_window_seconds: float = setting(2.0, "Quiet gap (s) that ends a coalescing window.")
    coalesce_max_window_seconds: float = setting(15.0, "Longest wait (s) of a launch for others.")
    coalesce_backlog_tasks: int | None = setting(None, "Hold launches while our earlier arrays have this many pending "
                                                       "tasks (default: the array throttle; 0: never).")
    coalesce_hold_max_seconds: float = setting(120.0, "Longest hold (s) of a launch; below submit_timeout_seconds.")
    coalesce_target_tasks: int = setting(10, "While a backfill is starting more runs, hold launches until they "
                                             "carry this many partitions (0: never).")
    max_tasks_per_array: int | None = setting(None, "Tasks per sbatch cap (MaxArraySize also applies).")
    poll_interval_seconds: float = setting(2.0, "Seconds between squeue+sacct polls.")
    shards_per_gpu: int = setting(4, "shard GRES per GPU (gres.conf).")
    shards_per_shared_task: int = setting(1, "--gres=shard:N for shared-ok steps.")
    extra_sbatch_args: tuple[str, ...] = setting((), "More sbatch argv items.")
    env_files: tuple[str, ...] = setting((), "KEY=VALUE secret files (0600) loaded by each task (~ expanded).")
    python: str | None = setting(None, "Interpreter on compute nodes (default: this one).")
    transport: str = setting("local", "Where Slurm commands run: 'local' (Dagster is on a login node), 'ssh' (on the "
                                      "login node of the ssh section, through OpenSSH, one shared ControlMaster; no "
                                      "passwords) or 'rest' (slurmrestd at rest.url with a JWT; with events: relay and "
                                      "relay_url the compute nodes share no file system with this host, else "
                                      "spool_dir must be on one they see).")
    ssh: SlurmSshSettings = setting(default_factory=SlurmSshSettings,
                                    description="transport ssh: the login node and the spool on the cluster.")
    rest: SlurmRestSettings = setting(default_factory=SlurmRestSettings,
                                      description="transport rest: slurmrestd and its token.")
    events: str = setting("direct", "How the array tasks' events reach the Dagster instance: 'direct' (each task "
                                    "writes to the instance's database, so compute nodes reach it) or 'relay' (each task "
                                    "appends them to a file in the spool, or uploads them under relay_url, that the run worker "
                                    "reads, over the transport with ssh, and stores: compute nodes need no database access "
                                    "and no database password).")
    relay_url: str | None = setting(None, "events relay: an fsspec URL (e.g. s3://bucket/dagster-gpu-relay) under "
                                          "which each task writes its channel as immutable parts, read by the run "
                                          "worker from the object store instead of the spool (for transport rest "
                                          "where this host sees no spool files). Credentials come from each side's "
                                          "provider chain, never from this config.")
    relay_storage_options: Mapping[str, Any] = setting(
        default_factory=dict, show_default=False,
        description="events relay with relay_url: fsspec storage options for it on both sides, e.g. "
                    "{client_kwargs: {endpoint_url: https://s3.example.org}}; no key, secret, token or password.")
    worker_python: str | None = setting(
        None, "The array task's step worker Python (a path the compute nodes see, e.g. a venv on the shared "
              "filesystem); default: the executor-wide worker_python if set, else the code location's interpreter.")
    submit_timeout_seconds: float = setting(180.0, "Longest wait (s) of a launch for its sbatch.")
    vanish_grace_seconds: float = setting(60.0, "Seconds a task may be unknown to squeue and sacct after submission.")
    settle_wait_seconds: float = setting(20.0, "Wait (s) at the orchestrating process's exit for its tasks' sacct bills.")
    reconcile_wait_seconds: float | None = renamed("settle_wait_seconds")
    gpu_product: str = setting("NVIDIA A100-SXM4-80GB", "Product of the slurm partition's GPUs (rate card device "
                                                        "type; untyped GRES do not say).")
    gpu_memory_gib: float = setting(80.0, "Memory of one of those GPUs (GiB).")
    gpu_types: tuple[Mapping[str, Any], ...] = setting((), "Kinds of GPU in the slurm partition, for typed requests: "
                                                           "[{product, gres (gres.conf Type, or a MIG profile), constraint "
                                                           "(node feature), memory_gib}]. Default: none (every step asks --gres=gpu:N).")
    #: seconds per wait class; missing keys keep the defaults of :class:`dagster_gpu.slurm.status.WaitLimits`
    wait_limits_seconds: Mapping[str, float] = setting(
        default_factory=dict, show_default=False,
        description="Longest wait (s) of a task in each non-terminal state before its step fails and the task is "
                    "cancelled (0 = no limit).",
        schema={
            f.name: dg.Field(float, is_required=False, description=f"{_WAIT_LIMIT_DOCS[f.name]}: default {f.default:g}.")
            for f in dataclasses.fields(WaitLimits)
        },
    )

    def __post_init__(self):
        apply_renamed(self, "slurm")
        nest_sections(self)
        object.__setattr__(self, "gpu_types", gpu_types_from_settings(self.gpu_types))
        object.__setattr__(self, "extra_sbatch_args", tuple(self.extra_sbatch_args))
        object.__setattr__(self, "env_files", tuple(os.path.expanduser(x) for x in self.env_files))
        if self.events not in ("direct", "relay"):
            raise ValueError(f"gpu_executor config slurm.events: {self.events!r} is not 'direct' or 'relay'")
        object.__setattr__(self, "relay_storage_options", dict(self.relay_storage_options or {}))
        check_relay_settings(self.events, self.relay_url, self.relay_storage_options)
        if self.signal_lead_seconds is not None and not 0 < int(self.signal_lead_seconds) <= 65535:
            raise ValueError(f"gpu_executor config slurm.signal_lead_seconds: {self.signal_lead_seconds} is not in "
                             "1..65535 (sbatch --signal's sig_time)")

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> "SlurmSettings":
        """Settings from the ``slurm:`` section (absent keys take the defaults above)."""
        return from_section(cls, section, "slurm")

    @property
    def wait_limits(self):
        """:class:`~dagster_gpu.slurm.status.WaitLimits` from ``wait_limits_seconds``. Raises ValueError."""
        return WaitLimits.from_mapping(self.wait_limits_seconds)
