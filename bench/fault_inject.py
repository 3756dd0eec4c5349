"""The fault injector of bench/faults.py: fires each planned fault (bench/fault_plan.py) against the real,
shared services, brings every service it touched back up, and records what it did.

Each planned fault gets its own thread that sleeps until its moment; the acts themselves (a restart, a kill,
a submission) are serialized by one lock, so two restarts never overlap and each outage is attributable.
A fault whose moment comes after the backfill ended is recorded as not injected. A fault that needs
something to hit (a running step worker, two running array tasks) waits for it while the backfill runs.

Services are driven through their scripts' subcommands: ``resources/slurm/cluster.sh restart-slurmctld |
stop-slurmdbd | start-slurmdbd``, ``resources/k8s/cluster.sh restart-apiserver | restart-etcd``,
``resources/postgres/postgres.sh restart``; each script's output goes to ``<log_dir>/<fault>.log``. When an
act fails, the service's ``start`` (idempotent) is run so no service is left down.

The two Kubernetes run faults (``image_pull_fail``, ``dra_prepare_fail``) change no service: each picks the newest
run still QUEUED (the farthest from being dequeued, so its worker reads what the fault wrote), adds run tags
that force its step onto Kubernetes, and writes that run's overrides to the ``FAULTS_STATE`` file
(bench/fault_state.py) that the pipeline's step handler re-reads at every launch. The fault lasts until the
run ended; then its overrides are removed (the fault is over: a rerun gets the real settings) and the
injector waits for the run's pods to be gone. The node agent (resources/k8s/node_agent.py) answers as a
kubelet and the NVIDIA DRA driver do:

* a missing image (it matches the agent's ``--missing-image-regex``, default ``does-not-exist``): Warning
  ``Failed`` "Failed to pull image ...: ... not found", waiting ``ErrImagePull``, then ``ImagePullBackOff``
  with the back-off doubling from 10 s to 300 s (kubernetes/kubernetes v1.34 ``pkg/kubelet/images/
  image_manager.go`` ``EnsureImageExists`` and ``pkg/kubelet/images/types.go`` ``ErrImagePullBackOff``;
  ``pkg/kubelet/kubelet.go`` ``flowcontrol.NewBackOff(backOffPeriod, MaxContainerBackOff)``);
* a claim with a ``GpuConfig`` whose ``sharing.strategy`` is TimeSlicing while the driver's
  ``TimeSlicingSettings`` gate is off (NVIDIA/k8s-dra-driver-gpu v25.12.0 ``pkg/featuregates/
  featuregates.go``: alpha, off by default; ``api/nvidia.com/resource/v1beta1/sharing.go``: "invalid GPU
  sharing settings"): NodePrepareResources fails, Warning ``FailedPrepareDynamicResources`` and the pod stays
  ContainerCreating (``pkg/kubelet/cm/dra/manager.go``, kuberuntime_manager.go ``SyncPod``).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

from fault_plan import PREEMPTED_TASKS, SLURMDBD_DOWN_S, PlannedFault
from fault_state import clear_run_override, set_run_override

REPO = Path(__file__).resolve().parents[1]
SLURM_SH = REPO / "resources" / "slurm" / "cluster.sh"
K8S_SH = REPO / "resources" / "k8s" / "cluster.sh"
PG_SH = REPO / "resources" / "postgres" / "postgres.sh"
#: the image of ``image_pull_fail``: a tag nobody pushed (the node agent's registry does not have it)
MISSING_IMAGE = "registry.example.com/ml/dagster-gpu:2026.12-does-not-exist"
#: run tags of the run faults (dagster_gpu.core.request: run tags named dagster-gpu/* override the step's request)
RUN_FAULT_TAGS = {
    "image_pull_fail": {"dagster-gpu/backend": "kubernetes"},
    "dra_prepare_fail": {"dagster-gpu/backend": "kubernetes", "dagster-gpu/shared-ok": "true"},
}
#: the per-run ``kubernetes`` overrides of the run faults (bench/fault_state.py)
RUN_FAULT_OVERRIDES = {
    "image_pull_fail": {"image": MISSING_IMAGE},
    "dra_prepare_fail": {"sharing_strategy": "TimeSlicing"},
}
RUN_FAULT_TIMEOUT_S = 1800.0
#: ``k8s_preempt``: the run's step goes to Kubernetes at the recommended batch PriorityClass
#: (resources/k8s/manifests/50-batch-priorityclass.yaml) with 40 of the node's 64 CPUs, and may be launched again
#: after up to 3 preemptions; the online pod that preempts it holds its 40 CPUs for ONLINE_POD_S seconds
PREEMPT_TAGS = {"dagster-gpu/backend": "kubernetes"}
PREEMPT_OVERRIDES = {"priority_class_name": "dagster-gpu-batch", "cpu_request": "40", "max_preemptions": 3}
ONLINE_POD_S = 8
#: ``kueue_reclaim``: the run's step goes to Kubernetes asking for one MIG 1g.10gb slice (run tags override the
#: step's request: dagster_gpu.core.request) as a Kueue workload of LocalQueue ``batch``, which only borrows
KUEUE_TAGS = {"dagster-gpu/backend": "kubernetes", "dagster-gpu/mig-ok": "true", "dagster-gpu/gpu-memory-gib": "9"}
KUEUE_OVERRIDES = {"queue_name": "batch", "max_preemptions": 3}
_ENDED = ("SUCCESS", "FAILURE", "CANCELED")


def _run_pods(core, run_id: str) -> list:
    """The step pods of run ``run_id`` (``core``: a CoreV1Api as the executor); [] while the apiserver restarts."""
    from dagster_gpu.k8s.manifests import run_selector
    from tests.k8s_helpers import NAMESPACE

    try:
        return core.list_namespaced_pod(NAMESPACE, label_selector=run_selector(run_id)).items
    except Exception:  # noqa: BLE001 - apiserver restarting: look again
        return []


@dataclass
class InjectContext:
    """What the injector needs from the driver.

    Attributes:
        t0: ``time.time()`` of the backfill's submission (fault moments count from it).
        log_dir: where each act's script output goes.
        slurm: a ``dagster_gpu.slurm.client.SlurmClient`` for the cluster.
        our_array_job_ids: the job arrays of this benchmark (from its spool); may raise.
        our_run_ids: run ids of this benchmark's instance; may raise (PostgreSQL down): retried.
        restart_daemon: SIGKILLs dagster-daemon and blocks until a new one runs; returns its pid.
        active: set while the backfill runs (faults fire only then).
        say: progress logger.
        seed: makes each fault's choices (which worker) reproducible.
    """

    t0: float
    log_dir: Path
    slurm: object
    our_array_job_ids: Callable[[], list[int]]
    our_run_ids: Callable[[], set[str]]
    restart_daemon: Callable[[], int]
    active: threading.Event
    say: Callable[[str], None]
    seed: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    #: the run faults': newest-first ids of the backfill's QUEUED runs; add tags to a run; a run's status
    #: name (e.g. ``FAILURE``); names of the pods labelled with a run; the FAULTS_STATE file
    queued_run_ids: Callable[[], list[str]] | None = None
    add_run_tags: Callable[[str, dict], None] | None = None
    run_status: Callable[[str], str] | None = None
    pods_of_run: Callable[[str], list[str]] | None = None
    state_file: Path | None = None


class Injector:
    """Fires ``plan`` (see module doc); ``records`` holds one dict per planned fault once it is done:
    ``fault``, ``at_s`` (seconds after submission it fired, None if not), ``outage_s`` (until the component
    answered again), ``back_at`` (epoch seconds of that), ``injected`` (bool), ``detail``, ``error``."""

    def __init__(self, ctx: InjectContext, plan: list[PlannedFault]):
        self.ctx = ctx
        self.plan = plan
        self.records: list[dict] = []
        self._lock = threading.Lock()  # one act at a time
        self._rec_lock = threading.Lock()
        self._targeted: set[str] = set()  # runs a run fault already took
        self._threads = [threading.Thread(target=self._run, args=(f,), name=f"fault-{f.label}", daemon=True) for f in plan]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def join(self, timeout_s: float = 600.0) -> None:
        """Wait for every fault thread (a slurmdbd outage in progress runs to its end and is undone)."""
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.1, deadline - time.monotonic()))

    def abort(self) -> None:
        """Stop waiting for moments and targets (an outage in progress is still undone)."""
        self.ctx.stop.set()

    # ------------------------------------------------------------------------------------------------
    def _run(self, f: PlannedFault) -> None:
        ctx = self.ctx
        rec: dict = {"fault": f.label, "planned_at_s": f.at_s, "at_s": None, "outage_s": None, "back_at": None,
                     "injected": False, "detail": "", "error": None}
        try:
            if ctx.stop.wait(max(0.0, ctx.t0 + f.at_s - time.time())) or not ctx.active.is_set():
                rec["detail"] = "not injected: the backfill had ended before its moment"
                return
            getattr(self, f"_{f.name}")(f, rec)
        except Exception as e:  # noqa: BLE001 - recorded; the benchmark goes on
            rec["error"] = f"{type(e).__name__}: {e}"
            ctx.say(f"fault {f.label}: ERROR {rec['error']}")
        finally:
            with self._rec_lock:
                self.records.append(rec)

    def _fired(self, rec: dict) -> float:
        now = time.time()
        rec["at_s"] = round(now - self.ctx.t0, 1)
        rec["injected"] = True
        return now

    def _back(self, rec: dict, fired: float) -> None:
        rec["back_at"] = time.time()
        rec["outage_s"] = round(rec["back_at"] - fired, 1)
        self.ctx.say(f"fault {rec['fault']}: injected at {rec['at_s']} s, back after {rec['outage_s']} s; {rec['detail']}")

    def _script(self, rec: dict, script: Path, *args: str, restore: tuple[str, ...] = ("start",)) -> None:
        """Run ``script args`` (output appended to the fault's log); on failure run ``script restore`` so
        the service is up again, then raise with the log's path."""
        log = self.ctx.log_dir / f"{rec['fault']}.log"
        with open(log, "ab") as out:
            cp = subprocess.run(["bash", str(script), *args], stdout=out, stderr=subprocess.STDOUT, timeout=300)
            if cp.returncode != 0:
                subprocess.run(["bash", str(script), *restore], stdout=out, stderr=subprocess.STDOUT, timeout=600)
                raise RuntimeError(f"{script.name} {' '.join(args)} exited {cp.returncode} (log {log}); ran '{' '.join(restore)}'")

    # ------------------------------------------------------------------------------------- the faults
    def _slurmctld_restart(self, f: PlannedFault, rec: dict) -> None:
        with self._lock:
            fired = self._fired(rec)
            self._script(rec, SLURM_SH, "restart-slurmctld")
            rec["detail"] = "slurmctld stopped and started; scontrol ping UP again"
            self._back(rec, fired)

    def _slurmdbd_down(self, f: PlannedFault, rec: dict) -> None:
        with self._lock:
            fired = self._fired(rec)
            self._script(rec, SLURM_SH, "stop-slurmdbd")
        try:
            time.sleep(3)
            cp = subprocess.run(["sacct", "--noheader", "-X", "-j", "1", "--format=JobID"], capture_output=True, text=True,
                                env=self.ctx.slurm.env(), timeout=60)  # fmt: skip
            said = (cp.stderr.strip() or cp.stdout.strip()).splitlines()
            rec["detail"] = f"slurmdbd down {SLURMDBD_DOWN_S:.0f} s; sacct meanwhile: exit {cp.returncode}, {said[0] if said else '(no output)'!r}"
            time.sleep(max(0.0, fired + SLURMDBD_DOWN_S - time.time()))
        finally:
            with self._lock:
                self._script(rec, SLURM_SH, "start-slurmdbd")
        self._back(rec, fired)

    def _apiserver_restart(self, f: PlannedFault, rec: dict) -> None:
        with self._lock:
            fired = self._fired(rec)
            self._script(rec, K8S_SH, "restart-apiserver")
            rec["detail"] = "kube-apiserver stopped and started; /readyz ok again"
            self._back(rec, fired)

    def _etcd_restart(self, f: PlannedFault, rec: dict) -> None:
        with self._lock:
            fired = self._fired(rec)
            self._script(rec, K8S_SH, "restart-etcd")
            deadline = time.monotonic() + 120
            while subprocess.run(["bash", str(K8S_SH), "status"], capture_output=True).returncode != 0:
                if time.monotonic() > deadline:
                    raise RuntimeError("the apiserver was not ready 120 s after etcd restarted")
                time.sleep(0.5)
            rec["detail"] = "etcd stopped and started (data kept); apiserver /readyz ok again"
            self._back(rec, fired)

    def _postgres_restart(self, f: PlannedFault, rec: dict) -> None:
        with self._lock:
            fired = self._fired(rec)
            self._script(rec, PG_SH, "restart")
            rec["detail"] = "pg_ctl restart -m fast: every connection dropped"
            self._back(rec, fired)

    def _daemon_restart(self, f: PlannedFault, rec: dict) -> None:
        with self._lock:
            fired = self._fired(rec)
            pid = self.ctx.restart_daemon()
            rec["detail"] = f"dagster-daemon SIGKILLed; new daemon pid {pid}"
            self._back(rec, fired)

    def _worker_sigkill(self, f: PlannedFault, rec: dict) -> None:
        rng = random.Random(self.ctx.seed * 1000 + f.index)
        while True:
            victims = self._workers()
            settled = [v for v in victims if v["age_s"] >= 15]  # past its model load: mid-range
            pick = settled or victims
            if pick:
                with self._lock:
                    v = rng.choice(sorted(pick, key=lambda v: v["pid"]))
                    fired = self._fired(rec)
                    try:
                        os.kill(v["pid"], signal.SIGKILL)
                    except ProcessLookupError:
                        rec["injected"] = False
                        continue
                    rec["detail"] = (f"SIGKILL pid {v['pid']} ({v['backend']} step worker of run {v['run_id'][:8]}, "
                                     f"{v['age_s']:.0f} s old)")
                    rec["victim"] = v
                    self._back(rec, fired)
                    return
            if not self._wait_more(2.0):
                rec["detail"] = "not injected: no running step worker while the backfill ran"
                return

    def _slurm_preempt(self, f: PlannedFault, rec: dict) -> None:
        client = self.ctx.slurm
        while True:
            running = self._running_tasks()
            if len(running) >= PREEMPTED_TASKS:
                with self._lock:
                    total = client.gpus_in_partition(None)
                    busy, _pending = client.gpu_queue(None)
                    need = min(total, max(0, total - busy) + PREEMPTED_TASKS)
                    fired = self._fired(rec)
                    cp = client.run(["sbatch", "--parsable", "--account=research", "--qos=high", f"--gres=gpu:{need}",
                                     "--job-name=faults-preemptor", "--output=/dev/null", "--wrap=sleep 20"], attempts=6)
                    job = int(cp.stdout.strip().split(";")[0])
                    rec["preemptor_job_id"] = job
                    rec["running_before"] = running
                    rec["detail"] = (f"high-QOS job {job} asked for {need} of {total} GPUs ({busy} busy) while "
                                     f"{len(running)} of our array tasks ran")
                # the preemption is over when the preemptor has run and left the queue
                deadline = time.monotonic() + 600
                while time.monotonic() < deadline:
                    rows = [r for r in client.squeue([job]) if not r.state.final]
                    if not rows:
                        break
                    time.sleep(2)
                self._back(rec, fired)
                return
            if not self._wait_more(2.0):
                rec["detail"] = f"not injected: never {PREEMPTED_TASKS} running array tasks while the backfill ran"
                return

    def _image_pull_fail(self, f: PlannedFault, rec: dict) -> None:
        self._run_fault(f, rec)

    def _dra_prepare_fail(self, f: PlannedFault, rec: dict) -> None:
        self._run_fault(f, rec)

    def _run_fault(self, f: PlannedFault, rec: dict) -> None:
        """Aim fault ``f.name`` at the newest QUEUED run (see the module doc); the outage lasts until that
        run ended and its overrides were removed; ``pods_gone_s``: from then until it had no pod left."""
        tags, overrides = RUN_FAULT_TAGS[f.name], RUN_FAULT_OVERRIDES[f.name]
        taken = self._take_queued_run(rec, tags, overrides)
        if taken is None:
            return
        run_id, fired = taken
        self._end_run_fault(rec, run_id, fired, tags, overrides)

    def _k8s_preempt(self, f: PlannedFault, rec: dict) -> None:
        """Force the newest QUEUED run onto Kubernetes at the batch PriorityClass with a 40-CPU request; once its
        step pod runs, create an online pod of a higher class asking 40 more of the node's 64 CPUs
        (tests/test_k8s_preemption_e2e.py's scenario): kube-scheduler's DefaultPreemption evicts the step pod,
        the only pod whose eviction frees enough. Records the victim, its ``DisruptionTarget`` reason when read
        in time, the online pod; the outage lasts until the run ended."""
        from kubernetes import client

        from tests.k8s_helpers import admin_api, executor_api
        from tests.test_k8s_preemption_e2e import _ensure_online_class, _online_pod

        taken = self._take_queued_run(rec, PREEMPT_TAGS, PREEMPT_OVERRIDES)
        if taken is None:
            return
        run_id, taken_at = taken
        _ensure_online_class()
        core, admin = client.CoreV1Api(executor_api()), client.CoreV1Api(admin_api())

        def pods():
            return _run_pods(core, run_id)

        victim = self._running_pod(rec, run_id, taken_at, pods, PREEMPT_TAGS, PREEMPT_OVERRIDES)
        if victim is None:
            return
        online = f"faults-online-{int(time.time())}"
        with self._lock:
            fired = self._fired(rec)
            admin.create_namespaced_pod("default", _online_pod(online, ONLINE_POD_S))
        rec.update(victim_pod=victim.metadata.name, online_pod=online)
        self.ctx.say(f"fault {rec['fault']}: online pod {online} (40 CPUs, higher PriorityClass) created while step pod "
                     f"{victim.metadata.name} of run {run_id[:8]} runs")
        reason, until = None, time.monotonic() + 120
        while reason is None and time.monotonic() < until:
            mine = next((p for p in pods() if p.metadata.uid == victim.metadata.uid), None)
            if mine is None:
                reason = "gone before its condition was read"
                break
            cond = next((c for c in mine.status.conditions or [] if c.type == "DisruptionTarget"), None)
            reason = cond.reason if cond is not None else None
            time.sleep(0.2)
        rec["disruption"] = reason
        self._end_run_fault(rec, run_id, fired, PREEMPT_TAGS, PREEMPT_OVERRIDES)
        try:
            admin.delete_namespaced_pod(online, "default", grace_period_seconds=0)
        except client.ApiException:
            pass  # gone already (it sleeps ONLINE_POD_S and exits)
        rec["detail"] = (f"step pod {victim.metadata.name} of run {run_id[:8]} (batch class, 40 CPUs) preempted for online "
                         f"pod {online}: DisruptionTarget {reason}; {rec['detail']}")

    def _running_pod(self, rec: dict, run_id: str, taken_at: float, pods: Callable[[], list], tags: dict,
                     overrides: dict):
        """The first Running pod of ``pods()`` (the taken run's), waited for while the run has not ended; None
        (the fault recorded as over, its run left to end) when it ended first."""
        deadline = time.monotonic() + RUN_FAULT_TIMEOUT_S
        while time.monotonic() < deadline and self._status(run_id) not in _ENDED:
            victim = next((p for p in pods() if p.status.phase == "Running"), None)
            if victim is not None:
                return victim
            time.sleep(1)
        rec["detail"] = f"run {run_id[:8]} taken, but its step pod never ran before it ended"
        self._end_run_fault(rec, run_id, taken_at, tags, overrides)
        return None

    def _kueue_reclaim(self, f: PlannedFault, rec: dict) -> None:
        """Make the newest QUEUED run's step a Kueue workload of LocalQueue ``batch`` asking for one MIG 1g.10gb
        slice (:data:`KUEUE_TAGS`, :data:`KUEUE_OVERRIDES`): ``batch`` has no quota and borrows ``online``'s
        idle slices (resources/k8s/kueue/example/mixed-cluster.yaml, applied first). Once its pod runs, an
        online pod asking for both slices arrives in LocalQueue ``online`` (tests/test_kueue_e2e.py's scenario):
        Kueue v0.17.0 evicts the borrower to admit it (``pkg/scheduler/preemption/preemption.go``, reclamation
        within the cohort) and the executor launches the unit again through the queue. Records the victim, its
        Workload's ``Evicted``/``Preempted`` reasons, the online pod and ``online_wait_s`` (created -> its
        Workload admitted); the outage lasts until the run ended."""
        from kubernetes import client

        from tests.k8s_helpers import NAMESPACE, admin_api, executor_api
        from tests.test_kueue_e2e import _apply_example, _cond, _online_objects, _workload_of

        _apply_example()
        taken = self._take_queued_run(rec, KUEUE_TAGS, KUEUE_OVERRIDES)
        if taken is None:
            return
        run_id, taken_at = taken
        core, admin = client.CoreV1Api(executor_api()), client.CoreV1Api(admin_api())
        custom, resource = client.CustomObjectsApi(admin_api()), client.ResourceV1Api(admin_api())

        def pods():
            return _run_pods(core, run_id)

        def workload(uid: str) -> dict | None:
            try:
                return _workload_of(custom, uid)
            except Exception:  # noqa: BLE001 - apiserver restarting: look again
                return None

        victim = self._running_pod(rec, run_id, taken_at, pods, KUEUE_TAGS, KUEUE_OVERRIDES)
        if victim is None:
            return
        online = f"faults-kueue-online-{int(time.time())}"
        template, pod = _online_objects(online)
        with self._lock:
            resource.create_namespaced_resource_claim_template(NAMESPACE, template)
            self._fired(rec)
            t0 = time.monotonic()
            created = admin.create_namespaced_pod(NAMESPACE, pod)
        rec.update(victim_pod=victim.metadata.name, online_pod=online)
        self.ctx.say(f"fault {rec['fault']}: online pod {online} (both MIG slices, LocalQueue online) created while "
                     f"step pod {victim.metadata.name} of run {run_id[:8]} runs on borrowed quota")
        admitted, evicted, until = None, {}, time.monotonic() + 120
        while time.monotonic() < until and (admitted is None or not evicted):
            if admitted is None and (_cond(workload(created.metadata.uid), "Admitted") or {}).get("status") == "True":
                admitted = round(time.monotonic() - t0, 2)
            wl = workload(victim.metadata.uid)
            ev, pre = _cond(wl, "Evicted") or {}, _cond(wl, "Preempted") or {}
            if ev.get("status") == "True":
                evicted = {"evicted": ev.get("reason"), "preempted": pre.get("reason")}
            time.sleep(0.2)
        rec["online_wait_s"] = admitted
        rec["disruption"] = f"{evicted.get('evicted')}/{evicted.get('preempted')}" if evicted else None
        self._end_run_fault(rec, run_id, taken_at, KUEUE_TAGS, KUEUE_OVERRIDES)
        for fn in (lambda: admin.delete_namespaced_pod(online, NAMESPACE, grace_period_seconds=0),
                   lambda: resource.delete_namespaced_resource_claim_template(online, NAMESPACE)):
            try:
                fn()
            except client.ApiException:
                pass  # gone already (the online pod sleeps 8 s and exits)
        rec["detail"] = (f"step pod {victim.metadata.name} of run {run_id[:8]} (LocalQueue batch, borrowing) evicted by "
                         f"Kueue for online pod {online}: {rec['disruption']}, the online workload admitted after "
                         f"{admitted} s; {rec['detail']}")

    def _take_queued_run(self, rec: dict, tags: dict, overrides: dict) -> tuple[str, float] | None:
        """Take the newest QUEUED run no fault took yet: write its overrides, add its tags; (run id, when) or None
        when no run was queued while the backfill ran."""
        ctx = self.ctx
        while True:
            try:
                queued = [r for r in ctx.queued_run_ids() if r not in self._targeted]
            except Exception:  # noqa: BLE001 - PostgreSQL restarting: try again
                queued = []
            if queued:
                with self._lock:
                    run_id = queued[0]
                    self._targeted.add(run_id)
                    fired = self._fired(rec)
                    set_run_override(ctx.state_file, run_id, overrides)
                    ctx.add_run_tags(run_id, tags)
                    rec.update(run_id=run_id, tags=tags, overrides=overrides)
                    ctx.say(f"fault {rec['fault']}: run {run_id[:8]} (queued) tagged {tags}, overrides {overrides}")
                return run_id, fired
            if not self._wait_more(2.0):
                rec["detail"] = "not injected: no queued run while the backfill ran"
                return None

    def _status(self, run_id: str) -> str:
        """The run's status name, "" while PostgreSQL does not answer."""
        try:
            return self.ctx.run_status(run_id)
        except Exception:  # noqa: BLE001 - PostgreSQL restarting
            return ""

    def _end_run_fault(self, rec: dict, run_id: str, fired: float, tags: dict, overrides: dict) -> None:
        """Wait for ``run_id`` to end, remove its overrides and wait for its pods to be gone; the outage ends
        when the run did."""
        ctx = self.ctx
        deadline = time.monotonic() + RUN_FAULT_TIMEOUT_S
        status = ""
        while time.monotonic() < deadline:
            status = self._status(run_id)
            if status in _ENDED:
                break
            time.sleep(2)
        clear_run_override(ctx.state_file, run_id)
        ended = time.time()
        pods: list[str] = []
        while time.time() - ended < 120:
            try:
                pods = ctx.pods_of_run(run_id)
            except Exception:  # noqa: BLE001 - apiserver restarting
                pods = ["?"]
            if not pods:
                break
            time.sleep(2)
        rec["run_status"] = status or "unknown"
        rec["pods_gone_s"] = None if pods else round(time.time() - ended, 1)
        gone = f"its pods gone {rec['pods_gone_s']} s later" if not pods else f"pods left after 120 s: {pods}"
        rec["detail"] = (f"run {run_id[:8]} (queued) tagged {', '.join(f'{k}={v}' for k, v in tags.items())}, "
                         f"{', '.join(f'{k}: {v}' for k, v in overrides.items())}; it ended {rec['run_status']}, "
                         f"the override was removed; {gone}")
        rec["back_at"], rec["outage_s"] = ended, round(ended - fired, 1)
        ctx.say(f"fault {rec['fault']}: injected at {rec['at_s']} s, over after {rec['outage_s']} s; {rec['detail']}")

    # ------------------------------------------------------------------------------------- targets
    def _wait_more(self, s: float) -> bool:
        return not self.ctx.stop.wait(s) and self.ctx.active.is_set()

    def _workers(self) -> list[dict]:
        """Running step workers of this benchmark's runs (Slurm tasks and the node agent's pods both run here)."""
        from dagster_gpu.instance.step_args import step_args_from_env

        try:
            ours = self.ctx.our_run_ids()
        except Exception:  # noqa: BLE001 - PostgreSQL restarting: try again on the next poll
            return []
        out = []
        for p in psutil.process_iter(["cmdline", "create_time"]):
            cmd = p.info.get("cmdline") or []
            if "execute_step" not in cmd:
                continue
            try:
                env = p.environ()
            except (psutil.AccessDenied, psutil.NoSuchProcess):
                continue
            args = step_args_from_env(env)
            if args is None or args.run_id not in ours or args.run_id in self._targeted:
                continue  # a run a run fault took is left to that fault, so each outcome has one cause
            backend = "slurm" if env.get("SLURM_JOB_ID") else "kubernetes"
            out.append({"pid": p.pid, "run_id": args.run_id, "backend": backend,
                        "age_s": round(time.time() - p.info["create_time"], 1)})
        return out

    def _running_tasks(self) -> list[str]:
        try:
            ids = self.ctx.our_array_job_ids()
            rows = self.ctx.slurm.squeue(ids) if ids else []
        except Exception:  # noqa: BLE001 - slurmctld restarting: try again
            return []
        return sorted(r.id.raw for r in rows if r.state.name == "RUNNING")
