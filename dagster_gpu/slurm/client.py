"""All Slurm I/O of dagster-gpu, through the Slurm CLI (``sbatch``, ``squeue``, ``sacct``, ``scancel``,
``scontrol``, ``sinfo``, ``sdiag``).

Every command:

- is an argv list (never ``shell=True``; no job name, path or partition key is ever parsed by a shell);
- asks for an explicit output format (see :mod:`dagster_gpu.slurm.parse`);
- runs with an environment scrubbed of variables that change what Slurm commands print or submit
  (``SQUEUE_FORMAT``, ``SACCT_FORMAT``, ``SBATCH_*``, ``SLURM_*`` other than ``SLURM_CONF``…);
- retries with exponential backoff (tenacity) while the controller or slurmdbd is unreachable, then
  raises :class:`SlurmTransientError`; a refusal raises :class:`SlurmRejected` at once.

Multi-cluster: ``sbatch --parsable`` prints ``<job id>;<cluster>`` when the job went to a named cluster
(``-M``/``--clusters`` in the options, or a federation); :meth:`SlurmClient.submit_job` returns both, and
every later ``squeue``/``sacct``/``scancel`` of that job passes ``cluster=`` so it carries ``-M <cluster>``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Iterable, Mapping, Sequence

from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from dagster_gpu.slurm import gres as G
from dagster_gpu.slurm import parse as P
from dagster_gpu.slurm.transport import (  # noqa: F401  (SCRUBBED_PREFIXES, KEPT: re-exported)
    KEPT,
    SCRUBBED_PREFIXES,
    LocalTransport,
    Transport,
    TransportRefused,
    TransportUnreachable,
    scrubbed_env,
)

log = logging.getLogger(__name__)


# stderr fragments meaning "could not ask" rather than "was told no" (Slurm 22.05 wording).
_TRANSIENT = re.compile(
    r"unable to contact slurm controller|socket timed out|connection refused|connection timed out"
    r"|zero bytes were transmitted|communication connection failure|slurm backup controller in standby"
    r"|temporarily unable to accept job|resource temporarily unavailable|slurm_persist_conn_open"
    r"|problem talking to (the )?database|unable to connect to database|slurmdbd.*(not|never) respond"
    r"|protocol authentication error|munge (encode|decode) failed|transport endpoint|try again later"
    r"|slurm controller not responding|error receiving message|slurmctld .* not responding",
    re.I,
)
_UNSENT = re.compile(r"connect failure|connection refused|unable to contact slurm controller", re.I)
_INVALID_JOB = re.compile(r"invalid job id specified", re.I)


class SlurmError(RuntimeError):
    """A Slurm command failed.

    Attributes:
        argv: the command.
        returncode: its exit status (None when it did not finish).
        message: Slurm's own words (``Batch job submission failed: …``), else the last stderr line.
        stderr: everything it wrote to stderr.
    """

    def __init__(self, argv: Sequence[str], returncode: int | None, message: str, stderr: str = ""):
        self.argv = list(argv)
        self.returncode = returncode
        self.message = message
        self.stderr = stderr
        super().__init__(f"{' '.join(self.argv[:2])}… failed (rc={returncode}): {message}")


class SlurmTransientError(SlurmError):
    """Slurm could not be asked (controller or slurmdbd down, timeout); the request may succeed later."""


class SlurmRejected(SlurmError):
    """Slurm answered and refused (invalid array spec, account, QOS, GRES, slurm partition…)."""


class SlurmNotInstalled(SlurmError):
    """The Slurm command is not on PATH."""


class SlurmUnreachable(SlurmTransientError):
    """The transport could not reach the login node now (SSH connection refused, dropped, timed out):
    transient, like an unreachable controller; the message names the host. ``sent``: the command may
    have reached the login node before the connection dropped (then sbatch is not sent again)."""

    sent: bool = True


class SlurmAccessRefused(SlurmError):
    """The login node refused the transport (a changed or unknown host key, a refused login): not
    transient; the message names host, user and, for a host key, its fingerprint."""


@dataclass(frozen=True)
class SubmittedJob:
    """What ``sbatch --parsable`` said: the job id (array job id for ``--array``) and the cluster it went
    to (None on a single-cluster setup, where sbatch prints no cluster)."""

    job_id: int
    cluster: str | None = None


def cluster_args(cluster: str | None) -> list[str]:
    """``["-M", cluster]`` for a job on a named cluster, ``[]`` for None. Raises ValueError for a name that
    is not a Slurm cluster name (it could otherwise be read as an option)."""
    if cluster is None:
        return []
    if not P.CLUSTER_NAME.match(cluster):
        raise ValueError(f"not a Slurm cluster name: {cluster!r}")
    return ["-M", cluster]


@dataclass
class SlurmClient:
    """Runs Slurm commands.

    Attributes:
        slurm_conf: path of slurm.conf (exported as SLURM_CONF), or None to use the environment's/default.
        timeout_s: seconds one command may take before it counts as a transient failure.
        attempts: tries per command while errors are transient (>= 1).
        backoff_max_s: cap of the exponential backoff between tries (seconds).
        extra_env: variables added to the commands' environment (after scrubbing); no secret (a remote
            transport puts them on its command line).
        transport: where the commands run (:mod:`dagster_gpu.slurm.transport`): this host (default) or a
            login node over SSH (:class:`dagster_gpu.slurm.ssh.SshTransport`).
        bin_dir: the directory of the Slurm commands where the transport runs them (an absolute path on that
            host, e.g. ``/opt/slurm/24.11/bin``: a site whose non-interactive login shell does not have them on
            PATH), or None to find them on PATH.
        calls: count of commands run, by program name (for benchmarks and tests).
        token_wait_s: how long a launch waits for renewed credentials (:meth:`await_credentials`), seconds;
            0 here (nothing to renew), the rest client's ``token_wait_seconds``.
    """

    slurm_conf: str | None = None
    timeout_s: float = 30.0
    attempts: int = 4
    backoff_max_s: float = 8.0
    extra_env: Mapping[str, str] = field(default_factory=dict)
    transport: Transport = field(default_factory=LocalTransport)
    bin_dir: str | None = None
    calls: dict[str, int] = field(default_factory=dict)
    token_wait_s: float = 0.0
    _config: dict[str, str] | None = field(default=None, init=False, repr=False, compare=False)
    _warned_tres: bool = field(default=False, init=False, repr=False, compare=False)

    # ------------------------------------------------------------------------------------ plumbing
    def env(self) -> dict[str, str]:
        """The environment every Slurm command runs with (scrubbed; see module doc)."""
        return scrubbed_env(os.environ, self.set_env())

    def set_env(self) -> dict[str, str]:
        """The variables set on top of the scrubbed environment: ``SLURM_CONF`` (when configured) and
        ``extra_env``."""
        return {**({"SLURM_CONF": self.slurm_conf} if self.slurm_conf else {}), **dict(self.extra_env)}

    def with_extra_env(self, **env: str) -> "SlurmClient":
        """This client with ``env`` on top of ``extra_env``: itself when those values are set already, else a
        copy (``dataclasses.replace``, sharing :attr:`calls`)."""
        if all(self.extra_env.get(k) == v for k, v in env.items()):
            return self
        return dataclasses.replace(self, extra_env={**self.extra_env, **env})

    def _run_once(
        self, argv: Sequence[str], ok_codes: Iterable[int] = (0,), forward_env: bool = False
    ) -> subprocess.CompletedProcess:
        prog = os.path.basename(argv[0])
        self.calls[prog] = self.calls.get(prog, 0) + 1
        if self.bin_dir and "/" not in argv[0]:
            argv = [posixpath.join(self.bin_dir, argv[0]), *argv[1:]]
        try:
            cp = self.transport.run(argv, set_env=self.set_env(), timeout_s=self.timeout_s, forward_env=forward_env)
        except FileNotFoundError as e:
            where = f"(slurm_bin_dir {self.bin_dir})" if self.bin_dir else "on PATH"
            raise SlurmNotInstalled(argv, None, f"{argv[0]} not found {where}: {e}") from e
        except subprocess.TimeoutExpired as e:
            raise SlurmTransientError(argv, None, f"timed out after {self.timeout_s:g}s", str(e.stderr or "")) from e
        except TransportUnreachable as e:
            err = SlurmUnreachable(argv, None, str(e), str(e))
            err.sent = e.sent
            raise err from e
        except TransportRefused as e:
            raise SlurmAccessRefused(argv, None, str(e), str(e)) from e
        if cp.returncode == 127 and self.transport.kind != "local" and "not found" in cp.stderr:
            raise SlurmNotInstalled(argv, 127, f"{argv[0]} not found on the {self.transport.kind} login node: {cp.stderr.strip()}")
        if cp.returncode in tuple(ok_codes):
            return cp
        msg = P.error_message(cp.stderr) or f"exit status {cp.returncode}"
        cls = SlurmTransientError if _TRANSIENT.search(cp.stderr) else SlurmRejected
        raise cls(argv, cp.returncode, msg, cp.stderr)

    def run(
        self, argv: Sequence[str], *, attempts: int | None = None, only_unsent: bool = False, forward_env: bool = False
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` (a list), retrying transient failures; return the finished process.

        ``only_unsent`` retries only failures where the request surely never reached the controller
        (connection refused / connect failure), for commands that must not run twice (sbatch).
        Raises SlurmTransientError after the last try, SlurmRejected at once, SlurmNotInstalled."""
        return self.retried(argv[0], lambda: self._run_once(argv, forward_env=forward_env), attempts=attempts, only_unsent=only_unsent)

    def retried(self, what: str, call, *, attempts: int | None = None, only_unsent: bool = False):
        """``call()`` retried with exponential backoff while it raises SlurmTransientError (at most
        ``attempts`` tries, default :attr:`attempts`); ``only_unsent``: only failures where the request surely
        never reached Slurm. Returns what ``call`` returns; raises its last error."""
        n = max(1, attempts if attempts is not None else self.attempts)

        def retryable(e: BaseException) -> bool:
            if not isinstance(e, SlurmTransientError):
                return False
            if isinstance(e, SlurmUnreachable):  # safe to send again unless it may have run (sbatch)
                return not (only_unsent and e.sent)
            return not only_unsent or bool(_UNSENT.search(e.stderr or e.message))

        retrying = Retrying(
            stop=stop_after_attempt(n),
            wait=wait_exponential(multiplier=0.5, max=self.backoff_max_s),
            retry=retry_if_exception(retryable),
            reraise=True,
            before_sleep=lambda rs: log.warning(
                "slurm: %s transient failure (try %d/%d): %s", what, rs.attempt_number, n, rs.outcome.exception()
            ),
        )
        try:
            for attempt in retrying:
                with attempt:
                    return call()
        except RetryError as e:  # pragma: no cover - reraise=True returns the original error
            raise e.last_attempt.exception()  # type: ignore[misc]
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------------------------ the shared poll
    #: How :meth:`poll_query`'s texts are written: ``cli`` (squeue / sacct output in parse's formats).
    poll_format: ClassVar[str] = "cli"

    def poll_query(self, job_ids: Sequence[int], cluster: str | None = None) -> tuple[str, str]:
        """(queue text, accounting text) of array jobs ``job_ids`` on one cluster, as the shared poll stores
        them (:attr:`poll_format`; read back with :func:`dagster_gpu.slurm.poller.parse_poll_texts`): squeue
        and sacct output. Raises SlurmError."""
        try:
            q = self.run(self.squeue_argv(job_ids, cluster), attempts=2).stdout
        except SlurmError as e:
            if "invalid job id specified" not in (e.stderr or "").lower():
                raise
            q = ""  # every id purged from squeue: sacct still knows them
        return q, self.run(self.sacct_argv(job_ids, cluster), attempts=2).stdout

    def await_credentials(self, what: str) -> None:
        """Called before a launch's first Slurm call (``what`` names it, for logs): returns once the client's
        credentials can submit. The CLI and SSH transports have nothing to wait for; the rest transport waits
        for an expired token to be renewed (:meth:`dagster_gpu.slurm.rest.RestSlurmClient.await_credentials`)."""

    # ------------------------------------------------------------------------------------ commands
    def submit_job(
        self,
        script: str | Path,
        options: Sequence[str],
        *,
        script_args: Sequence[str] = (),
        attempts: int | None = None,
    ) -> SubmittedJob:
        """``sbatch --parsable <options> <script> <script_args>``; returns the job id (the array job id
        for ``--array``) and the cluster sbatch names (``123;gpu2``), if any.

        ``options`` are complete argv items (``--array=0-7%4``, ``--gres=gpu:1``, ``--clusters=gpu2``);
        ``script_args`` reach the script as ``$1…`` without any shell parsing. Raises SlurmRejected with
        Slurm's reason (``Batch job submission failed: Invalid job array specification``)."""
        cp = self.run(
            ["sbatch", "--parsable", *options, str(script), *script_args], attempts=attempts, only_unsent=True, forward_env=True
        )
        try:
            job_id, cluster = P.parse_sbatch_parsable(cp.stdout)
        except P.SlurmParseError as e:
            raise SlurmRejected(["sbatch"], cp.returncode, str(e), cp.stderr) from e
        return SubmittedJob(job_id, cluster)

    def submit(
        self,
        script: str | Path,
        options: Sequence[str],
        *,
        script_args: Sequence[str] = (),
        attempts: int | None = None,
    ) -> int:
        """:meth:`submit_job`'s job id alone (for callers that never submit to a named cluster)."""
        return self.submit_job(script, options, script_args=script_args, attempts=attempts).job_id

    def test_only(self, options: Sequence[str], script: str | Path) -> P.TestOnly:
        """``sbatch --test-only``: the controller's start estimate for a job like this (nothing is submitted)."""
        cp = self.run(["sbatch", "--test-only", *options, str(script)])
        return P.parse_test_only(cp.stderr)

    def squeue_argv(self, job_ids: Iterable[int | str], cluster: str | None = None) -> list[str]:
        """The ``squeue`` argv for :meth:`squeue` (also run by the shared poller)."""
        ids = ",".join(sorted({str(j) for j in job_ids}))
        return ["squeue", *cluster_args(cluster), "--noheader", "--array", "--states=all", f"--jobs={ids}", "-o", P.SQUEUE_FORMAT]

    def sacct_argv(self, job_ids: Iterable[int | str], cluster: str | None = None) -> list[str]:
        """The ``sacct`` argv for :meth:`sacct` (also run by the shared poller)."""
        ids = ",".join(sorted({str(j) for j in job_ids}))
        return [
            "sacct", *cluster_args(cluster), "--parsable2", "--noheader", "--allocations", "--duplicates", "--allusers",
            f"--jobs={ids}", "--format", P.SACCT_FORMAT,
        ]  # fmt: skip

    def squeue(self, job_ids: Iterable[int | str], *, attempts: int | None = None, cluster: str | None = None) -> list[P.QueueRow]:
        """One ``squeue --array --states=all`` for all ``job_ids`` (array job ids select all their tasks),
        on ``cluster`` (``-M``) when given.

        Jobs Slurm no longer knows (older than MinJobAge) are simply absent. Empty input -> []."""
        ids = sorted({str(j) for j in job_ids})
        if not ids:
            return []
        argv = self.squeue_argv(ids, cluster)
        try:
            cp = self.run(argv, attempts=attempts)
        except SlurmRejected as e:
            if _INVALID_JOB.search(e.stderr):  # squeue -j with only purged ids exits 1
                return []
            raise
        return P.parse_squeue(cp.stdout)

    def sacct(self, job_ids: Iterable[int | str], *, attempts: int | None = None, cluster: str | None = None) -> list[P.AcctRow]:
        """One ``sacct --allocations --duplicates`` for ``job_ids`` (on ``cluster``, ``-M``, when given): one
        record per attempt (a requeued task has its PREEMPTED/REQUEUED records too). Empty input -> [].
        Raises SlurmRejected when accounting storage is disabled (sacct then prints a warning and exits 0)."""
        ids = sorted({str(j) for j in job_ids})
        if not ids:
            return []
        argv = self.sacct_argv(ids, cluster)
        cp = self.run(argv, attempts=attempts)
        if "accounting storage is disabled" in cp.stderr.lower():
            raise SlurmRejected(argv, cp.returncode, "Slurm accounting storage is disabled (no slurmdbd)", cp.stderr)
        return P.parse_sacct(cp.stdout)

    def sacct_steps(self, job_ids: Iterable[int | str], *, cluster: str | None = None) -> list[P.StepUsage]:
        """The steps' usage TRES (``gres/gpuutil``, ``gres/gpumem`` since 23.02) of ``job_ids`` (array job ids
        select all their tasks): one ``sacct`` without ``--allocations``. Empty input -> []."""
        ids = sorted({str(j) for j in job_ids})
        if not ids:
            return []
        argv = ["sacct", *cluster_args(cluster), "--parsable2", "--noheader", "--allusers", f"--jobs={','.join(ids)}",
                "--format", P.SACCT_STEP_FORMAT]
        return P.parse_sacct_steps(self.run(argv).stdout)

    def gpu_usage_tracked(self) -> bool:
        """Whether steps record ``gres/gpuutil``/``gres/gpumem`` (Slurm >= 23.02 with gres/gpu, gres/gpuutil or
        gres/gpumem in AccountingStorageTRES), from the cached config."""
        cfg = self.config()
        tres = P.tracked_tres(cfg)
        if not tres & {"gres/gpu", "gres/gpuutil", "gres/gpumem"} and not P.gpu_tres_tracked(cfg):
            return False
        try:
            major, minor = (int(x) for x in cfg.get("SLURM_VERSION", "0.0").split(".")[:2])
        except ValueError:
            return False
        return (major, minor) >= (23, 2)

    def scancel(self, ids: Iterable[str], *, signal: str | None = None, cluster: str | None = None) -> None:
        """``scancel`` exactly these ids (``123_7`` cancels one array task, ``123`` a whole job/array), on
        ``cluster`` (``-M``) when given. Unknown or finished ids are ignored."""
        ids = [str(i) for i in ids]
        if not ids:
            return
        argv = ["scancel", *cluster_args(cluster), *([f"--signal={signal}"] if signal else []), *ids]
        try:
            self.run(argv)
        except SlurmRejected as e:
            if not _INVALID_JOB.search(e.stderr) and "already completing or completed" not in e.stderr:
                raise

    def show_config(self) -> dict[str, str]:
        """``scontrol show config`` as a dict."""
        return P.parse_show_config(self.run(["scontrol", "show", "config"]).stdout)

    def config(self) -> dict[str, str]:
        """``scontrol show config``, asked once per client and kept (for settings that need a slurmctld
        restart to change: AccountingStorageTRES)."""
        if self._config is None:
            self._config = self.show_config()
        return self._config

    def gpu_tres_tracked(self) -> bool:
        """Whether sacct records GPUs (``gres/gpu`` in AccountingStorageTRES; :func:`parse.gpu_tres_tracked`),
        from the cached config. Logs a WARNING once per client when not: bills then count requested GRES."""
        cfg = self.config()
        if "AccountingStorageTRES" not in cfg:  # every scontrol prints it; without it there is nothing to go on
            return True
        tracked = P.gpu_tres_tracked(cfg)
        if not tracked and not self._warned_tres:
            self._warned_tres = True
            log.warning(
                "Slurm does not account GPUs (AccountingStorageTRES=%s has no gres/gpu): sacct bills count the "
                "requested GRES x ElapsedRaw (billing/source sacct-requested); add gres/gpu to AccountingStorageTRES "
                "in slurm.conf to bill what Slurm allocated", self.config().get("AccountingStorageTRES"),
            )
        return tracked

    def array_limits(self) -> P.ArrayLimits:
        """The controller's job array limits now (MaxArraySize, SchedulerParameters max_array_tasks)."""
        return P.array_limits(self.show_config())

    def max_array_size(self) -> int:
        """The most tasks one job array may have now (indices 0..n-1): MaxArraySize, lowered by
        SchedulerParameters' max_array_tasks; 0 when the site disabled job arrays (MaxArraySize=0)."""
        return self.array_limits().tasks_per_array

    def update_throttle(self, array_job_id: int, throttle: int) -> None:
        """``scontrol update JobId=<id> ArrayTaskThrottle=<n>`` (live; 0 = unthrottled)."""
        self.run(["scontrol", "update", f"JobId={int(array_job_id)}", f"ArrayTaskThrottle={int(throttle)}"])

    def node_gres(self, slurm_partition: str | None) -> list[G.NodeGres]:
        """One ``sinfo -N -O NodeList,StateLong,Gres,GresUsed`` of a slurm partition (default one when None):
        every node's state and its GRES configured and in use (:func:`dagster_gpu.slurm.gres.parse_sinfo_nodes`).
        Raises SlurmError, SlurmRejected when the output does not parse."""
        argv = ["sinfo", "--noheader", "--Node", "-O", G.SINFO_NODE_FORMAT]
        if slurm_partition:
            argv.append(f"--partition={slurm_partition}")
        cp = self.run(argv)
        try:
            return G.parse_sinfo_nodes(cp.stdout)
        except ValueError as e:
            raise SlurmRejected(argv, cp.returncode, str(e), cp.stderr) from e

    def gpu_capacity(self, slurm_partition: str | None, gres_type: str | None = None) -> G.GpuCapacity:
        """GPUs of a slurm partition (of one GRES type when given): in total, on nodes that take jobs, and in
        use there, whatever way the jobs asked for them (``--gres``, ``--gpus``, multi-node), from one ``sinfo``."""
        return G.gpu_capacity(self.node_gres(slurm_partition), gres_type)

    def gpus_in_partition(self, slurm_partition: str | None) -> int:
        """GPUs on the nodes of a slurm partition that take new jobs (DOWN/DRAINED/not responding excluded)."""
        return self.gpu_capacity(slurm_partition).usable

    def pending_gres(self, slurm_partition: str | None) -> list[str]:
        """The tres-per-node (squeue ``%b``: ``gres:gpu:1`` / ``gres/gpu:a100:1`` / ``N/A``) of every job and
        array task PENDING in a slurm partition (one ``squeue --array``)."""
        argv = ["squeue", "--noheader", "--array", "-t", "PENDING", "-o", "%T|%b"]
        if slurm_partition:
            argv.append(f"--partition={slurm_partition}")
        out = []
        for line in self.run(argv).stdout.splitlines():
            state, _, gres = line.strip().partition("|")
            if state == "PENDING":
                out.append(gres)
        return out

    def pending_jobs(self, slurm_partition: str | None, gres_type: str | None = None) -> int:
        """Jobs and array tasks PENDING in a slurm partition; with ``gres_type``, those asking GPUs of that
        type or of no type (they may take one)."""
        return G.pending_for_type(self.pending_gres(slurm_partition), gres_type)

    def gpu_queue(self, slurm_partition: str | None) -> tuple[int, int]:
        """(GPUs allocated on the slurm partition's usable nodes, jobs/array tasks pending), from one
        ``sinfo`` (``GresUsed``: right on every Slurm version, for ``--gpus`` and multi-node jobs too) and one
        ``squeue``."""
        return self.gpu_capacity(slurm_partition).used, self.pending_jobs(slurm_partition)

    def sdiag(self) -> P.Sdiag:
        """``sdiag`` totals (RPC counts since the last reset)."""
        return P.parse_sdiag(self.run(["sdiag"]).stdout)

    def sdiag_reset(self) -> None:
        """``sdiag --reset`` (root or SlurmUser only)."""
        self.run(["sdiag", "--reset"])

    def wait_gone(self, job_ids: Iterable[int], timeout_s: float = 60.0, poll_s: float = 0.5, cluster: str | None = None) -> bool:
        """Wait until none of ``job_ids`` (on ``cluster`` when given) is pending or running; True if so within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        ids = list(job_ids)
        while time.monotonic() < deadline:
            rows = self.squeue(ids, cluster=cluster)
            if not any(r.state.status.value in ("pending", "running", "requeued") for r in rows):
                return True
            time.sleep(poll_s)
        return False


def gpu_count(gres: str) -> int:
    """``gpu:4,shard:8`` -> 4; ``gpu:a100:2(S:0-1)`` -> 2; ``gres/gpu:a100:1`` -> 1; ``(null)`` -> 0
    (:func:`dagster_gpu.slurm.gres.gpu_count`)."""
    return G.gpu_count(gres)
