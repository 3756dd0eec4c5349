"""A trivial partitioned asset on gpu_executor's slurm backend, for the Slurm end-to-end tests and bench.

Settings come from the environment so every process (test, daemon, run workers, array tasks) agrees:
``SLURM_TEST_THROTTLE`` (array %T), ``SLURM_TEST_WINDOW`` / ``SLURM_TEST_MAX_WINDOW`` (coalescing, s),
``SLURM_TEST_BACKLOG`` / ``SLURM_TEST_TARGET`` (coalesce_backlog_tasks / coalesce_target_tasks; 0 turns
that hold off),
``DAGSTER_GPU_SLURM_SPOOL`` (spool dir), ``DGPU_TEST_EVENTS`` (``relay``: see :func:`relay_config`), ``DGPU_TEST_SLURM_PYTHON`` (the interpreter array tasks run: see
:func:`worker_python_config`), ``SLURM_TEST_RETRIES=1`` (the executor's retries on: the asset's
RetryPolicy(max_retries=1) applies). The asset sleeps ``test/sleep`` seconds (a run tag) and returns its
partition key; the first attempt of a partition listed in ``DGPU_TEST_SLOW_FIRST`` (comma-separated)
writes its pid to ``$DGPU_TEST_PID_DIR/<partition>.pid`` and sleeps 300 s instead (time to kill it); a
partition listed in ``DGPU_TEST_CRASH`` prints a line to stderr and exits 7 with no step outcome; with
``DGPU_TEST_HOST_SPOOL`` the materialization says whether the task sees that path. (Not
``SLURM_*`` names: the client scrubs those from sbatch's environment, so array tasks would not see them.)

    python tests/slurm_pipeline.py run PARTITION_KEY [SLEEP_S]   # one run in this process (a run worker)
"""

from __future__ import annotations

import os
import sys
import time

import dagster as dg

from dagster_gpu.executor.executor import gpu_executor

N_KEYS = 200
#: Partition keys, including one full of shell metacharacters: it must never reach a shell.
KEYS = [f"p{i:03d}" for i in range(N_KEYS)] + ["p it's \"$(touch /tmp/pwned)\"; `x` & y"]
partitions = dg.StaticPartitionsDefinition(KEYS)


def executor_config() -> dict:
    slurm: dict = {
        "account": "research",
        "coalesce_window_seconds": float(os.environ.get("SLURM_TEST_WINDOW", "2")),
        "coalesce_max_window_seconds": float(os.environ.get("SLURM_TEST_MAX_WINDOW", "15")),
        "poll_interval_seconds": float(os.environ.get("SLURM_TEST_POLL", "1")),
        "vanish_grace_seconds": 60.0,
        "settle_wait_seconds": float(os.environ.get("SLURM_TEST_RECONCILE_WAIT", "30")),
    }
    if os.environ.get("SLURM_TEST_BACKLOG"):
        slurm["coalesce_backlog_tasks"] = int(os.environ["SLURM_TEST_BACKLOG"])
    if os.environ.get("SLURM_TEST_TARGET"):
        slurm["coalesce_target_tasks"] = int(os.environ["SLURM_TEST_TARGET"])
    if os.environ.get("SLURM_TEST_QOS"):
        slurm["qos"] = os.environ["SLURM_TEST_QOS"]
    if os.environ.get("SLURM_TEST_SIGNAL_LEAD"):
        slurm["signal_lead_seconds"] = int(os.environ["SLURM_TEST_SIGNAL_LEAD"])
    if os.environ.get("SLURM_TEST_THROTTLE"):
        slurm["throttle"] = int(os.environ["SLURM_TEST_THROTTLE"])
    if os.environ.get("DAGSTER_GPU_SLURM_SPOOL"):
        slurm["spool_dir"] = os.environ["DAGSTER_GPU_SLURM_SPOOL"]
    if os.environ.get("SLURM_CONF"):
        slurm["slurm_conf"] = os.environ["SLURM_CONF"]
    slurm.update(ssh_transport_config())
    slurm.update(rest_transport_config())
    slurm.update(relay_config(slurm))
    return {
        "backend": "slurm",
        "local": {"enabled": False},
        "slurm": slurm,
        "retries": {"enabled": {}} if os.environ.get("SLURM_TEST_RETRIES") == "1" else {"disabled": {}},
        "sleep_seconds": 0.5,
        "check_step_health_interval_seconds": 2,
        **worker_python_config(slurm),
    }


def ssh_transport_config() -> dict:
    """``DGPU_TEST_SLURM_TRANSPORT=ssh``: the slurm section reaches the cluster through the test sshd
    (resources/ssh/sshd.sh; its ``DAGSTER_GPU_SSH_*`` variables), with the cluster-side spool
    ``DGPU_TEST_REMOTE_SPOOL``, the master's socket in ``DGPU_TEST_SSH_CONTROL_DIR`` and the Slurm commands in
    ``DGPU_TEST_SLURM_BIN_DIR`` when set (the 24.11 cluster's wrappers). Empty otherwise."""
    if os.environ.get("DGPU_TEST_SLURM_TRANSPORT", "local") != "ssh":
        return {}
    from pipelines.demo_backends import ssh_settings

    # what a local sbatch would have exported to the array task: the instance, the test's and ranged_pipeline's
    # knobs, the checkout, the offline Hub
    cfg = ssh_settings(os.environ["DGPU_TEST_REMOTE_SPOOL"],
                       ("DAGSTER_*", "DGPU_TEST_*", "RANGED_TEST_*", "PYTHONPATH", "HF_HUB_OFFLINE"),
                       os.environ["DGPU_TEST_SSH_CONTROL_DIR"])
    if os.environ.get("DGPU_TEST_SLURM_BIN_DIR"):  # the 24.11 cluster's client wrappers, not on the login PATH
        cfg["slurm_bin_dir"] = os.environ["DGPU_TEST_SLURM_BIN_DIR"]
    return cfg


def rest_transport_config() -> dict:
    """``DGPU_TEST_SLURM_TRANSPORT=rest``: the slurm section reaches the 24.11 cluster's slurmrestd at
    ``DGPU_TEST_REST_URL`` as root with the token in ``DGPU_TEST_REST_CREDENTIAL_FILE`` (a name without TOKEN:
    the array tasks need it to build this config, and rest.forward_env never forwards *TOKEN* names); the array
    tasks read the PostgreSQL password from ``DGPU_TEST_ENV_FILE`` (a job's environment from slurmrestd holds no
    secret). The spool is the local one: /tmp is the same directory in the cluster's root. Empty otherwise."""
    if os.environ.get("DGPU_TEST_SLURM_TRANSPORT", "local") != "rest":
        return {}
    return {"transport": "rest",
            "rest": {"url": os.environ["DGPU_TEST_REST_URL"], "user": "root",
                     "token_file": os.environ["DGPU_TEST_REST_CREDENTIAL_FILE"],
                     # what a local sbatch would have exported to the array task: the instance, the tests' knobs, the checkout
                     "forward_env": ["DAGSTER_*", "DGPU_TEST_*", "RANGED_TEST_*", "PYTHONPATH", "HF_HUB_OFFLINE", "PATH"]},
            "env_files": [os.environ["DGPU_TEST_ENV_FILE"]]}


def relay_config(slurm: dict) -> dict:
    """``DGPU_TEST_EVENTS=relay``: the array tasks relay their events (``events: relay``) and load
    ``DGPU_TEST_NO_DB_ENV_FILE`` last (e.g. a wrong ``DAGSTER_PG_PASSWORD`` and a ``DAGSTER_HOME`` that does not
    exist: a task that touched the database would fail); with ``DGPU_TEST_RELAY_URL`` the channels are under that
    object-store prefix, on the S3 endpoint ``DGPU_TEST_RELAY_ENDPOINT``. Empty otherwise."""
    if os.environ.get("DGPU_TEST_EVENTS", "direct") != "relay":
        return {}
    extra = [os.environ["DGPU_TEST_NO_DB_ENV_FILE"]] if os.environ.get("DGPU_TEST_NO_DB_ENV_FILE") else []
    cfg = {"events": "relay", "env_files": [*slurm.get("env_files", []), *extra]}
    if os.environ.get("DGPU_TEST_RELAY_URL"):  # channels on an object store (the tests' moto S3 endpoint)
        cfg["relay_url"] = os.environ["DGPU_TEST_RELAY_URL"]
        cfg["relay_storage_options"] = {"client_kwargs": {"endpoint_url": os.environ["DGPU_TEST_RELAY_ENDPOINT"]}}
    return cfg


def worker_python_config(slurm: dict) -> dict:
    """``DGPU_TEST_SLURM_PYTHON`` (the 24.11 test cluster's worker-python, whose array tasks run in a
    chroot; resources/slurm/README.md): the interpreter of the job script (``slurm.python``, set in
    ``slurm``) and of the step worker (executor ``worker_python``, returned). Empty when unset."""
    py = os.environ.get("DGPU_TEST_SLURM_PYTHON")
    if not py:
        return {}
    slurm["python"] = py
    return {"worker_python": py}


@dg.asset(partitions_def=partitions, op_tags={"dagster-gpu/gpu-count": "1"}, retry_policy=dg.RetryPolicy(max_retries=1))
def trivial(context):
    sleep_s = float(context.run.tags.get("test/sleep", "0"))
    if context.retry_number == 0 and context.partition_key in os.environ.get("DGPU_TEST_SLOW_FIRST", "").split(","):
        pid_file = os.path.join(os.environ["DGPU_TEST_PID_DIR"], f"{context.partition_key}.pid")
        with open(pid_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(pid_file + ".tmp", pid_file)
        sleep_s = 300.0
    if context.partition_key in os.environ.get("DGPU_TEST_CRASH", "").split(","):
        # a worker that dies without a step outcome: the failure message is only in the task's log
        print(f"dagster-gpu test: partition {context.partition_key} crashes here with exit 7", file=sys.stderr, flush=True)
        os._exit(7)
    if os.environ.get("DGPU_TEST_GRACEFUL") == "1":
        _sleep_until_stopped(context, sleep_s)
    else:
        time.sleep(sleep_s)
    from dagster_gpu.worker.backend_env import backend_metadata

    md = backend_metadata("slurm")
    md["test/partition_key"] = context.partition_key
    md["test/retry_number"] = context.retry_number
    md["test/cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    md["test/dagster_home"] = os.environ.get("DAGSTER_HOME", "")
    if os.environ.get("DGPU_TEST_HOST_SPOOL"):  # can this task see the Dagster host's spool? (nothing-shared tests)
        md["test/host_spool_visible"] = os.path.exists(os.environ["DGPU_TEST_HOST_SPOOL"])
    return dg.MaterializeResult(metadata=md)


def _sleep_until_stopped(context, sleep_s: float) -> None:
    """``DGPU_TEST_GRACEFUL=1``: the embedding unit's stop path (dagster_gpu.worker.preemption) around the sleep: a
    SIGTERM or SIGUSR1 writes ``$DGPU_TEST_PID_DIR/<partition>.stopped`` (signal number, epoch seconds) and ends
    the worker with 143 and no step outcome. A requeued attempt (``SLURM_RESTART_COUNT`` >= 1) sleeps 1 s."""
    from dagster_gpu.worker.preemption import GracefulStop, exit_preempted

    if int(os.environ.get("SLURM_RESTART_COUNT") or 0) >= 1:
        sleep_s = 1.0
    stop = GracefulStop().install()
    deadline = time.monotonic() + sleep_s
    while time.monotonic() < deadline:
        if stop.event.wait(0.2):
            marker = os.path.join(os.environ["DGPU_TEST_PID_DIR"], f"{context.partition_key}.stopped")
            with open(marker + ".tmp", "w") as f:
                f.write(f"{stop.signum} {time.time()}")
            os.replace(marker + ".tmp", marker)
            exit_preempted(signum=stop.signum)
    stop.restore()


trivial_job = dg.define_asset_job("trivial_job", selection=[trivial])
#: ``SLURM_TEST_EXECUTOR=multiprocess`` swaps in Dagster's multiprocess executor (the bench's baseline).
_EXECUTOR = (
    dg.multiprocess_executor
    if os.environ.get("SLURM_TEST_EXECUTOR") == "multiprocess"
    else gpu_executor.configured(executor_config())
)
defs = dg.Definitions(assets=[trivial], jobs=[trivial_job], executor=_EXECUTOR)


def get_job() -> dg.JobDefinition:
    return defs.resolve_job_def("trivial_job")


def run_partition(partition_key: str, sleep_s: float = 0.0) -> bool:
    """Run one partition in this process (the run worker) through gpu_executor; True on success."""
    from dagster._core.definitions.reconstruct import ReconstructableJob

    recon = ReconstructableJob.for_file(os.path.abspath(__file__), "get_job")
    with dg.DagsterInstance.get() as instance:
        with dg.execute_job(recon, instance=instance, tags={"dagster/partition": partition_key, "test/sleep": str(sleep_s)}) as r:
            return r.success


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "run":
        ok = run_partition(sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 0.0)
        sys.exit(0 if ok else 1)
    print(__doc__, file=sys.stderr)
    sys.exit(2)
