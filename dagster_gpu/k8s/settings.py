"""The ``kubernetes:`` section of gpu_executor's config: one settings class, its Dagster schema generated from it.

The defaults of what the pod and ResourceClaimTemplate look like (namespace, image, MIG profile, grace
period, requests, the PostgreSQL password Secret) are :class:`dagster_gpu.k8s.manifests.PodSettings`'s,
referenced here, not restated; the backend's own (timeouts, the exit wait for bills) are written here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import dagster as dg

from dagster_gpu.k8s import manifests as m
from dagster_gpu.settings.schema import apply_renamed, from_section, renamed, setting
from dagster_gpu.settings.schema import config_field as settings_config_field

_PG = m.PodSettings().secret_env[0]  # the default PostgreSQL password Secret reference


@dataclass(frozen=True)
class PostgresPasswordSecret:
    """The Secret key holding the Dagster PostgreSQL password, passed to the container by ``secretKeyRef``."""

    name: str = setting(_PG.secret, "Secret name.")
    key: str = setting(_PG.key, "Key in the Secret.")
    env: str = setting(_PG.env, "Environment variable the container gets it as.")


@dataclass(frozen=True)
class KubernetesSettings:
    """The ``kubernetes:`` section, typed (seconds for all durations)."""

    kubeconfig: str | None = setting(None, "kubeconfig path (default $KUBECONFIG / ~/.kube/config).")
    context: str | None = setting(None, "kubeconfig context.")
    in_cluster: bool = setting(False, "Use the in-cluster ServiceAccount token instead of a kubeconfig.")
    namespace: str = setting(m.PodSettings.namespace, "Namespace of the step pods and their templates.")
    image: str = setting(m.PodSettings.image, "The step worker's container image.")
    postgres_password_secret: PostgresPasswordSecret | None = setting(
        default_factory=PostgresPasswordSecret,
        description="Secret holding the Dagster PostgreSQL password (passed by secretKeyRef, never by value); null: none.")
    env_secret_refs: tuple[m.SecretEnv, ...] = setting((), "More env vars from Secret keys: [{env, secret, key}].")
    container_context: Mapping[str, Any] = setting(
        default_factory=dict, description="dagster-k8s K8sContainerContext fields (env_vars, env_secrets, volumes, ...).")
    mig_profile: str | None = setting(m.PodSettings.mig_profile, "MIG profile for mig-ok requests; null: whole GPUs only.")
    sharing_strategy: str | None = setting(
        m.PodSettings.sharing_strategy, "Opaque GpuConfig sharing strategy for shared-ok requests.",
        schema=dg.Enum("K8sSharing", [dg.EnumValue(v) for v in m.SHARING_STRATEGIES]))
    pending_timeout_seconds: float = setting(300.0, "Seconds a pod may stay unschedulable before its step fails.")
    create_timeout_seconds: float = setting(
        120.0, "Seconds a bound pod's container may stay un-started, not counting an image pull in progress "
               "(the clock starts again when the kubelet reports Pulled).")
    image_pull_timeout_seconds: float = setting(1800.0, "Seconds one image pull (kubelet Pulling event, no Pulled "
                                                        "yet) may run before the step fails.")
    termination_grace_period_seconds: int = setting(m.PodSettings.termination_grace_period_seconds,
                                                    "The pod's terminationGracePeriodSeconds.")
    cpu_request: str | None = setting(m.PodSettings.cpu_request, "The container's CPU request (quantity).")
    memory_request: str | None = setting(m.PodSettings.memory_request, "The container's memory request (quantity).")
    delete_finished_pods: bool = setting(True, "Delete a pod once it ended and its interval was read (the settler).")
    settle_wait_seconds: float = setting(15.0, "At orchestrator exit, wait this long for launched pods to end "
                                               "(and be billed and deleted).")
    finalize_wait_seconds: float | None = renamed("settle_wait_seconds")
    resource_api_version: str | None = setting(None, "Force resource.k8s.io v1 / v1beta2 / v1beta1 (default: discovered).")
    labels: Mapping[str, Any] = setting(default_factory=dict, description="More labels on pods and claims.")
    worker_python: str | None = setting(
        None, "The step container's Python (a path or a name on the image's PATH); default: the executor-wide "
              "worker_python if set, else `python` from the image's PATH.")
    restricted_security_context: bool = setting(
        True, "Give step pods the securityContext the Pod Security 'restricted' profile admits (runAsNonRoot, "
              "seccomp RuntimeDefault, no privilege escalation, drop ALL); container_context.security_context "
              "overrides it key by key.")
    run_as_user: int | None = setting(
        m.PodSettings.run_as_user, "runAsUser/runAsGroup of step pods (the worker image's user); null: the image's USER.")
    tolerations: tuple[Mapping[str, Any], ...] | None = setting(
        None, "Tolerations of step pods ([{key, operator, value, effect}]); default: GPU steps tolerate the "
              "nvidia.com/gpu NoSchedule taint, CPU steps nothing.")

    priority_class_name: str | None = setting(
        None, "The step pods' priorityClassName. On GPUs shared with online inference, name a low-value class with "
              "preemptionPolicy: Never (resources/k8s/manifests/50-batch-priorityclass.yaml): batch steps then never "
              "preempt a pod, and a higher-priority pod may preempt them (the worker stops gracefully on SIGTERM). "
              "Default: the namespace's default priority.")
    queue_name: str | None = setting(
        None, "A Kueue LocalQueue: step pods get the label kueue.x-k8s.io/queue-name with it. Default: no label.")
    queue_timeout_seconds: float = setting(
        3600.0, "Seconds a queued step pod (queue_name set) may wait for Kueue to admit it before its step fails, "
                "naming the LocalQueue and Kueue's reason; a request Kueue can never admit (inadmissible, no "
                "flavor fits) fails at launch instead.")
    preemptions_per_gpu_hour: float = setting(
        0.0, "The cost policy's prior for how often step pods of this priority class are preempted, per GPU-hour; "
             "blended with the preemptions the instance observed there (dagster_gpu/policy/preemption.py). "
             "0: not preemptible until preemptions are observed.")
    max_preemptions: int = setting(
        3, "How many times a step is launched again (a new pod, the same range minus what it materialized, continuing "
           "after its checkpoint parts) after a preemption or eviction ended its pod (the pod's DisruptionTarget "
           "condition, or kube-scheduler's Preempted event); the next one fails the step, saying how many there were. "
           "0: a preempted step fails at once.")

    def __post_init__(self):
        apply_renamed(self, "kubernetes")
        if int(self.max_preemptions) < 0:
            raise ValueError(f"gpu_executor config kubernetes.max_preemptions: {self.max_preemptions} is negative")

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> "KubernetesSettings":
        """Settings from the ``kubernetes:`` section (absent keys take the defaults above)."""
        return from_section(cls, section)

    def pod_settings(self) -> m.PodSettings:
        """What the pod and ResourceClaimTemplate look like (raises ManifestError for a bad value)."""
        secret_env = []
        pg = self.postgres_password_secret
        if pg is not None:
            secret_env.append(m.SecretEnv(pg.env, pg.name, pg.key))
        secret_env += list(self.env_secret_refs)
        return m.PodSettings(
            namespace=self.namespace,
            image=self.image,
            secret_env=tuple(secret_env),
            container_context=dict(self.container_context),
            mig_profile=self.mig_profile,
            sharing_strategy=self.sharing_strategy,
            termination_grace_period_seconds=int(self.termination_grace_period_seconds),
            cpu_request=self.cpu_request,
            memory_request=self.memory_request,
            labels=dict(self.labels),
            restricted_security_context=self.restricted_security_context,
            run_as_user=self.run_as_user,
            tolerations=None if self.tolerations is None else tuple(dict(t) for t in self.tolerations),
            priority_class_name=self.priority_class_name,
            queue_name=self.queue_name,
        )


def config_field() -> dg.Field:
    """The ``kubernetes:`` section of gpu_executor's config, generated from :class:`KubernetesSettings`."""
    return settings_config_field(
        KubernetesSettings, "Kubernetes backend: one pod per step, GPU by DRA ResourceClaimTemplate (resource.k8s.io/v1).")


def settings_from_config(section: Mapping[str, Any]) -> m.PodSettings:
    """The pod settings of a ``kubernetes:`` section (already defaulted by Dagster's config system or not)."""
    return KubernetesSettings.from_section(section).pod_settings()
