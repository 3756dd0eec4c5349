"""The ``kubernetes`` backend: each step runs in a Pod whose GPU comes from a DRA ResourceClaimTemplate.

Per step (see ``dagster_gpu.k8s.manifests`` for the objects): create the ResourceClaimTemplate, create the
Pod (``restartPolicy: Never``), then make the template owned by the pod. The resourceclaim controller
creates the ResourceClaim from the template (owned by the pod) and kube-scheduler allocates a device that
matches the request; the claim is released and deleted when the pod ends or goes away.

Health (:meth:`KubernetesBackend.state`, which only reads the pod, its events and its claim):

* Pending and unschedulable (``PodScheduled=False``, reason ``Unschedulable``, the ``FailedScheduling``
  event) for longer than ``pending_timeout_seconds`` -> FAILED with the scheduler's message, ``abandoned``:
  the settler terminates it (pod, template and claims deleted) so no pod or claim is left.
* Bound but its container not started (``CreateContainerConfigError``, image pull errors...) for longer
  than ``create_timeout_seconds`` -> FAILED with the kubelet's reason and message and its Warning events,
  ``abandoned``. An image pull in progress (``Pulling``, no ``Pulled`` yet) is progress: it may run
  ``image_pull_timeout_seconds``; the create clock starts again at ``Pulled``. A
  ``FailedPrepareDynamicResources`` event (the DRA driver refused the claim) fails the step at once with
  the kubelet's message (see :mod:`dagster_gpu.k8s.pod_state`).
* The pod missing (never created, or deleted by someone else) -> FAILED; the step handler does not fail a
  step that already recorded its outcome.
* Succeeded / Failed -> SUCCEEDED / FAILED with the container's exit code.
* Ended by a disruption (preemption, eviction, drain: the ``DisruptionTarget`` condition on the ended pod, on
  the terminating pod before it went away, or kube-scheduler's ``Preempted`` event about a pod already gone)
  -> PREEMPTED: the step handler launches the unit again in a new pod (``-p<n>`` after its name), at most
  ``max_preemptions`` times.

A terminal state is remembered with the pod's end facts (running interval, claim, allocated devices,
worker environment), so it still answers after the pod is gone. Accounting (:meth:`KubernetesBackend.accounting`)
is the pod-interval bill from those facts; :meth:`KubernetesBackend.elect_bill_writer` deletes the ended pod
gracefully with its UID precondition (``delete_finished_pods``), and the one process whose delete succeeded
writes the bill. The settler (:mod:`dagster_gpu.executor.settle`) calls them, and settles ended pods of any
orchestrating process (:meth:`KubernetesBackend.unsettled`).

Terminate: graceful delete of the pod (its ``terminationGracePeriodSeconds``, never forced), its template
and its claims. Workers survive the orchestrator: a SIGTERM to the run worker leaves pods running and a
resumed run re-attaches by the handle (pod name + uid) recorded in the event log.

Run config (``execution: config: kubernetes:``): every key, its default and its meaning are in
:class:`~dagster_gpu.k8s.settings.KubernetesSettings` (the Dagster schema is generated from it; the reference
page docs/reference/configuration.md too).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from kubernetes.client.rest import ApiException

from dagster_gpu.billing.keys import COST_USD, GPU_SECONDS, RATE_USD_PER_GPU_HOUR
from dagster_gpu.billing.ratecard import RateCard, RateCardError
from dagster_gpu.contracts import (
    Backend,
    Handle,
    StepLaunch,
    UnitBill,
    WorkerState,
    WorkerStatus,
    describe_partitions,
    with_step_context,
)
from dagster_gpu.k8s import kueue
from dagster_gpu.k8s import manifests as m
from dagster_gpu.k8s.billing import pod_interval_metadata
from dagster_gpu.k8s.client import ClaimWatcher, KubeClient, PodWatcher, load_api_client
from dagster_gpu.k8s.handle import PodHandle
from dagster_gpu.k8s.inventory import device_groups
from dagster_gpu.k8s.kueue import WorkloadState
from dagster_gpu.k8s.pod_state import (
    FAILED_PREPARE,
    PodTimeouts,
    disruption,
    epoch,
    needs_events,
    pod_state,
    preempted_event,
    terminated,
)
from dagster_gpu.k8s.settings import KubernetesSettings, config_field  # noqa: F401  (config_field: the registry reads it here)
from dagster_gpu.k8s.sharing_failures import SharingFailures, default_path
from dagster_gpu.policy.preemption import pool_key
from dagster_gpu.policy.snapshot import KubernetesState

log = logging.getLogger(__name__)
if os.environ.get("DAGSTER_GPU_K8S_LOG"):  # optional log file for the backend's work (states, releases)
    _h = logging.FileHandler(os.environ["DAGSTER_GPU_K8S_LOG"])
    _h.setFormatter(logging.Formatter("%(asctime)s pid=%(process)d %(levelname)s %(message)s"))
    log.addHandler(_h)
    log.setLevel(logging.INFO)


def configured(section: Mapping[str, Any] | None) -> bool:
    """The registry hook: the Kubernetes backend is configured when gpu_executor's config has a ``kubernetes:``
    section."""
    return section is not None


def build_backend(section: Mapping[str, Any], executor_config: Mapping[str, Any],
                  default_log_dir: Path | None = None) -> "KubernetesBackend":
    """The registry hook: a KubernetesBackend from the ``kubernetes:`` section (its logs are the pods')."""
    s = KubernetesSettings.from_section(section)
    api = load_api_client(s.kubeconfig, s.context, s.in_cluster)
    pod = s.pod_settings()
    kube = KubeClient(api, pod.namespace, s.resource_api_version)
    rate_card = RateCard.load(executor_config.get("rate_card"))
    return KubernetesBackend(
        kube, pod,
        pending_timeout_s=s.pending_timeout_seconds,
        create_timeout_s=s.create_timeout_seconds,
        image_pull_timeout_s=s.image_pull_timeout_seconds,
        delete_finished_pods=s.delete_finished_pods,
        rates=rate_card.table("kubernetes"),
        settle_wait_s=s.settle_wait_seconds,
        max_preemptions=s.max_preemptions,
        preemptions_per_gpu_hour=s.preemptions_per_gpu_hour,
        queue_timeout_s=s.queue_timeout_seconds,
    )


def _ts(t: dt.datetime | None) -> float | None:
    return t.timestamp() if t is not None else None


def worker_device_fraction(choice: m.DeviceChoice) -> float:
    """The step context's ``device_fraction``: the share of a GPU each device the worker sees is billed as,
    per device (the worker multiplies its device count by it, as on Slurm). The worker names a MIG device's
    fraction itself from NVML's name (``... MIG 1g.10gb``), so a ``firstAvailable`` claim gets the whole-GPU
    alternative's fraction: a whole GPU given as the fallback is billed as one."""
    whole = next((a for a in choice.alternatives if a.mig_profile is None), None)
    return (whole or choice).fraction_per_device


class KubernetesBackend(Backend):
    """Step workers as pods with DRA ResourceClaims.

    Args:
        kube: API access for the namespace.
        settings: what the objects look like.
        pending_timeout_s: seconds a pod may stay unschedulable before the step fails (scheduler's message).
        create_timeout_s: seconds a bound pod's container may stay un-started (or a missing pod may be
            tolerated right after launch) before the step fails; an image pull in progress (``Pulling``
            event, no ``Pulled`` yet) does not count, and the clock starts again at ``Pulled``.
        image_pull_timeout_s: seconds one image pull may run before the step fails.
        delete_finished_pods: :meth:`elect_bill_writer` deletes a pod once it ended and its interval was read.
        rates: the kubernetes rate table (USD per GPU-hour) for the pod-interval bill.
        settle_wait_s: when the orchestrating process exits, the settler waits at most this long for the
            pods it launched to end, so each is billed and deleted. A pod still running then is left alone
            (a resumed run re-attaches to it; a later process's sweep settles it).
        sweep_grace_s: :meth:`unsettled` lists other processes' pods that ended this many seconds ago;
            negative: never.
        max_preemptions: how many times the executor launches a unit again after a disruption ended its pod
            (:attr:`~dagster_gpu.contracts.Backend.max_preemptions`).
        preemptions_per_gpu_hour: the policy's prior rate for this backend's preemption pool (its priority class,
            :attr:`~dagster_gpu.contracts.Backend.preemption_pool`), in :meth:`policy_state`.
        sharing_failures: where a shared (TimeSlicing/MPS) claim that failed to prepare
            (``FailedPrepareDynamicResources``) is recorded, by the step's placement pool, and read back into
            :meth:`policy_state`'s ``no_sharing`` (default: ``$DAGSTER_HOME/dagster_gpu/sharing-failures.json``,
            shared by the instance's run workers).
    """

    name = "kubernetes"
    workers_survive_orchestrator = True

    def __init__(self, kube: KubeClient, settings: m.PodSettings,
                 pending_timeout_s: float = KubernetesSettings.pending_timeout_seconds,
                 create_timeout_s: float = KubernetesSettings.create_timeout_seconds,
                 image_pull_timeout_s: float = KubernetesSettings.image_pull_timeout_seconds,
                 delete_finished_pods: bool = KubernetesSettings.delete_finished_pods,
                 rates: Mapping[str, float] | None = None,
                 settle_wait_s: float = KubernetesSettings.settle_wait_seconds, sweep_grace_s: float = 10.0,
                 sharing_failures: SharingFailures | None = None,
                 max_preemptions: int = KubernetesSettings.max_preemptions,
                 preemptions_per_gpu_hour: float = KubernetesSettings.preemptions_per_gpu_hour,
                 queue_timeout_s: float = KubernetesSettings.queue_timeout_seconds, kueue_verdict_wait_s: float = 10.0):
        self.kube = kube
        self.max_preemptions = int(max_preemptions)
        self.preemptions_per_gpu_hour = float(preemptions_per_gpu_hour)
        self.preemption_pool = pool_key("kubernetes", priority_class=settings.priority_class_name)
        self.settings = settings
        self.timeouts = PodTimeouts(pending_s=pending_timeout_s, create_s=create_timeout_s, pull_s=image_pull_timeout_s)
        self.delete_finished_pods = delete_finished_pods
        self.sharing_failures = sharing_failures if sharing_failures is not None else SharingFailures(default_path())
        self.rates = dict(rates or RateCard.load().table("kubernetes"))
        self._final: dict[str, dict[str, Any]] = {}  # pod uid -> terminal state and end facts (read, remembered)
        self._released: set[str] = set()  # pod uids this process released
        self._disrupted: dict[str, str] = {}  # pod uid -> its DisruptionTarget condition, seen while it terminated
        self._lock = threading.Lock()
        # Allocations are read from a watch: the claim is deallocated and deleted right after the pod ends.
        self.claims = ClaimWatcher(kube, f"{m.LABEL_MANAGED_BY}={m.MANAGED_BY}")
        # A pod ended by a disruption is removed by its kubelet right after: the watch sees its end anyway.
        self.pods = PodWatcher(kube, f"{m.LABEL_MANAGED_BY}={m.MANAGED_BY}", self._observe)
        self.settle_wait_s = settle_wait_s
        self.sweep_grace_s = sweep_grace_s
        self.queue_timeout_s = float(queue_timeout_s)
        self.kueue_verdict_wait_s = float(kueue_verdict_wait_s)
        self._kueue: dict[str, WorkloadState] = {}  # pod uid -> the last Kueue decision read about its Workload

    # -- live state for the cost policy ---------------------------------------------------------------
    def policy_state(self) -> KubernetesState:
        """``KubernetesState``: devices in ResourceSlices not allocated to any ResourceClaim, grouped into
        pools, and our Pending pods per pool (by the MIG/whole-GPU class their request asked for).
        Raises ApiException (e.g. 403 without the inventory ClusterRole) when the API cannot be read."""
        slices, claims, pending_pods = self.kube.inventory(f"{m.LABEL_MANAGED_BY}={m.MANAGED_BY}")
        waiting: dict[str, int] = {}
        for pod in pending_pods:
            device = (pod.get("metadata", {}).get("annotations") or {}).get(m.ANNOTATION_PLACEMENT_DEVICE)
            if device:
                waiting[device] = waiting.get(device, 0) + 1
        pools = device_groups(slices, claims, waiting)
        queue = None
        if self.settings.queue_name:  # behind Kueue the wait is the queue's (dagster_gpu.k8s.kueue.queue_state)
            lq = self.kube.read_local_queue(self.settings.queue_name)
            cq = ((lq or {}).get("spec") or {}).get("clusterQueue")
            queue = kueue.queue_state(lq, self.kube.list_cluster_queues(), self.settings.queue_name, pools,
                                      self.kube.read_pending_workloads(cq) if cq else None)
        return KubernetesState(pools=pools, namespace=self.kube.namespace,
                               no_sharing=tuple(sorted(self.sharing_failures.blocked())),
                               preemptions_per_gpu_hour=self.preemptions_per_gpu_hour,
                               preemption_pool=self.preemption_pool, queue=queue)

    # -- launch -------------------------------------------------------------------------------------
    def launch(self, launch: StepLaunch) -> Handle:
        """Create the template and pod for ``launch``; returns the handle (a
        :class:`~dagster_gpu.k8s.handle.PodHandle`'s stored form). An existing pod of the same run/step/attempt is
        re-attached. Raises ManifestError, or RuntimeError naming the partitions (:func:`~dagster_gpu.contracts.describe_partitions`)
        when the API refuses the template or the pod.
        """
        shared = self._shared(launch)
        choice0 = m.device_choice(launch.request, launch.placement.device, self.settings, launch.placement.product,
                                  shared)
        if choice0 is not None:  # the worker bills each device by its fraction
            env = with_step_context(launch.env, device_fraction=worker_device_fraction(choice0))
            launch = StepLaunch(**{**launch.__dict__, "env": env})
        pod, template, choice = m.step_objects(launch, self.settings, shared)
        name = pod.metadata.name
        self.claims.start()
        self.claims.wait_synced(10)
        where = describe_partitions(launch.partition_keys)
        if self.settings.queue_name:
            self._refuse_if_queue_unusable(name, where)
        if template is not None:
            try:
                self.kube.create_claim_template(m.to_dict(template))
            except ApiException as e:
                if e.status != 409:  # 409: left by an earlier launch of this attempt (resume): reuse it
                    raise RuntimeError(f"creating ResourceClaimTemplate {name} for {where}: {e.status} {e.reason}: {e.body}") from e
        try:
            created = self.kube.create_pod(m.to_dict(pod))
        except ApiException as e:
            if e.status != 409:
                if template is not None:
                    self.kube.delete_claim_template(name)
                raise RuntimeError(f"creating pod {name} for {where}: {e.status} {e.reason}: {e.body}") from e
            created = self.kube.read_pod(name)
            if created is None or (created.metadata.labels or {}).get(m.LABEL_RUN_ID) != m.sanitize_label_value(launch.run_id):
                raise RuntimeError(f"pod {name} for {where} exists but belongs to another run") from e
            log.info("re-attached to existing pod %s for %s", name, where)
        if template is not None:
            try:
                self.kube.set_template_owner(name, m.owner_reference(name, created.metadata.uid))
            except ApiException as e:  # the pod still runs; the template is cleaned up on terminate
                log.warning("could not make template %s owned by its pod: %s %s", name, e.status, e.reason)
        handle = PodHandle(
            namespace=self.settings.namespace, pod=name, pod_uid=created.metadata.uid,
            template=name if template is not None else "",
            device_class=choice.device_class if choice else "",
            device_type=choice.device_type if choice else "cpu",
            device_fraction=choice.device_fraction if choice else 0.0,
            product=(choice.product or "") if choice else "",
            sharing=(choice.sharing or "") if choice else "",
            device_request=json.dumps(choice.to_json(), sort_keys=True) if choice else "",
            placement_device=launch.placement.device or "",
            launched_at=time.time(),
            partition_key=launch.partition_keys[0] if len(launch.partition_keys) == 1 else "",
        ).to_handle()
        if self.settings.queue_name:
            self._refuse_if_never_admitted(handle, where)
        return handle

    # -- Kueue ------------------------------------------------------------------------------------------
    def _workload(self, uid: str) -> WorkloadState | None:
        """Kueue's decision about the pod's Workload (:mod:`dagster_gpu.k8s.kueue`), remembered and logged when
        it changes; None before Kueue made the Workload."""
        wl = kueue.pod_workload(self.kube.pod_workloads(uid), uid)
        if wl is None:
            return None
        st = kueue.workload_state(wl)
        with self._lock:
            before = self._kueue.get(uid)
            self._kueue[uid] = st
        if before is None or (before.phase, before.reason, before.message) != (st.phase, st.reason, st.message):
            log.info("pod uid %s: %s", uid, st.describe())
        return st

    def _refuse_if_queue_unusable(self, name: str, where: str) -> None:
        """Raise RuntimeError (nothing created) when the LocalQueue does not exist or is not active: Kueue v0.17.0
        then leaves the pod's Workload without any condition (``pkg/cache/queue/manager.go``
        ``ErrLocalQueueDoesNotExistOrInactive``, retried by the workload reconciler), so it would wait forever."""
        queue = self.settings.queue_name
        lq = self.kube.read_local_queue(queue)
        if lq is None:
            raise RuntimeError(f"Kueue cannot admit pod {self.settings.namespace}/{name} for {where}: Kueue LocalQueue "
                               f"{self.settings.namespace}/{queue} does not exist (kubernetes.queue_name)")
        active = kueue.local_queue_inactive(lq)
        if active:
            raise RuntimeError(f"Kueue cannot admit pod {self.settings.namespace}/{name} for {where}: Kueue LocalQueue "
                               f"{self.settings.namespace}/{queue} is not active ({active})")

    def _refuse_if_never_admitted(self, handle: Handle, where: str) -> None:
        """Wait up to ``kueue_verdict_wait_s`` for Kueue's first decision about the new pod's Workload; when it
        can never be admitted (:attr:`~dagster_gpu.k8s.kueue.WorkloadState.never_fits`) delete the pod and
        raise RuntimeError with Kueue's reason, naming the LocalQueue and the partitions."""
        h = PodHandle.from_handle(handle)
        deadline = time.monotonic() + self.kueue_verdict_wait_s
        while True:
            st = self._workload(h.pod_uid)
            if st is not None and (st.reason or st.phase != kueue.PENDING):
                break
            if time.monotonic() >= deadline:
                return
            time.sleep(0.5)
        if st.never_fits:
            self.terminate(handle)
            raise RuntimeError(f"Kueue cannot admit pod {h.namespace}/{h.pod} for {where}: {st.describe()}")

    def _queued_state(self, handle: PodHandle, age: float) -> WorkerState:
        """A pod Kueue still gates: PENDING with Kueue's reason, or FAILED (abandoned) when Kueue can never
        admit it or it waited longer than ``queue_timeout_s``."""
        st = self._workload(handle.pod_uid)
        queue = self.settings.queue_name
        what = st.describe() if st is not None else f"Kueue LocalQueue {queue}: no Workload yet"
        if st is not None and st.never_fits:
            return WorkerState(WorkerStatus.FAILED, message=f"pod {handle.namespace}/{handle.pod}: {what}", abandoned=True)
        if age > self.queue_timeout_s:
            return WorkerState(WorkerStatus.FAILED, abandoned=True, message=(
                f"pod {handle.namespace}/{handle.pod} waited {age:.0f}s for Kueue LocalQueue {queue} to admit it "
                f"(> queue_timeout_seconds={self.queue_timeout_s:g}): {what}"))
        return WorkerState(WorkerStatus.PENDING, message=what)

    def _shared(self, launch: StepLaunch) -> bool:
        """Whether the step's claim may carry the sharing config: the placement's ``shared`` when the policy
        decided it, else (a forced or unplaced launch) whether no shared claim failed to prepare on its
        placement pool or on every pool (:meth:`SharingFailures.allows_sharing`)."""
        if launch.placement.shared is not None:
            return bool(launch.placement.shared)
        return self.sharing_failures.allows_sharing(launch.placement.device)

    def handle_metadata(self, handle: Handle) -> Mapping[str, str | int | float]:
        h = PodHandle.from_handle(handle)
        return {"k8s/namespace": h.namespace, "k8s/pod": h.pod, "k8s/resource_claim_template": h.template,
                "gpu/device_fraction": h.device_fraction}

    # -- state -----------------------------------------------------------------------------------------
    def state(self, handle: Handle) -> WorkerState:
        """See the module docstring. UNKNOWN on a transient API error (never changes a step's state). Only
        reads (and remembers a terminal state with the pod's end facts)."""
        self.claims.start()
        self.pods.start()
        h = PodHandle.from_handle(handle)
        with self._lock:
            final = self._final.get(h.pod_uid)
        if final is not None:
            return final["state"]
        try:
            return self._state(h)
        except ApiException as e:
            return WorkerState(WorkerStatus.UNKNOWN, message=f"Kubernetes API error {e.status} {e.reason}")
        except Exception as e:  # noqa: BLE001 - connection errors are transient for the health check
            return WorkerState(WorkerStatus.UNKNOWN, message=f"Kubernetes API unreachable: {type(e).__name__}: {e}")

    def _state(self, handle: PodHandle) -> WorkerState:
        name, uid = handle.pod, handle.pod_uid
        age = time.time() - handle.launched_at
        pod = self.kube.read_pod(name)
        if pod is None or pod.metadata.uid != uid:
            with self._lock:  # another thread may have just read its end, then the settler deleted it
                final = self._final.get(uid)
            if final is not None:
                return final["state"]
            preempted = self._preempted_before_read(name, uid)
            if preempted is not None:
                return self._remember(uid, WorkerState(WorkerStatus.PREEMPTED, message=(
                    f"pod {handle.namespace}/{name} was preempted ({preempted}) and is gone")), None)
            return WorkerState(WorkerStatus.FAILED, message=(
                f"pod {handle.namespace}/{name} (uid {uid}) does not exist (never created, or deleted outside the executor)"))
        body = m.to_dict(pod)
        if self.settings.queue_name and kueue.gated(body) and not pod.metadata.deletion_timestamp:
            st = self._queued_state(handle, age)
            return self._remember(uid, st, None) if st.status == WorkerStatus.FAILED else st
        if self.settings.queue_name and uid not in self._kueue_admitted():
            self._workload(uid)  # its admission (ClusterQueue, flavors), recorded for the bill
        events = self.kube.pod_events(name) if needs_events(body) else []
        verdict = pod_state(body, age, self.timeouts, events, now=time.time())
        if verdict.action == "finish":
            return self._remember(uid, verdict.state, self._end_facts(pod))
        if verdict.action == "give_up":
            st = verdict.state
            if verdict.cause == FAILED_PREPARE and handle.sharing:
                # the driver refuses this sharing config on the pool (its feature gate is off): the policy
                # stops choosing shared placements there (dagster_gpu.k8s.sharing_failures)
                self.sharing_failures.record(handle.placement_device or None,
                                             st.message.split("kubelet events: ", 1)[-1])
            return self._remember(uid, WorkerState(st.status, st.exit_code, st.message, abandoned=True), None)
        self._note_disruption(uid, body)
        if verdict.state.status == WorkerStatus.RUNNING and not pod.metadata.deletion_timestamp \
                and self.claims.get(uid) is None and handle.template:
            claim = self._claim_of(pod)  # fallback when the watch is behind
            if claim is not None:
                self.claims.record(claim)
        return verdict.state

    def _kueue_metadata(self, uid: str) -> dict[str, str]:
        """What Kueue decided about the pod, for its bill: ``kueue/local_queue``, ``kueue/cluster_queue``,
        ``kueue/flavors`` (``resource=flavor`` pairs); empty for a pod that was not queued."""
        with self._lock:
            st = self._kueue.get(uid)
        if st is None:
            return {}
        return {"kueue/local_queue": st.queue, "kueue/cluster_queue": st.cluster_queue or "",
                "kueue/flavors": ",".join(f"{r}={f}" for r, f in sorted(st.flavors.items()))}

    def _kueue_admitted(self) -> set[str]:
        with self._lock:
            return {u for u, st in self._kueue.items() if st.cluster_queue}

    def _note_disruption(self, uid: str, body: Mapping[str, Any]) -> None:
        """Remember the ``DisruptionTarget`` condition of a pod being deleted (read by :meth:`state` or the watch),
        for when the pod is gone before its end was read (:meth:`_preempted_before_read`)."""
        disrupted = disruption(body) if (body.get("metadata") or {}).get("deletionTimestamp") else None
        if disrupted is not None:
            with self._lock:
                self._disrupted.setdefault(uid, disrupted)

    def _remember_ended(self, pod, body: Mapping[str, Any]) -> None:
        """Remember an ended pod's terminal state and end facts, as :meth:`state` does when it reads the end."""
        self._remember(pod.metadata.uid, pod_state(body, 0.0, self.timeouts).state, self._end_facts(pod))

    def _observe(self, pod) -> None:
        """One version of a dagster-gpu pod from the watch: remember a disruption and, once the pod ended, its
        terminal state and end facts (as :meth:`state` would, had it read the pod then)."""
        body = m.to_dict(pod)
        self._note_disruption(pod.metadata.uid, body)
        with self._lock:
            known = pod.metadata.uid in self._final
        if not known and (body.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            self._remember_ended(pod, body)

    def _preempted_before_read(self, name: str, uid: str) -> str | None:
        """Why a pod that is gone was disrupted: its ``DisruptionTarget`` condition as this process saw it while
        the pod terminated, else kube-scheduler's ``Preempted`` event about it (events outlive the pod); None
        when neither says so (the pod was deleted outside the executor)."""
        with self._lock:
            seen = self._disrupted.get(uid)
        if seen is not None:
            return seen
        try:
            return preempted_event(self.kube.pod_events(name), uid)
        except ApiException:
            return None

    def _claim_of(self, pod) -> Any | None:
        name = m.generated_claim_name(pod)
        return self.kube.read_claim(name) if name else None

    def _end_facts(self, pod) -> dict[str, Any]:
        """What the bill of an ended pod needs, read now (the claim and the pod go away after it ends):
        the container's running interval, the generated claim, its allocated devices, the worker env."""
        cs = (pod.status.container_statuses or [None])[0]
        term = cs.state.terminated if cs is not None and cs.state is not None else None
        claim_name = m.generated_claim_name(pod) or ""
        seen = self.claims.get(pod.metadata.uid)
        if seen is None and claim_name:
            claim = self._claim_of(pod)
            if claim is not None:
                self.claims.record(claim)
            seen = self.claims.get(pod.metadata.uid)
        return {
            "started_at": _ts(term.started_at) if term is not None else None,
            "finished_at": _ts(term.finished_at) if term is not None else None,
            "resource_claim": claim_name,
            "allocated_devices": seen["devices"] if seen else [],
            "allocated_requests": seen.get("requests", []) if seen else [],
            "env": {e.name: e.value for e in (pod.spec.containers[0].env or []) if e.value is not None}
            if pod.spec.containers else {},
        }

    def _remember(self, uid: str, state: WorkerState, facts: dict[str, Any] | None) -> WorkerState:
        """Remember the first terminal state read for a pod (later readers get the same answer)."""
        with self._lock:
            final = self._final.setdefault(uid, {"state": state, "facts": facts})
        return final["state"]

    # -- accounting -------------------------------------------------------------------------------------
    def accounting(self, handle: Handle) -> UnitBill | None:
        """The ended pod's pod-interval bill (:func:`~dagster_gpu.k8s.billing.pod_interval_metadata`),
        read only: ``UnitBill.nothing`` for a pod that never ran (given up on, no interval) or that is gone
        without this process having read its end (another process settled it); None while it runs."""
        h = PodHandle.from_handle(handle)
        uid = h.pod_uid
        with self._lock:
            final = self._final.get(uid)
        if final is None:
            pod = self.kube.read_pod(h.pod)
            if pod is None or pod.metadata.uid != uid:
                return UnitBill.nothing(f"pod {h.pod} is gone")
            verdict = pod_state(m.to_dict(pod), 0.0, self.timeouts)
            if verdict.action != "finish":
                return None
            self._remember(uid, verdict.state, self._end_facts(pod))
            with self._lock:
                final = self._final[uid]
        facts = final["facts"]
        try:
            md = self._metadata(h, facts)
        except RateCardError as e:  # a rate table without this device and no default: nothing can be priced
            log.warning("pod %s is not billed: %s", h.pod, e)
            return UnitBill.nothing(str(e))
        if md is None:
            return UnitBill.nothing(f"pod {h.pod} never ran")
        return UnitBill(
            gpu_seconds=md[GPU_SECONDS],
            rate_usd_per_gpu_hour=md[RATE_USD_PER_GPU_HOUR],
            metadata={**{k: v for k, v in md.items() if k not in (GPU_SECONDS, COST_USD)},
                      "dagster_gpu/backend": "kubernetes", **self._kueue_metadata(uid)},
            match=("k8s/pod", h.pod),
            env=facts["env"],
        )

    def elect_bill_writer(self, handle: Handle) -> bool:
        """With ``delete_finished_pods``, the graceful delete of the ended pod with its UID precondition:
        True for the one process whose delete succeeded (it writes the bill). Without it, True once per
        process. The template goes with the pod (owner reference), the claim is released by the pod's end."""
        h = PodHandle.from_handle(handle)
        with self._lock:
            if h.pod_uid in self._released:
                return False
            self._released.add(h.pod_uid)
            final = self._final.get(h.pod_uid)
        mine = self.kube.delete_pod(h.pod, uid=h.pod_uid) if self.delete_finished_pods else True
        if not mine and final is not None and final["state"].status == WorkerStatus.PREEMPTED \
                and self.kube.read_pod(h.pod) is None:
            # a disruption's pod is deleted by the scheduler (eviction API, drain) and removed by its kubelet:
            # nobody's delete can succeed. Only a process that tracks the handle can know it ended (the
            # sweep lists live pods), and only the run's own worker tracks it: it writes the bill.
            mine = True
        log.info("pod %s released; deleted by this process: %s", h.pod, mine)
        return mine

    def unsettled(self) -> list[Handle]:
        """Ended dagster-gpu pods in the namespace, of any orchestrating process, that ended more than
        ``sweep_grace_s`` ago and that this process has not released (their own process may have exited
        first). Exactly one process bills each: :meth:`elect_bill_writer` decides."""
        if self.sweep_grace_s < 0:
            return []
        out = []
        now = time.time()
        for pod in self.kube.list_pods(f"{m.LABEL_MANAGED_BY}={m.MANAGED_BY}"):
            if pod.status.phase not in ("Succeeded", "Failed"):
                continue
            term = terminated(m.to_dict(pod))
            ended = epoch(term.get("finishedAt")) if term is not None else None
            if ended is not None and now - ended < self.sweep_grace_s:
                continue
            with self._lock:
                if pod.metadata.uid in self._released:
                    continue
            self._remember_ended(pod, m.to_dict(pod))
            out.append(m.handle_from_pod(pod).to_handle())
        return out

    # -- terminate ---------------------------------------------------------------------------------------
    def terminate(self, handle: Handle) -> None:
        """Graceful delete of the pod (its own grace period), its ResourceClaimTemplate and its claims.

        Claims are deleted too: the API server keeps an allocated claim until the pod released it, so this
        never takes a device from a running container. Idempotent; objects already gone are skipped.
        """
        h = PodHandle.from_handle(handle)
        name, uid = h.pod, h.pod_uid
        pod = self.kube.read_pod(name)
        claims = [s.resource_claim_name for s in (pod.status.resource_claim_statuses or [])
                  if s.resource_claim_name] if pod is not None and pod.metadata.uid == uid else []
        self.kube.delete_pod(name, uid=uid)
        if h.template:
            self.kube.delete_claim_template(h.template)
        for c in claims:
            self.kube.delete_claim(c)

    # -- post-run figures ---------------------------------------------------------------------------------
    def _metadata(self, handle: PodHandle, facts: Mapping[str, Any] | None) -> dict[str, Any] | None:
        if facts is None:
            return None
        return pod_interval_metadata(handle, facts["started_at"], facts["finished_at"], facts["resource_claim"],
                                     facts["allocated_devices"], self.rates, facts.get("allocated_requests", ()))
