"""Trivial partitioned assets on gpu_executor's kubernetes backend, for the Kubernetes end-to-end tests and bench.

Settings come from the environment so every process (test, daemon, run workers, pods) agrees:
``DAGSTER_GPU_K8S_KUBECONFIG`` (the executor ServiceAccount's kubeconfig, from resources/k8s/cluster.sh env),
``DAGSTER_PG_HOST/PORT/USER`` (handed to pods as plain env; the password only as a Secret reference),
``K8S_TEST_PENDING_TIMEOUT`` / ``K8S_TEST_CREATE_TIMEOUT`` (s), ``K8S_TEST_IMAGE`` (the node agent pulls
``*slow-pull*`` images slowly and fails ``*does-not-exist*`` ones), ``K8S_TEST_SHARING`` (the sharing strategy of
shared-ok steps; the node's driver refuses it: its feature gates are off), ``K8S_TEST_QUEUE_NAME`` (a Kueue
LocalQueue: step pods are Kueue workloads). Each asset sleeps ``test/sleep`` seconds (a run tag) and returns its
partition key plus the Kubernetes metadata the worker can see (``k8s/namespace``, ``k8s/pod``) and the
devices the node made visible (``NVIDIA_VISIBLE_DEVICES``).

Assets (same partitions):
  k8s_mig         one MIG 1g.10gb slice (``mig-ok``) -> DeviceClass mig.nvidia.com
  k8s_gpu         one whole A100 with >= 79 GiB        -> DeviceClass gpu.nvidia.com (2 on the fake node)
  k8s_impossible  one GPU with >= 200 GiB              -> never schedulable
  k8s_shared      one GPU, shared-ok                   -> K8S_TEST_SHARING's opaque GpuConfig on the claim
  k8s_preemptible one MIG slice, like k8s_mig, whose body stops gracefully on SIGTERM as the embedding unit does
                  (dagster_gpu.worker.preemption: exit 143 with no step outcome), for the preemption tests
"""

from __future__ import annotations

import os
import time

import dagster as dg

from dagster_gpu.executor.executor import gpu_executor

NAMESPACE = "dagster-gpu"
PG_SECRET = "dagster-postgresql-secret"
KEYS = [f"k{i:03d}" for i in range(100)] + ["doc 1/ä $(touch /tmp/pwned).txt"]
partitions = dg.StaticPartitionsDefinition(KEYS)


def executor_config() -> dict:
    env_vars = [f"{k}={os.environ[k]}" for k in ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_USER") if k in os.environ]
    return {
        "backend": "kubernetes",
        "local": {"enabled": False},
        "kubernetes": {
            "kubeconfig": os.environ.get("DAGSTER_GPU_K8S_KUBECONFIG", "/tmp/dagster-gpu-k8s/executor.kubeconfig"),
            "namespace": NAMESPACE,
            "image": os.environ.get("K8S_TEST_IMAGE", "dagster-gpu:dev"),
            "postgres_password_secret": {"name": PG_SECRET, "key": "postgresql-password", "env": "DAGSTER_PG_PASSWORD"},
            "container_context": {"env_vars": env_vars, "labels": {"dagster-gpu/test": "e2e"},
                                  "service_account_name": "dagster-gpu-worker"},
            "pending_timeout_seconds": float(os.environ.get("K8S_TEST_PENDING_TIMEOUT", "300")),
            "create_timeout_seconds": float(os.environ.get("K8S_TEST_CREATE_TIMEOUT", "60")),
            "sharing_strategy": os.environ.get("K8S_TEST_SHARING") or None,
            "termination_grace_period_seconds": 10,
            "cpu_request": os.environ.get("K8S_TEST_CPU_REQUEST") or None,
            "priority_class_name": os.environ.get("K8S_TEST_PRIORITY_CLASS") or None,
            "max_preemptions": int(os.environ.get("K8S_TEST_MAX_PREEMPTIONS", "3")),
            "queue_name": os.environ.get("K8S_TEST_QUEUE_NAME") or None,
        },
        "retries": {"disabled": {}},
        "sleep_seconds": float(os.environ.get("K8S_TEST_SLEEP_SECONDS", "0.5")),
        "check_step_health_interval_seconds": 1,
    }


def _body(context) -> dg.MaterializeResult:
    from dagster_gpu.worker.backend_env import backend_metadata
    from dagster_gpu.k8s.claim import claim_metadata

    time.sleep(float(context.run.tags.get("test/sleep", "0")))
    md = {**backend_metadata("kubernetes"), **claim_metadata()}  # as the embedding asset does
    md["test/partition_key"] = context.partition_key
    md["test/nvidia_visible_devices"] = os.environ.get("NVIDIA_VISIBLE_DEVICES", "")
    md["test/pg_password_set"] = bool(os.environ.get("DAGSTER_PG_PASSWORD"))
    return dg.MaterializeResult(metadata=md)


@dg.asset(partitions_def=partitions, op_tags={"dagster-gpu/gpu-count": "1", "dagster-gpu/mig-ok": "true"})
def k8s_mig(context):
    return _body(context)


@dg.asset(partitions_def=partitions, op_tags={"dagster-gpu/gpu-count": "1", "dagster-gpu/gpu-memory-gib": "79",
                                              "dagster-gpu/gpu-product": "NVIDIA A100"})
def k8s_gpu(context):
    return _body(context)


@dg.asset(partitions_def=partitions, op_tags={"dagster-gpu/gpu-count": "1", "dagster-gpu/gpu-memory-gib": "200"})
def k8s_impossible(context):
    return _body(context)


@dg.asset(partitions_def=partitions, op_tags={"dagster-gpu/gpu-count": "1", "dagster-gpu/shared-ok": "true"})
def k8s_shared(context):
    return _body(context)


@dg.asset(partitions_def=partitions, op_tags={"dagster-gpu/gpu-count": "1", "dagster-gpu/mig-ok": "true"})
def k8s_preemptible(context):
    from dagster_gpu.worker.preemption import GracefulStop, exit_preempted

    stop = GracefulStop().install()
    deadline = time.monotonic() + float(context.run.tags.get("test/sleep", "0"))
    while time.monotonic() < deadline:
        if stop.event.wait(0.2):
            context.log.info("preempted: stopping without an outcome, as the embedding unit does")
            exit_preempted()
    stop.restore()
    md = {k: v for k, v in _body(context).metadata.items()}
    return dg.MaterializeResult(metadata=md)


#: ``K8S_TEST_EXECUTOR=multiprocess`` swaps in Dagster's multiprocess executor (the bench's baseline).
_EXECUTOR = (
    dg.multiprocess_executor
    if os.environ.get("K8S_TEST_EXECUTOR") == "multiprocess"
    else gpu_executor.configured(executor_config())
)
defs = dg.Definitions(
    assets=[k8s_mig, k8s_gpu, k8s_impossible, k8s_shared, k8s_preemptible],
    jobs=[dg.define_asset_job(f"{a.key.path[-1]}_job", selection=[a])
          for a in (k8s_mig, k8s_gpu, k8s_impossible, k8s_shared, k8s_preemptible)],
    executor=_EXECUTOR,
)


def get_job(name: str) -> dg.JobDefinition:
    return defs.resolve_job_def(name)


def get_mig_job() -> dg.JobDefinition:
    return get_job("k8s_mig_job")


def get_gpu_job() -> dg.JobDefinition:
    return get_job("k8s_gpu_job")


def get_impossible_job() -> dg.JobDefinition:
    return get_job("k8s_impossible_job")


def get_shared_job() -> dg.JobDefinition:
    return get_job("k8s_shared_job")
