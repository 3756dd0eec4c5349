"""Array coalescing: step launches that arrive within a window become tasks of one job array.

A backfill makes one Dagster run per partition, and each run's executor launches its step from its own
process. Each launch writes a request into the shared :class:`~dagster_gpu.slurm.spool.Spool` and waits.
Whichever waiting process takes the spool lock once the window rule (:mod:`dagster_gpu.slurm.window`:
a quiet gap and a longest wait, with holds while the backfill is still starting runs or our earlier
arrays still have a backlog of pending tasks) says a group of launches with identical sbatch options is
due submits that group: chunked so indices
stay below the controller's MaxArraySize (and ``max_tasks_per_array``), one
``sbatch --array=0-(n-1)%T`` per chunk whose task ``i`` runs request ``i`` through the manifest
(:mod:`dagster_gpu.slurm.script`). It then writes a result per request (array job id + task id, or the
rejection). No daemon is needed: processes that wait are the submitters; a crash of one is covered by
the others (the lock is released by the kernel).

Works across processes on one host, and across hosts when the spool is on a shared file system with
``flock`` (the manifest must be readable from compute nodes anyway).

Trust (``docs/security.md``): pending launches and results are acted on only when this user owns them
and nobody else can write them (so in a group-shared spool each user submits only their own launches);
the job script is rewritten atomically and verified (owner, mode, SHA-256) right before ``sbatch``
reads it; the array's tasks get the batch id and the manifest's SHA-256 as arguments and refuse a
manifest that does not match; ``sbatch`` runs with ``SLURM_UMASK=0077`` so the tasks' logs are 0600.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from dagster_gpu.contracts import describe_partitions
from dagster_gpu.core.jsonfile import write_atomic
from dagster_gpu.slurm import trust
from dagster_gpu.slurm.client import SlurmAccessRefused, SlurmClient, SlurmError, SlurmRejected
from dagster_gpu.slurm.ids import format_array_spec
from dagster_gpu.slurm.script import (
    JOB_SCRIPT,
    RUNNER,
    manifest_sha256,
    verify_job_script,
    write_job_script,
    write_manifest,
)
from dagster_gpu.slurm.spool import Spool, write_json
from dagster_gpu.slurm.transport import TransportError, TransportUnreachable
from dagster_gpu.slurm.trust import UntrustedPathError
from dagster_gpu.slurm.window import FlushDecision, WindowRule, decide_flush

log = logging.getLogger(__name__)


def steps_covered(units: Sequence[Sequence[str]]) -> str:
    """What the steps of one submission cover, for messages: each step's partition keys as
    :func:`~dagster_gpu.contracts.describe_partitions` words them, comma-separated, e.g.
    ``partition 'a', 3 partitions 'b'…'d', unpartitioned run``."""
    return ", ".join(describe_partitions(keys) for keys in units)


def _keys(doc: Mapping) -> tuple[str, ...]:
    """The partition keys of a pending launch (its JSON document)."""
    return tuple(doc.get("partition_keys") or ())


def group_key(options: Sequence[str], throttle: int) -> str:
    """Launches join one job array only when this key (their sbatch options and throttle) is equal."""
    return json.dumps([list(options), throttle])


class SubmissionRejected(RuntimeError):
    """Slurm refused (or could not be asked for) the job array carrying these launches.

    Attributes:
        partitions: the partition keys of every step the rejected submission carried (a ranged step's whole
            range), in the order of the steps.
        slurm_message: Slurm's reason.
    """

    def __init__(self, message: str, partitions: Sequence[str] = (), slurm_message: str = ""):
        super().__init__(message)
        self.partitions = list(partitions)
        self.slurm_message = slurm_message


class CoalescerTimeout(TimeoutError):
    """A launch got no array task assignment within ``max_wait_s``."""


@dataclass(frozen=True)
class TaskRequest:
    """One step launch waiting for an array task.

    Attributes:
        options: complete sbatch argv items shared by every task of the array (``--gres=gpu:1``,
            ``--account=research``…). Launches join the same array only when these and ``throttle`` match.
        throttle: the array's ``%T`` (0 = none).
        argv, env: the worker command and its environment (manifest data, never script text).
        run_id, step_key, attempt: for logs, errors and reconciliation.
        partition_keys: every partition key the launched unit embeds (a ranged run's range; one key; ``()`` for
            an unpartitioned run), for messages and the window rule's count of partitions.
        launches_to_come: more launches the run's backfill is about to make (None: not a backfill);
            see :mod:`dagster_gpu.executor.backfill_hint`.
        requeue_module: what a requeued attempt of the task runs first (``<worker python> -m <module> <step
            key> -- <argv...>``, :mod:`dagster_gpu.slurm.script`); None: a requeued attempt runs ``argv`` as is.
    """

    options: tuple[str, ...]
    throttle: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    run_id: str
    step_key: str
    partition_keys: tuple[str, ...] = ()
    attempt: int = 0
    launches_to_come: int | None = None
    requeue_module: str | None = None
    launch_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: float = field(default_factory=time.time)


@dataclass(frozen=True)
class ObjectStore:
    """Where the array tasks' files go when the compute nodes share no file system with this host (``transport:
    rest`` with ``relay_url``), and the functions that put them there (the Slurm backend passes those of
    :mod:`dagster_gpu.relay.objects` and :mod:`dagster_gpu.slurm.object_runner`: the store's I/O is on the
    instance layer, above this one).

    Attributes:
        url: ``relay_url`` without a trailing slash (``s3://bucket/prefix``).
        storage_options: fsspec options for it (no credentials: checked by the settings).
        put_new: ``(url, bytes) -> sha256 hex`` of what the store gives back; raises FileExistsError for an
            existing object (never overwritten), OSError.
        job_script: ``() -> text`` of the constant job script that carries the task runner.
        log_prefix: ``(batch prefix URL, task id) -> URL`` where the task ships its log.
    """

    url: str
    storage_options: Mapping
    put_new: Callable[[str, bytes], str]
    job_script: Callable[[], str]
    log_prefix: Callable[[str, int], str]


@dataclass(frozen=True)
class TaskAssignment:
    """Where a launch went: array task ``array_job_id``_``array_task_id`` of ``batch``."""

    array_job_id: int
    array_task_id: int
    batch: str
    submitted_at: float
    tasks_in_array: int
    log_file: str
    cluster: str | None = None  # the cluster sbatch named (``123;gpu2``); later Slurm commands pass ``-M`` it


#: Why nothing is submitted where job arrays are disabled (each step runs as one array task).
ARRAYS_DISABLED = (
    "job arrays are disabled on this cluster (scontrol show config: MaxArraySize=0) and the slurm backend runs "
    "each step as a job array task; the site must set MaxArraySize in slurm.conf to at least the tasks per array "
    "(e.g. MaxArraySize=1001, the default) and restart slurmctld, or use another backend"
)


class ArrayCoalescer:
    """Joins launches into job arrays (see module doc).

    Args:
        spool: the shared spool.
        client: the Slurm client used for ``sbatch`` and ``scontrol show config``.
        python: interpreter that array tasks run ``dagster_gpu.slurm.script`` with.
        rule: the coalescing window (:class:`~dagster_gpu.slurm.window.WindowRule`, seconds).
        max_wait_s: how long a launch waits for its assignment before CoalescerTimeout.
        lock_wait_s: how long a launch past ``max_wait_s`` waits for the spool lock to withdraw its request (a
            submitter holding the lock may be submitting it; the rest transport's submitter may hold it while it
            waits for a renewed token). Raises SpoolLockTimeout after it.
        max_tasks_per_array: cap on tasks per sbatch (None: only MaxArraySize limits).
        max_array_size: callable returning the controller's MaxArraySize (cached by the caller).
        pending_tasks: callable returning pending task counts by array job id from a recent poll, or
            None when unknown (then no launch is held for backlog).
        env_files: ``KEY=VALUE`` secret files (0600) the tasks load; see :mod:`dagster_gpu.slurm.script`.
        object_store: an :class:`ObjectStore` when the compute nodes share no file system with this host
            (``transport: rest`` with ``relay_url``): each array's manifest is uploaded once to
            ``<relay_url>/batches/<batch>/manifest.json`` (never over an existing object), the job script carries
            the task runner (:mod:`dagster_gpu.slurm.object_runner`), and task ``i`` ships its log to
            ``<relay_url>/batches/<batch>/<i>.log`` (its ``sbatch --output`` stays on the node, in the job's
            working directory). None: the tasks read this host's spool (or the ssh transport's remote one).
    """

    FLUSH_CHECK_S = 0.25  # seconds between one waiting process's attempts to flush the spool

    def __init__(
        self,
        spool: Spool,
        client: SlurmClient,
        python: str,
        rule: WindowRule | None = None,
        max_wait_s: float = 180.0,
        lock_wait_s: float = 30.0,
        max_tasks_per_array: int | None = None,
        max_array_size: Callable[[], int] | None = None,
        env_files: Sequence[str] = (),
        pending_tasks: Callable[[], Mapping[int, int] | None] | None = None,
        object_store: ObjectStore | None = None,
    ):
        self.spool = spool
        self.client = client
        self.python = python
        self.rule = rule or WindowRule()
        if self.rule.hard_cap_s > 0.8 * max_wait_s:
            raise ValueError(
                f"coalescing hard cap {self.rule.hard_cap_s:g}s must leave launches time to be submitted "
                f"before their {max_wait_s:g}s timeout (at most {0.8 * max_wait_s:g}s)"
            )
        self.max_wait_s = max_wait_s
        self.lock_wait_s = lock_wait_s
        self.max_tasks_per_array = max_tasks_per_array
        self._max_array_size = max_array_size or client.max_array_size
        self.env_files = list(env_files)
        self._pending_tasks = pending_tasks
        self.object_store = object_store
        self.last_decisions: dict[str, FlushDecision] = {}  # by group, for logs and tests
        self._groups_cache: tuple[int, list[tuple[int, str]]] | None = None  # (batches mtime_ns, groups)
        self.sbatch_calls = 0  # submissions made by this process (benchmarks)

    # ------------------------------------------------------------------------------------ public
    def submit(self, req: TaskRequest) -> TaskAssignment:
        """Queue ``req`` and block until it is part of a submitted job array.

        Raises SubmissionRejected (naming the partitions of every step in the rejected sbatch),
        CoalescerTimeout after ``max_wait_s``, SpoolLockTimeout, and whatever this process's own flush raised
        outside a submission (then ``req`` is withdrawn first, so no other process submits it later)."""
        pending = self.spool.pending / f"{time.time_ns():020d}-{req.launch_id}.json"
        doc = asdict(req)
        doc["options"], doc["argv"], doc["env"] = list(req.options), list(req.argv), dict(req.env)
        doc["partition_keys"] = list(req.partition_keys)
        write_json(pending, doc)
        result_path = self.spool.results / f"{req.launch_id}.json"
        deadline = time.monotonic() + self.max_wait_s
        next_flush = 0.0
        while True:
            res = self.spool.read_own_json(result_path)
            if res is None and time.monotonic() >= next_flush:
                # The window's decisions change on a scale of seconds: every waiting process checks the
                # result file often but tries to flush only every FLUSH_CHECK_S (one flusher at a time).
                next_flush = time.monotonic() + self.FLUSH_CHECK_S
                with self.spool.lock(timeout_s=0) as got:
                    if got:
                        res = self.spool.read_own_json(result_path)
                        if res is None:
                            try:
                                self.flush_due()
                            except BaseException:
                                if self.spool.read_own_json(result_path) is None:
                                    pending.unlink(missing_ok=True)  # not submitted, and nobody will once this raises
                                    raise
                                log.exception("flushing the spool failed after this launch was submitted")
                            res = self.spool.read_own_json(result_path)
            if res is not None:
                result_path.unlink(missing_ok=True)
                return self._result(res)
            if time.monotonic() > deadline:
                with self.spool.lock(timeout_s=self.lock_wait_s):
                    if pending.exists():
                        pending.unlink()
                        raise CoalescerTimeout(
                            f"step {req.step_key!r} ({describe_partitions(req.partition_keys)}) was not submitted to Slurm "
                            f"within {self.max_wait_s:g}s (spool {self.spool.root})"
                        )
                # it was taken by a submitter meanwhile: its result is imminent
                deadline = time.monotonic() + 30
            time.sleep(0.05)

    def flush_due(self, force: bool = False) -> int:
        """Submit every group of pending launches the window rule says is due (every group if ``force``).
        Caller holds the spool lock. Returns the number of sbatch calls made."""
        groups: dict[str, list[tuple[Path, dict]]] = {}
        for p in sorted(self.spool.pending.glob("*.json")):
            d = self.spool.read_own_json(p)  # never another user's launch (a shared spool)
            if d is not None:
                groups.setdefault(group_key(d["options"], d["throttle"]), []).append((p, d))
        calls = 0
        cap = self._chunk_size()
        if cap <= 0:  # the site disabled job arrays: nothing can be submitted as one
            for members in groups.values():
                self._reject_disabled(members)
            return 0
        backlog_by_group = functools.cache(self._backlog_by_group)  # asked once, only if the window is due
        for group, members in groups.items():
            if not force:
                created = [d["created"] for _, d in members]
                throttle = int(members[0][1]["throttle"] or 0)
                newest = max(members, key=lambda m: m[1]["created"])[1]
                kw = {"throttle": throttle, "to_come": newest.get("launches_to_come"),
                      "partitions": sum(max(1, len(_keys(d))) for _, d in members)}
                decision = decide_flush(self.rule, time.time(), created, cap, None, **kw)
                if decision.due:  # would the backlog hold it? (asked only now: it may read a poll)
                    backlog = backlog_by_group()
                    if backlog is not None:
                        decision = decide_flush(self.rule, time.time(), created, cap, backlog.get(group, 0), **kw)
                self.last_decisions[group] = decision
                if not decision.due:
                    continue
                log.info("submitting %d launch(es): %s", len(members), decision.reason)
            for i in range(0, len(members), cap):
                self._submit_chunk(members[i : i + cap])
                calls += 1
        return calls

    def _backlog_by_group(self) -> dict[str, int] | None:
        """Pending tasks of our active job arrays by sbatch-options group; None when unknown."""
        counts = self._pending_tasks() if self._pending_tasks else None
        if counts is None:
            return None
        out: dict[str, int] = {}
        for array_job_id, group in self._array_groups():
            out[group] = out.get(group, 0) + int(counts.get(array_job_id, 0))
        return out

    def _array_groups(self) -> list[tuple[int, str]]:
        """(array job id, group) of the spool's active job arrays, re-read only when a batch was added.

        Batches are created (under the spool lock, submitted.json included) before any other flusher
        looks, so the batches directory's mtime changes exactly when this list can grow; a batch marked
        done since stays listed and counts 0 (its tasks are no longer pending in any poll)."""
        mtime = self.spool.batches.stat().st_mtime_ns
        if self._groups_cache is None or self._groups_cache[0] != mtime:
            groups = [(int(sub["array_job_id"]), sub["group"]) for _, sub in self.spool.active_batches() if "group" in sub]
            self._groups_cache = (mtime, groups)
        return self._groups_cache[1]

    # ------------------------------------------------------------------------------------ internals
    def _chunk_size(self) -> int:
        """Tasks per sbatch: the controller's cap (MaxArraySize, max_array_tasks), then ours; 0 when job
        arrays are disabled (MaxArraySize=0)."""
        cap = self._max_array_size()  # indices 0..n-1 must be < MaxArraySize (and <= max_array_tasks tasks)
        if cap <= 0:
            return 0
        if self.max_tasks_per_array:
            cap = min(cap, self.max_tasks_per_array)
        return max(1, cap)

    def _reject_disabled(self, members: list[tuple[Path, dict]]) -> None:
        partitions = [k for _, d in members for k in _keys(d)]
        reason = ARRAYS_DISABLED
        msg = f"Slurm did not get the job array of {len(members)} step(s) ({steps_covered([_keys(d) for _, d in members])}): {reason}"
        log.error(msg)
        for p, d in members:
            write_json(self.spool.results / f"{d['launch_id']}.json", {"ok": False, "error": msg, "partitions": partitions, "slurm_message": reason})
            p.unlink(missing_ok=True)

    def _submit_chunk(self, members: list[tuple[Path, dict]]) -> None:
        batch = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        bdir = self.spool.make_dir(self.spool.batch_dir(batch), exclusive=True)
        tasks = [
            {**{k: d[k] for k in ("launch_id", "run_id", "step_key", "attempt", "argv", "env")},
             "covers": describe_partitions(_keys(d)),
             **({"requeue_module": d["requeue_module"]} if d.get("requeue_module") else {})}
            for _, d in members
        ]
        manifest = write_manifest(bdir / "manifest.json", batch, tasks, self.env_files)
        manifest_hash = manifest_sha256(manifest)
        first = members[0][1]
        n = len(members)
        remote = self._remote_spool()
        if self.object_store:  # the node keeps its own copy of the log, in the job's working directory
            output = f"dagster-gpu-{batch}-%a.out"
            log_of = functools.partial(self.object_store.log_prefix, f"{self.object_store.url}/batches/{batch}")
        else:
            out_dir = f"{remote}/batches/{batch}" if remote else str(bdir)  # where the tasks write their logs
            output = f"{out_dir}/%a.out"
            log_of = lambda i: f"{out_dir}/{i}.out"  # noqa: E731
        options = [
            *first["options"],
            f"--array={format_array_spec(range(n), first['throttle'] or None)}",
            f"--job-name=dagster-gpu-{batch}",
            f"--output={output}",
            *([] if any(o.startswith(("--requeue", "--no-requeue")) for o in first["options"]) else ["--requeue"]),
        ]
        partitions = [k for _, d in members for k in _keys(d)]
        covered = steps_covered([_keys(d) for _, d in members])
        try:
            # right before sbatch reads (and copies) it: the job script verified where sbatch runs
            script, script_hash, script_args = self._cluster_files(batch, manifest, manifest_hash)
            job = self._submitting_client().submit_job(script, [*options], script_args=[self.python, *script_args])
            job_id, cluster = job.job_id, job.cluster
        except (SlurmError, UntrustedPathError, TransportError, OSError) as e:
            if isinstance(e, SlurmError):
                kind = ("rejected" if isinstance(e, SlurmRejected) else
                        "refused our credentials for" if isinstance(e, SlurmAccessRefused) else "could not take")
                reason = e.message
            elif isinstance(e, TransportUnreachable):
                kind, reason = "could not take", str(e)
            elif not isinstance(e, (UntrustedPathError, TransportError)):  # the object store refused the manifest
                kind, reason = "was not asked to run", f"the manifest could not be uploaded: {type(e).__name__}: {e}"
            else:
                kind, reason = "was not asked to run", str(e)
            msg = (
                f"Slurm {kind} the job array of {n} step(s) ({covered}): {reason} "
                f"(sbatch {' '.join(options)})"
            )
            log.error(msg)
            write_json(bdir / "rejected.json", {"error": msg, "partitions": partitions})
            for i, (p, d) in enumerate(members):
                write_json(self.spool.results / f"{d['launch_id']}.json", {"ok": False, "error": msg, "partitions": partitions, "slurm_message": reason})
                p.unlink(missing_ok=True)
            return
        self.sbatch_calls += 1
        now = time.time()
        write_json(
            bdir / "submitted.json",
            {"array_job_id": job_id, "cluster": cluster, "tasks": n, "submitted_at": now,
             "launch_ids": [d["launch_id"] for _, d in members], "group": group_key(first["options"], first["throttle"]),
             "job_script_sha256": script_hash, "manifest_sha256": manifest_hash},
            mode=self.spool.public_mode,
        )
        log.info("submitted job array %s (%d tasks, batch %s): %s", job_id, n, batch, covered)
        for i, (p, d) in enumerate(members):
            write_json(
                self.spool.results / f"{d['launch_id']}.json",
                {"ok": True, "array_job_id": job_id, "cluster": cluster, "array_task_id": i, "batch": batch,
                 "submitted_at": now, "tasks_in_array": n, "log_file": log_of(i)},
            )  # fmt: skip
            p.unlink(missing_ok=True)

    def _remote_spool(self) -> str | None:
        """The spool on the cluster when the client's transport reaches a login node (``transport: ssh``),
        else None (this host's spool is the one the tasks read)."""
        return self.client.transport.remote_spool

    def job_script_for_sbatch(self) -> tuple[str, str]:
        """(path, SHA-256) of the verified job script where ``sbatch`` reads it: this spool's (rewritten and
        checked, :func:`~dagster_gpu.slurm.script.verify_job_script`), or, with a remote spool, the one
        uploaded to the cluster and read back there. Raises UntrustedPathError, TransportError."""
        remote = self._remote_spool()
        if not remote:
            script = write_job_script(self.spool.job_script.parent, self.spool.job_script.name)
            return str(script), verify_job_script(script)
        path = f"{remote}/dagster-gpu-array.sh"
        return path, self.client.transport.upload([(path, JOB_SCRIPT.encode(), 0o700)])[path]

    def _cluster_files(self, batch: str, manifest: Path, manifest_hash: str) -> tuple[str, str, list[str]]:
        """(job script, its SHA-256, the job script's arguments after the interpreter) for one job array.

        - This host's spool: the runner and manifest paths here (``RUNNER MANIFEST BATCH SHA256``).
        - A remote spool (ssh): one upload writes the job script, the runner (``script.py`` + ``trust.py``,
          stdlib only) and the manifest under it, each checked there (owner, mode, digest read back).
        - An object store (:attr:`object_store`): the manifest goes to ``<relay_url>/batches/<batch>/manifest.json``
          (refused when it exists; the digest read back must be ``manifest_hash``), the job script carrying the
          runner is written to this spool and verified like the plain one, and the arguments are
          ``MANIFEST_URL BATCH SHA256 STORAGE_OPTIONS_JSON ENV_FILES_JSON LOG_PREFIX``
          (:mod:`dagster_gpu.slurm.object_runner`).

        Raises UntrustedPathError, TransportError, OSError (FileExistsError: a manifest already under the prefix)."""
        remote = self._remote_spool()
        if self.object_store:
            store = self.object_store
            url, options = store.url, dict(store.storage_options)
            manifest_url = f"{url}/batches/{batch}/manifest.json"
            stored = store.put_new(manifest_url, manifest.read_bytes())
            if stored != manifest_hash:
                raise UntrustedPathError(f"refusing manifest {manifest_url}: the store gives back sha256 {stored}, not "
                                         f"the {manifest_hash} written")
            text = store.job_script()
            path = write_atomic(self.spool.job_script.with_name("dagster-gpu-array-noshare.sh"), text, mode=0o700)
            digest = trust.sha256_hex(trust.read_trusted(path, os.geteuid(), what="job script"))
            if digest != trust.sha256_hex(text.encode()):
                raise UntrustedPathError(f"refusing job script {path}: it changed after it was written")
            return str(path), digest, [manifest_url, batch, manifest_hash, json.dumps(options, sort_keys=True),
                                       json.dumps(self.env_files), f"{url}/batches/{batch}"]
        if not remote:
            script, digest = self.job_script_for_sbatch()
            return script, digest, [RUNNER, str(manifest), batch, manifest_hash]
        runner_dir = Path(RUNNER).parent
        script = f"{remote}/dagster-gpu-array.sh"
        runner = f"{remote}/runner/script.py"
        remote_manifest = f"{remote}/batches/{batch}/manifest.json"
        files = [
            (script, JOB_SCRIPT.encode(), 0o700),
            (runner, (runner_dir / "script.py").read_bytes(), 0o600),
            (f"{remote}/runner/trust.py", (runner_dir / "trust.py").read_bytes(), 0o600),
            (remote_manifest, manifest.read_bytes(), 0o600),
        ]
        digests = self.client.transport.upload(files)
        return script, digests[script], [runner, remote_manifest, batch, manifest_hash]

    def _submitting_client(self) -> SlurmClient:
        """The client with ``SLURM_UMASK=0077`` in sbatch's environment: slurmstepd then creates the
        tasks' ``--output`` logs 0600 whatever this process's umask (checked on Slurm 22.05)."""
        return self.client.with_extra_env(SLURM_UMASK="0077")

    @staticmethod
    def _result(res: dict) -> TaskAssignment:
        if not res.get("ok"):
            raise SubmissionRejected(res.get("error", "rejected"), res.get("partitions", []), res.get("slurm_message", ""))
        return TaskAssignment(
            array_job_id=int(res["array_job_id"]),
            array_task_id=int(res["array_task_id"]),
            batch=res["batch"],
            submitted_at=float(res["submitted_at"]),
            tasks_in_array=int(res["tasks_in_array"]),
            log_file=res["log_file"],
            cluster=res.get("cluster"),
        )


def default_python() -> str:
    """The interpreter array tasks use by default: this one (same venv on a shared path)."""
    return os.environ.get("DAGSTER_GPU_SLURM_PYTHON") or sys.executable
