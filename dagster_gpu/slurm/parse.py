"""Parse the output of Slurm commands run with the explicit formats defined here (pure, no I/O).

The formats are part of this module so the client (which runs the commands) and the parsers (which
read them) cannot drift apart:

- ``squeue --noheader --array --states=all -o SQUEUE_FORMAT`` -> :func:`parse_squeue` -> [:class:`QueueRow`]
- ``sacct --parsable2 --noheader --allocations --duplicates -o SACCT_FIELDS`` -> :func:`parse_sacct` -> [:class:`AcctRow`]
- ``scontrol show config`` -> :func:`parse_show_config` -> {key: value}
- ``sdiag`` -> :func:`parse_sdiag` -> :class:`Sdiag`
- ``sbatch --parsable`` -> :func:`parse_sbatch_parsable`; ``sbatch --test-only`` -> :func:`parse_test_only`

Durations are seconds (float/int), times are timezone-naive ``datetime`` in the controller's local
time (as Slurm prints them). A field Slurm fills with a word instead of a value (``Unknown``, ``None``,
``N/A``, ``INVALID``, ``Partition_Limit``, ``UNLIMITED``, ``NOT_SET``, ``(null)``, empty; see
:data:`UNKNOWN_WORDS`) parses to None ("unknown"), never to an exception: sacct prints them for jobs
that never started or were cancelled while pending, squeue for limits taken from the slurm partition.
Text that is neither a value nor one of those words raises :class:`SlurmParseError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Mapping

from dagster_gpu.slurm.ids import JobId, parse_array_task_field, parse_job_id
from dagster_gpu.slurm.states import JobState, parse_state

SEP = "|"

#: squeue fields, in order: compact id, job id (of this task), array job id, array task id(s), state,
#: reason, start time, QOS, slurm partition, TRES per node (GRES), job name (last: it may hold ``|``).
SQUEUE_FIELDS = ("%i", "%A", "%F", "%K", "%T", "%r", "%S", "%q", "%P", "%b", "%j")
SQUEUE_FORMAT = SEP.join(SQUEUE_FIELDS)

#: sacct fields (``--parsable2``: ``|``-separated, no trailing ``|``). JobName is last for the same reason.
SACCT_FIELDS = (
    "JobID",
    "JobIDRaw",
    "State",
    "ExitCode",
    "DerivedExitCode",
    "Elapsed",
    "ElapsedRaw",
    "AllocTRES",
    "QOS",
    "Partition",
    "Submit",
    "Start",
    "End",
    "NodeList",
    "JobName",
)
SACCT_FORMAT = ",".join(SACCT_FIELDS)

#: Words (lower case) Slurm prints in a time, duration, count or exit-code field whose value is unknown,
#: unset or unlimited: they parse to None.
UNKNOWN_WORDS = frozenset({"", "unknown", "none", "n/a", "(null)", "invalid", "partition_limit", "unlimited", "not_set", "infinite"})


class SlurmParseError(ValueError):
    """A line of Slurm output does not have the expected shape (the message quotes it)."""


def is_unknown(text: str) -> bool:
    """True when ``text`` is one of :data:`UNKNOWN_WORDS` (case and surrounding blanks ignored)."""
    return text.strip().lower() in UNKNOWN_WORDS


def parse_time(text: str) -> datetime | None:
    """``2026-11-30T00:25:21`` -> datetime; an unknown word (``Unknown``, ``None``, ``N/A``…) -> None.
    Raises SlurmParseError for anything else."""
    t = text.strip()
    if is_unknown(t):
        return None
    try:
        return datetime.strptime(t, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        raise SlurmParseError(f"not a Slurm timestamp: {text!r}") from None


_NUM = r"\d+"
_SEC = r"\d+(?:\.\d+)?"
# Slurm's time formats (sbatch(1) --time; squeue/sacct print the last three): with days D-H, D-H:M,
# D-H:M:S; without M, M:S, H:M:S. Fractional seconds only on a seconds field (sacct: 45:30.500).
_WITH_DAYS = re.compile(rf"^(?P<d>{_NUM})-(?P<h>{_NUM})(?::(?P<m>{_NUM})(?::(?P<s>{_SEC}))?)?$")
_NO_DAYS = re.compile(rf"^(?:(?:(?P<h>{_NUM}):)?(?P<m>{_NUM}):(?P<s>{_SEC})|(?P<mins>{_NUM}))$")


def parse_duration(text: str) -> float | None:
    """Slurm durations -> seconds, exactly as Slurm reads them (``time_str2secs``):

    ``1-02:03:04`` -> 93784, ``1-02:03`` (days-hours:minutes) -> 93780, ``1-02`` -> 93600,
    ``02:03:04`` -> 7384, ``45:30.500`` (minutes:seconds) -> 2730.5, ``90`` (minutes) -> 5400.

    An unknown word (``Unknown``, ``None``, ``INVALID``, ``Partition_Limit``, ``UNLIMITED``, ``N/A``,
    empty…) gives None. Raises SlurmParseError for any other text.
    """
    t = text.strip()
    if is_unknown(t):
        return None
    m = _WITH_DAYS.match(t)
    if m:
        return int(m["d"]) * 86400 + int(m["h"]) * 3600 + int(m["m"] or 0) * 60 + (float(m["s"]) if m["s"] else 0)
    m = _NO_DAYS.match(t)
    if not m:
        raise SlurmParseError(f"not a Slurm duration: {text!r}")
    if m["mins"] is not None:
        return int(m["mins"]) * 60
    return int(m["h"] or 0) * 3600 + int(m["m"]) * 60 + (float(m["s"]) if "." in m["s"] else int(m["s"]))


def parse_count(text: str) -> int | None:
    """A count/seconds field (``ElapsedRaw``, ``%K``-style numbers): ``42`` -> 42; an unknown word -> None.
    Raises SlurmParseError for other text."""
    t = text.strip()
    if is_unknown(t):
        return None
    try:
        return int(t)
    except ValueError:
        raise SlurmParseError(f"not a Slurm count: {text!r}") from None


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """sacct ``ExitCode`` ``3:0`` -> (exit status 3, signal 0); empty or an unknown word -> (None, None)."""
    t = text.strip()
    if is_unknown(t):
        return None, None
    code, _, sig = t.partition(":")
    try:
        return int(code), (int(sig) if sig else None)
    except ValueError:
        raise SlurmParseError(f"not a Slurm exit code: {text!r}") from None


_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


def parse_tres(text: str) -> dict[str, float]:
    """``billing=11,cpu=1,gres/gpu=1,mem=4844K,node=1`` -> {"billing": 11.0, "cpu": 1.0, "gres/gpu": 1.0,
    "mem": 4960256.0 (bytes), "node": 1.0}. Memory-like values with K/M/G/T/P suffixes become bytes;
    ``gres/gpu:a100=1`` keeps its typed key. Empty text, and a whole field that is an unknown word
    (``(null)``: what Slurm prints for a TRES string that was never set, e.g. ``AllocTRES=(null)`` of a job
    still pending), give {}; an item whose value is an unknown word (``billing=INVALID``) is left out.
    Raises SlurmParseError."""
    out: dict[str, float] = {}
    t = text.strip()
    if not t or is_unknown(t):
        return out
    for item in t.split(","):
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise SlurmParseError(f"bad TRES item {item!r} in {text!r}")
        if is_unknown(v):
            continue
        mult = 1
        if v and v[-1].upper() in _UNITS:
            mult, v = _UNITS[v[-1].upper()], v[:-1]
        try:
            out[k] = float(v) * mult
        except ValueError:
            raise SlurmParseError(f"bad TRES value {item!r} in {text!r}") from None
    return out


def _split(line: str, n: int, what: str) -> list[str]:
    parts = line.split(SEP, n - 1)
    if len(parts) != n:
        raise SlurmParseError(f"{what}: expected {n} '|'-separated fields, got {len(parts)}: {line!r}")
    return parts


# --------------------------------------------------------------------------------------------- squeue
@dataclass(frozen=True)
class QueueRow:
    """One ``squeue`` line (``--array`` gives one line per array task, pending ones included).

    Attributes:
        id: the printed id (``123_7``, or compact ``123_[4-9%2]`` without ``--array``).
        job_id: this task's own job id (``%A``; the array job id itself for a pending task or the last task).
        array_job_id: ``%F`` (equals job_id for a non-array job).
        array_task_ids: inclusive ranges of ``%K`` (one ``(n, n)`` for a single task; () for non-array).
        throttle: the ``%N`` of a compact pending line, else None.
        state: the parsed state.
        reason: ``%r`` (``JobArrayTaskLimit``, ``BeginTime``, ``Resources``, ``None``…).
        start: ``%S`` (actual or expected start), None when unknown.
        qos, slurm_partition, tres_per_node (``gres:gpu:1``), name.
    """

    id: JobId
    job_id: int
    array_job_id: int
    array_task_ids: tuple[tuple[int, int], ...]
    throttle: int | None
    state: JobState
    reason: str
    start: datetime | None
    qos: str
    slurm_partition: str
    tres_per_node: str
    name: str

    @property
    def array_task_id(self) -> int | None:
        """The single array task id of a one-task line, else None."""
        if len(self.array_task_ids) == 1 and self.array_task_ids[0][0] == self.array_task_ids[0][1]:
            return self.array_task_ids[0][0]
        return None


def parse_squeue(text: str) -> list[QueueRow]:
    """Parse ``squeue --noheader -o SQUEUE_FORMAT`` output (blank lines and the ``CLUSTER: <name>`` banners
    of ``squeue -M`` skipped). Raises SlurmParseError."""
    rows: list[QueueRow] = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("CLUSTER: "):
            continue
        f = _split(line, len(SQUEUE_FIELDS), "squeue")
        try:
            ranges, throttle = parse_array_task_field(f[3])
            rows.append(
                QueueRow(
                    id=parse_job_id(f[0]),
                    job_id=int(f[1]),
                    array_job_id=int(f[2]),
                    array_task_ids=ranges,
                    throttle=throttle,
                    state=parse_state(f[4], strict=False),
                    reason=f[5],
                    start=parse_time(f[6]),
                    qos=f[7],
                    slurm_partition=f[8],
                    tres_per_node=f[9],
                    name=f[10],
                )
            )
        except (ValueError, SlurmParseError) as e:
            raise SlurmParseError(f"squeue line {line!r}: {e}") from e
    return rows


# ---------------------------------------------------------------------------------------------- sacct
@dataclass(frozen=True)
class AcctRow:
    """One ``sacct --allocations`` record (with ``--duplicates``, one per attempt of a requeued job).

    Attributes:
        id: ``JobID`` parsed (``123_7``, ``123``, ``123_[4-9%2]`` for never-started pending tasks).
        job_id: ``JobIDRaw`` (this task's own job id).
        state: parsed ``State`` (``CANCELLED by 0`` keeps the uid).
        exit_code, signal: from ``ExitCode`` ``3:0``.
        derived_exit_code: exit status part of ``DerivedExitCode``.
        elapsed_s: ``ElapsedRaw`` seconds of this attempt (when it is an unknown word: ``Elapsed`` parsed,
            else 0: an attempt Slurm cannot time never held its allocation for any time it bills).
        alloc_tres: ``AllocTRES`` as numbers (``billing``, ``cpu``, ``gres/gpu``, ``gres/shard``, ``node``).
        qos, slurm_partition, submit, start, end, node_list, name.
    """

    id: JobId
    job_id: int
    state: JobState
    exit_code: int | None
    signal: int | None
    derived_exit_code: int | None
    elapsed_s: float
    alloc_tres: Mapping[str, float]
    qos: str
    slurm_partition: str
    submit: datetime | None
    start: datetime | None
    end: datetime | None
    node_list: str
    name: str

    @property
    def array_job_id(self) -> int:
        return self.id.job_id

    @property
    def array_task_id(self) -> int | None:
        return self.id.task_id

    @property
    def gpus(self) -> float:
        """Whole GPUs allocated (``gres/gpu``; typed ``gres/gpu:<type>`` counted only when untyped is absent)."""
        if "gres/gpu" in self.alloc_tres:
            return self.alloc_tres["gres/gpu"]
        return sum(v for k, v in self.alloc_tres.items() if k.startswith("gres/gpu:"))

    @property
    def shards(self) -> float:
        """``gres/shard`` allocated (0 when none)."""
        return self.alloc_tres.get("gres/shard", 0.0)

    @property
    def billing(self) -> float:
        """The billing TRES (TRESBillingWeights applied), 0 when absent."""
        return self.alloc_tres.get("billing", 0.0)


def parse_sacct(text: str) -> list[AcctRow]:
    """Parse ``sacct --parsable2 --noheader -o SACCT_FORMAT`` output. Step lines (``123.batch``) are
    skipped, so ``--allocations`` is optional. Raises SlurmParseError."""
    rows: list[AcctRow] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = _split(line, len(SACCT_FIELDS), "sacct")
        try:
            jid = parse_job_id(f[0])
            if jid.step is not None:
                continue
            code, sig = parse_exit_code(f[3])
            dcode, _ = parse_exit_code(f[4])
            rows.append(
                AcctRow(
                    id=jid,
                    job_id=int(f[1].split(".")[0]),
                    state=parse_state(f[2], strict=False),
                    exit_code=code,
                    signal=sig,
                    derived_exit_code=dcode,
                    elapsed_s=_elapsed(f[6], f[5]),
                    alloc_tres=parse_tres(f[7]),
                    qos=f[8],
                    slurm_partition=f[9],
                    submit=parse_time(f[10]),
                    start=parse_time(f[11]),
                    end=parse_time(f[12]),
                    node_list=f[13],
                    name=f[14],
                )
            )
        except (ValueError, SlurmParseError) as e:
            raise SlurmParseError(f"sacct line {line!r}: {e}") from e
    return rows


#: sacct fields of the steps' usage (``sacct --parsable2 --noheader --jobs=… --format SACCT_STEP_FORMAT``, without
#: ``--allocations``): TRESUsageInAve/Max are filled on step lines only (SchedMD/slurm slurm-24-11-5-1
#: ``src/sacct/print.c`` PRINT_TRESUIA/PRINT_TRESUIM: JOBSTEP). Since 23.02 they hold ``gres/gpuutil``
#: (percent, printed as a number) and ``gres/gpumem`` (printed with a unit, ``2048M``) when GPUs are accounted
#: (``src/common/slurmdb_defs.c``; slurm.conf(5): "Setting gres/gpu will also set gres/gpumem and gres/gpuutil").
SACCT_STEP_FIELDS = ("JobID", "TRESUsageInAve", "TRESUsageInMax")
SACCT_STEP_FORMAT = ",".join(SACCT_STEP_FIELDS)


@dataclass(frozen=True)
class StepUsage:
    """One step line (``123_4.batch``): its id and usage TRES (``gres/gpumem`` in bytes, ``gres/gpuutil`` percent)."""

    id: JobId
    usage_ave: Mapping[str, float]
    usage_max: Mapping[str, float]


def parse_sacct_steps(text: str) -> list[StepUsage]:
    """Step lines of ``sacct --format SACCT_STEP_FORMAT`` (allocation lines skipped). TRES items whose
    value is not a number (``cpu=00:00:09``, a time) are left out. Raises SlurmParseError."""
    out: list[StepUsage] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = _split(line, len(SACCT_STEP_FIELDS), "sacct steps")
        jid = parse_job_id(f[0])
        if jid.step is None:
            continue
        out.append(StepUsage(jid, _usage_tres(f[1]), _usage_tres(f[2])))
    return out


def _usage_tres(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in text.strip().split(",") if text.strip() else []:
        try:
            out.update(parse_tres(item))
        except SlurmParseError:
            continue  # cpu=00:00:09 and other time-valued usage
    return out


def _elapsed(raw: str, elapsed: str) -> float:
    n = parse_count(raw)
    if n is not None:
        return n
    d = parse_duration(elapsed)
    return d if d is not None else 0


# ----------------------------------------------------------------------------- scontrol show config
_CONFIG_LINE = re.compile(r"^(?P<k>[A-Za-z][A-Za-z0-9_]*)\s*=\s?(?P<v>.*)$")


def parse_show_config(text: str) -> dict[str, str]:
    """``scontrol show config`` -> {"MaxArraySize": "1001", "SLURM_VERSION": "22.05.8", …} (first value wins;
    banner and plugin sub-sections without ``=`` are ignored)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _CONFIG_LINE.match(line.strip())
        if m and m.group("k") not in out:
            out[m.group("k")] = m.group("v").strip()
    return out


def max_array_size(config: Mapping[str, str]) -> int:
    """``MaxArraySize`` from a parsed config (the highest valid array index is this minus 1).
    Raises SlurmParseError when absent or not an integer."""
    try:
        return int(config["MaxArraySize"])
    except (KeyError, ValueError):
        raise SlurmParseError(f"MaxArraySize missing or not an integer: {config.get('MaxArraySize')!r}") from None


@dataclass(frozen=True)
class ArrayLimits:
    """The controller's job array limits (slurm.conf(5), SchedMD/slurm slurm-24-11-5-1
    ``doc/man/man5/slurm.conf.5``: MaxArraySize, default 1001, indices < it, ``0`` disables job arrays;
    ``SchedulerParameters=max_array_tasks=N`` caps the tasks of one array below it).

    Attributes:
        max_array_size: MaxArraySize.
        max_array_tasks: SchedulerParameters' max_array_tasks, None when not set.
    """

    max_array_size: int
    max_array_tasks: int | None = None

    @property
    def disabled(self) -> bool:
        """True when the site disabled job arrays (MaxArraySize=0)."""
        return self.max_array_size <= 0

    @property
    def tasks_per_array(self) -> int:
        """Most tasks one array of indices 0..n-1 may have: min(MaxArraySize, max_array_tasks); 0 when disabled."""
        if self.disabled:
            return 0
        return min(self.max_array_size, self.max_array_tasks) if self.max_array_tasks else self.max_array_size


def array_limits(config: Mapping[str, str]) -> ArrayLimits:
    """:class:`ArrayLimits` from a parsed ``scontrol show config``. Raises SlurmParseError when MaxArraySize
    is absent or not an integer, or max_array_tasks is not an integer."""
    tasks = None
    for item in (config.get("SchedulerParameters") or "").split(","):
        k, _, v = item.strip().partition("=")
        if k == "max_array_tasks":
            try:
                tasks = int(v)
            except ValueError:
                raise SlurmParseError(f"SchedulerParameters max_array_tasks is not an integer: {v!r}") from None
    return ArrayLimits(max_array_size(config), tasks)


def tracked_tres(config: Mapping[str, str]) -> frozenset[str]:
    """``AccountingStorageTRES`` as a set (``{"cpu", "mem", …, "gres/gpu"}``; typed ``gres/gpu:a100`` kept)."""
    return frozenset(t.strip() for t in (config.get("AccountingStorageTRES") or "").split(",") if t.strip())


def gpu_tres_tracked(config: Mapping[str, str]) -> bool:
    """True when sacct's AllocTRES carries GPUs: ``gres/gpu`` (or a typed ``gres/gpu:<type>``) is in
    AccountingStorageTRES (not by default: slurm.conf(5) lists billing, cpu, energy, mem, node, fs/disk, pages,
    vmem as the default TRES)."""
    return any(t == "gres/gpu" or t.startswith("gres/gpu:") for t in tracked_tres(config))


# ---------------------------------------------------------------------------------------------- sdiag
@dataclass(frozen=True)
class Sdiag:
    """Totals from ``sdiag`` since its last reset.

    Attributes:
        jobs_submitted, jobs_started, jobs_completed, jobs_canceled, jobs_failed: counters.
        rpc_by_type: ``REQUEST_SUBMIT_BATCH_JOB`` -> count.
        rpc_by_user: user name -> count.
    """

    jobs_submitted: int = 0
    jobs_started: int = 0
    jobs_completed: int = 0
    jobs_canceled: int = 0
    jobs_failed: int = 0
    rpc_by_type: Mapping[str, int] = field(default_factory=dict)
    rpc_by_user: Mapping[str, int] = field(default_factory=dict)

    @property
    def rpc_total(self) -> int:
        """All RPCs counted by message type."""
        return sum(self.rpc_by_type.values())


_SDIAG_COUNTER = re.compile(r"^Jobs (submitted|started|completed|canceled|failed):\s+(\d+)$")
#: one line of either RPC section, by message type or by user: ``NAME (ID) count:N ...``
_SDIAG_RPC = re.compile(r"^(?P<name>\S+)\s+\(\s*\d+\)\s+count:(?P<count>\d+)\b")


def parse_sdiag(text: str) -> Sdiag:
    """Parse ``sdiag`` text output (counters, RPCs by message type and by user)."""
    counters: dict[str, int] = {}
    by_type: dict[str, int] = {}
    by_user: dict[str, int] = {}
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        m = _SDIAG_COUNTER.match(line)
        if m:
            counters[m.group(1)] = int(m.group(2))
            continue
        if line.startswith("Remote Procedure Call statistics by message type"):
            section = "type"
            continue
        if line.startswith("Remote Procedure Call statistics by user"):
            section = "user"
            continue
        if line.startswith("Pending RPC statistics") or line.startswith("Remote Procedure Call statistics"):
            section = None
            continue
        if section == "type":
            m = _SDIAG_RPC.match(line)
            if m:
                by_type[m.group("name")] = int(m.group("count"))
        elif section == "user":
            m = _SDIAG_RPC.match(line)
            if m:
                by_user[m.group("name")] = int(m.group("count"))
    return Sdiag(
        jobs_submitted=counters.get("submitted", 0),
        jobs_started=counters.get("started", 0),
        jobs_completed=counters.get("completed", 0),
        jobs_canceled=counters.get("canceled", 0),
        jobs_failed=counters.get("failed", 0),
        rpc_by_type=by_type,
        rpc_by_user=by_user,
    )


# --------------------------------------------------------------------------------------------- sbatch
#: A Slurm cluster name as ``sbatch --parsable`` prints it and ``-M`` takes it.
CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def parse_sbatch_parsable(stdout: str) -> tuple[int, str | None]:
    """``sbatch --parsable`` stdout -> (job id, cluster or None): ``123`` -> (123, None); on a multi-cluster
    or federated setup ``123;gpu2`` -> (123, "gpu2"), the cluster every later squeue/sacct/scancel of the
    job must name with ``-M``. Fields after the cluster (``123;gpu2;extra``) are not part of it and are
    ignored. Raises SlurmParseError when the last non-empty line has no job id or a malformed cluster."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        raise SlurmParseError("sbatch --parsable printed nothing")
    fields = [f.strip() for f in lines[-1].split(";")]
    jid = fields[0]
    if not jid.isdigit():
        raise SlurmParseError(f"sbatch --parsable printed {lines[-1]!r}, not a job id")
    cluster = fields[1] if len(fields) > 1 else ""
    if cluster and not CLUSTER_NAME.match(cluster):
        raise SlurmParseError(f"sbatch --parsable printed {lines[-1]!r}: {cluster!r} is not a cluster name")
    return int(jid), (cluster or None)


#: ``sbatch --test-only`` lines (SchedMD/slurm ``src/api/allocate.c``, ``info("Job %u to start at …")``):
#: 22.05–24.11 ``Job N to start at T using P processors on nodes L in partition Q``; since 25.05 (tags
#: slurm-25-05-0-1 … slurm-26-05-0-1) ``Job N to start at T[ on cluster C] a using P processors on nodes L
#: in partition Q``; a multi-cluster will_run (every version) ``Job N to start at T using P processors on L``.
_TEST_ONLY = re.compile(
    r"Job (?P<job>\d+) to start at (?P<start>\S+)(?: on cluster (?P<cluster>\S+))?(?: a)? using (?P<cpus>\d+)"
    r" processors on (?:nodes )?(?P<nodes>\S+)(?: in partition (?P<part>\S+))?"
)


@dataclass(frozen=True)
class TestOnly:
    """``sbatch --test-only`` estimate: expected start (controller local time), CPUs, nodes, slurm partition,
    and the cluster Slurm >= 25.05 names (None before, and on a single cluster)."""

    job_id: int
    start: datetime | None
    processors: int
    nodes: str
    slurm_partition: str | None
    cluster: str | None = None


def parse_test_only(stderr: str) -> TestOnly:
    """Parse ``sbatch: Job 26 to start at 2026-11-30T00:30:00 using 1 processors on nodes vm in partition gpu``
    and the forms of later Slurm versions (see :data:`_TEST_ONLY`).

    Slurm 22.05 may print an absurd far-future date (year 6109) when the slurm partition has no time
    limit; callers should treat a start more than a year ahead as unknown. Raises SlurmParseError."""
    m = _TEST_ONLY.search(stderr)
    if not m:
        raise SlurmParseError(f"not an sbatch --test-only estimate: {stderr.strip()!r}")
    return TestOnly(
        job_id=int(m.group("job")),
        start=parse_time(m.group("start")),
        processors=int(m.group("cpus")),
        nodes=m.group("nodes"),
        slurm_partition=m.group("part"),
        cluster=m.group("cluster"),
    )


_SLURM_ERROR = re.compile(r"^(?:sbatch|squeue|sacct|scancel|scontrol|sacctmgr): error: (?P<msg>.*)$")


#: Lines a site's ``job_submit`` plugin prints before Slurm's own verdict (``Verification: ***PASSED***``,
#: ``Account: …``): they never say why a job was refused, so they are not the error.
_JOB_SUBMIT_VERDICT = re.compile(r"^Verification:\s*\*+PASSED\*+\s*$", re.I)
#: Slurm's own refusal lines that carry no ``<cmd>: error:`` prefix (``src/api/allocate.c``'s will-run
#: path prints ``allocation failure: <reason>``).
_BARE_REFUSAL = re.compile(r"^(?:allocation failure|Batch job submission failed):\s*(?P<msg>.+)$", re.I)


def error_message(stderr: str) -> str:
    """The most specific refusal in a Slurm command's stderr: the last ``<cmd>: error: …`` message or bare
    ``allocation failure: …`` / ``Batch job submission failed: …`` line (Slurm's prefix kept), leaving out a
    ``job_submit`` plugin's ``Verification: ***PASSED***`` (it printed its own verdict before Slurm refused the
    job: the refusal is the line after it); else the last non-empty line, else ''."""
    msgs: list[str] = []
    for ln in stderr.splitlines():
        m = _SLURM_ERROR.match(ln.strip())
        text = m.group("msg").strip() if m else (ln.strip() if _BARE_REFUSAL.match(ln.strip()) else "")
        if text and not _JOB_SUBMIT_VERDICT.match(text):
            msgs.append(text)
    if msgs:
        return msgs[-1]
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return lines[-1] if lines else ""
