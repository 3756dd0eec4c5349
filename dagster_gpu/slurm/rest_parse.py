"""slurmrestd JSON -> the row types the CLI path produces (pure, no I/O).

What slurmrestd serves is read here, never CLI text: ``/slurm/<v>/job/<array job id>`` ->
[:class:`~dagster_gpu.slurm.parse.QueueRow`], ``/slurmdb/<v>/jobs/?step=<id>&show_duplicates`` ->
[:class:`~dagster_gpu.slurm.parse.AcctRow`] and [:class:`~dagster_gpu.slurm.parse.StepUsage`],
``/slurm/<v>/nodes/`` -> [:class:`~dagster_gpu.slurm.gres.NodeGres`], the submit response -> a job id,
sbatch options -> a ``job/submit`` job description.

Versions (``data_parser`` plugins, the ``v0.0.NN`` in every path): :data:`SUPPORTED` lists what this module
reads; :func:`pick_version` takes the newest of them that the server's ``/openapi/v3`` lists. What changed
between them and is handled here:

- job states are lists (``["PENDING", "REQUEUED"]``: the base state then its flags) since v0.0.40; the CLI
  prints one name, the first flag in ``job_state_string()``'s order (SchedMD/slurm, tag slurm-24-11-5-1,
  ``src/common/slurm_protocol_defs.c``), else the base: :func:`state_name` does the same, and an unknown name
  makes that row's state UNKNOWN (:func:`~dagster_gpu.slurm.states.parse_state` with ``strict=False``), as
  on the CLI path;
- integers that may be unset or unlimited are ``{"set": bool, "infinite": bool, "number": int}`` objects
  (v0.0.40 on); a plain int is read too (:func:`number`);
- v0.0.43 (Slurm 25.05) and v0.0.44 (25.11) keep these shapes for every field read here
  (``src/plugins/data_parser/v0.0.43/parsers.c`` at slurm-25-05-8-1, ``v0.0.44/parsers.c`` at slurm-25-11-7-1:
  the same UINT32_NO_VAL / TIMESTAMP_NO_VAL / JOB_STATE parsers for these fields); v0.0.44 adds the job state
  flag EXPEDITING, which the CLI prints as the state and this module as well (UNKNOWN for that row). The
  fixtures under ``tests/data/slurm/rest/v0.0.43`` and ``v0.0.44`` are written from those files.

An array's accounting record of the tasks that never left it (cancelled while pending) names them in
``array.task`` as a hex bitmap (``0x2C``: tasks 2, 3, 5) on the 24.11 slurmrestd: :func:`task_bitmap` decodes it to the
``123_[2-3,5%2]`` sacct prints (recorded: ``tests/data/slurm/rest/v0.0.42/slurmdb_jobs_terminated.json``).

Times: slurmrestd sends UNIX seconds; they become naive local ``datetime`` as the CLI prints them (0 or unset ->
None). Memory TRES counts are MiB in slurmdbd's records and become bytes, as :func:`parse.parse_tres` gives.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

from dagster_gpu.slurm import gres as G
from dagster_gpu.slurm.ids import compress_indices, parse_array_task_field, parse_job_id
from dagster_gpu.slurm.parse import AcctRow, QueueRow, SlurmParseError, StepUsage, parse_duration
from dagster_gpu.slurm.states import JobState, parse_state

#: data_parser versions this module reads, oldest first (v0.0.40-v0.0.42: Slurm 24.11, live in the tests;
#: v0.0.43: 25.05, v0.0.44: 25.11, from fixtures).
SUPPORTED = ("v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44")

#: The job state flags ``job_state_string()`` names before the base state, in its order (SchedMD/slurm
#: src/common/slurm_protocol_defs.c at slurm-24-11-5-1; slurm-25-11-7-1 adds EXPEDITING after CONFIGURING):
#: what squeue ``%T`` prints for a job with that flag.
STATE_FLAG_ORDER = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "EXPEDITING", "RESIZING", "REQUEUED", "REQUEUE_FED",
                    "REQUEUE_HOLD", "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING")

_PATH_VERSION = re.compile(r"^/slurm(?:db)?/(v0\.0\.\d+)/")


class NoCommonVersion(ValueError):
    """The server serves none of :data:`SUPPORTED` (the message lists what it serves)."""


def served_versions(openapi: Mapping[str, Any]) -> list[str]:
    """The data_parser versions in an ``/openapi/v3`` document's paths (``/slurm/v0.0.42/jobs/``), sorted."""
    found = {m.group(1) for p in (openapi.get("paths") or {}) for m in [_PATH_VERSION.match(p)] if m}
    return sorted(found, key=_vkey)


def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.lstrip("v").split("."))


def pick_version(served: Iterable[str], supported: Sequence[str] = SUPPORTED, wanted: str | None = None) -> str:
    """The newest version both sides know, or ``wanted`` when given and served. Raises NoCommonVersion."""
    served = sorted(set(served), key=_vkey)
    if wanted:
        if wanted in served and wanted in supported:
            return wanted
        raise NoCommonVersion(f"slurmrestd data_parser {wanted} asked for, but the server serves {served or 'none'} "
                              f"and this client reads {list(supported)}")
    common = [v for v in served if v in supported]
    if not common:
        raise NoCommonVersion(f"slurmrestd serves data_parser {served or 'none'}; this client reads {list(supported)}")
    return common[-1]


def number(v: Any) -> int | None:
    """An integer field: a plain int, or ``{"set", "infinite", "number"}`` (v0.0.40 on) -> its number when set
    and finite, else None. Raises SlurmParseError for anything else."""
    if v is None:
        return None
    if isinstance(v, bool):
        raise SlurmParseError(f"not a Slurm number: {v!r}")
    if isinstance(v, (int, float)):
        return int(v)
    if isinstance(v, Mapping) and "number" in v:
        if not v.get("set", True) or v.get("infinite", False):
            return None
        return int(v["number"])
    raise SlurmParseError(f"not a Slurm number: {v!r}")


def timestamp(v: Any) -> datetime | None:
    """UNIX seconds (int or number object) -> naive local datetime; 0/unset -> None."""
    n = number(v)
    return datetime.fromtimestamp(n) if n else None


def state_name(v: Any) -> str:
    """A job state list (``["PENDING", "REQUEUED"]``) -> the one name squeue/sacct print (``REQUEUED``); a
    string (older versions) as it is; [] -> ``""`` (unknown)."""
    if isinstance(v, str):
        return v
    names = [str(x).upper() for x in (v or [])]
    for flag in STATE_FLAG_ORDER:
        if flag in names[1:]:
            return flag
    return names[0] if names else ""


def job_state(v: Any) -> JobState:
    """:func:`state_name` parsed like the CLI path's states (an unknown name -> UNKNOWN for this row only)."""
    return parse_state(state_name(v), strict=False)


def _errors(doc: Mapping[str, Any]) -> list[str]:
    out = []
    for e in doc.get("errors") or []:
        if isinstance(e, Mapping):
            words = [str(e[k]) for k in ("description", "error") if e.get(k)]
            out.append(": ".join(dict.fromkeys(words)) or str(e))
        else:
            out.append(str(e))
    return out


def error_text(doc: Mapping[str, Any]) -> str:
    """The ``errors`` of a response joined (``''`` when none)."""
    return "; ".join(_errors(doc))


# ---------------------------------------------------------------------------------------------- queue
def queue_rows(doc: Mapping[str, Any]) -> list[QueueRow]:
    """The ``jobs`` of a ``/slurm/<v>/job/<id>`` (or ``/jobs/``) response as ``squeue --array`` rows: one per
    array task, the pending ones included (an array's record of its pending tasks, ``array_task_string``
    ``2-5``, becomes one row per task, each with the array job id as its job id, as squeue ``--array``
    prints them). Raises SlurmParseError."""
    return _per_job(doc, "job", _queue_rows)


def _per_job(doc: Mapping[str, Any], what: str, rows_of) -> list:
    """``rows_of(job)`` for each of ``doc``'s ``jobs``, concatenated; a job that does not parse raises
    SlurmParseError naming it (``slurmrestd <what> <job id>``)."""
    rows = []
    for j in doc.get("jobs") or []:
        try:
            rows.extend(rows_of(j))
        except (KeyError, TypeError, ValueError) as e:
            raise SlurmParseError(f"slurmrestd {what} {j.get('job_id') if isinstance(j, Mapping) else j!r}: {e}") from e
    return rows


def _queue_rows(j: Mapping[str, Any]) -> list[QueueRow]:
    job_id = int(number(j["job_id"]))  # type: ignore[arg-type]
    aid = number(j.get("array_job_id")) or 0
    task = number(j.get("array_task_id"))
    pending_tasks = str(j.get("array_task_string") or "")
    if aid and pending_tasks:
        ranges, _ = parse_array_task_field(pending_tasks)
        tasks = [t for lo, hi in ranges for t in range(lo, hi + 1)]
    elif aid and task is not None:
        tasks = [task]
    else:
        tasks = []
    common = dict(
        state=job_state(j.get("job_state")),
        reason=str(j.get("state_reason") or "None"),
        start=timestamp(j.get("start_time")),
        qos=str(j.get("qos") or ""),
        slurm_partition=str(j.get("partition") or ""),
        tres_per_node=str(j.get("tres_per_node") or "N/A"),
        name=str(j.get("name") or ""),
    )
    if not tasks:
        return [QueueRow(id=parse_job_id(str(job_id)), job_id=job_id, array_job_id=job_id, array_task_ids=(),
                         throttle=None, **common)]  # type: ignore[arg-type]
    return [QueueRow(id=parse_job_id(f"{aid}_{t}"), job_id=job_id, array_job_id=aid, array_task_ids=((t, t),),
                     throttle=None, **common) for t in tasks]  # type: ignore[arg-type]


def pending_tres_per_node(doc: Mapping[str, Any], slurm_partition: str | None) -> list[str]:
    """The tres-per-node of every PENDING job and array task of a ``/jobs/`` response, in ``slurm_partition`` when given: what :meth:`SlurmClient.pending_gres` returns."""
    out = []
    for r in queue_rows(doc):
        if r.state.name != "PENDING" or (slurm_partition and slurm_partition not in r.slurm_partition.split(",")):
            continue
        out.append(r.tres_per_node)
    return out


# ---------------------------------------------------------------------------------------------- accounting
def _tres(items: Any, mem_mib: bool = False) -> dict[str, float]:
    """slurmdbd TRES items ``[{"type": "gres", "name": "gpu", "count": 1}]`` -> ``{"gres/gpu": 1.0}`` (with
    ``mem_mib``, an allocation's ``mem`` MiB -> bytes; usage figures are bytes already; negative counts,
    slurmdbd's "not set", left out)."""
    out: dict[str, float] = {}
    for t in items or []:
        kind, name, count = str(t.get("type") or ""), str(t.get("name") or ""), t.get("count")
        if count is None or number(count) is None or number(count) < 0:  # type: ignore[operator]
            continue
        key = f"{kind}/{name}" if name else kind
        value = float(number(count))  # type: ignore[arg-type]
        out[key] = value * 1024**2 if key == "mem" and mem_mib else value
    return out


def acct_rows(doc: Mapping[str, Any]) -> list[AcctRow]:
    """The ``jobs`` of a ``/slurmdb/<v>/jobs/`` (or ``job/<id>``) response as sacct ``--allocations
    --duplicates`` rows (one per attempt slurmdbd returned). Raises SlurmParseError."""
    return _per_job(doc, "accounting job", lambda j: [_acct_row(j)])


def _acct_row(j: Mapping[str, Any]) -> AcctRow:
    job_id = int(number(j["job_id"]))  # type: ignore[arg-type]
    arr = j.get("array") or {}
    aid, task, tasks = number(arr.get("job_id")) or 0, number(arr.get("task_id")), str(arr.get("task") or "")
    if aid and task is not None:
        text = f"{aid}_{task}"
    elif aid and tasks:  # an array's record of the tasks that never left it (cancelled while pending): sacct's 123_[2-3,5]
        limit = number(((((arr.get("limits") or {}).get("max") or {}).get("running") or {}).get("tasks")))
        text = f"{aid}_[{task_bitmap(tasks)}{f'%{limit}' if limit else ''}]"
    else:
        text = str(job_id)
    t = j.get("time") or {}
    code = j.get("exit_code") or {}
    sig = (code.get("signal") or {}).get("id")
    dcode = j.get("derived_exit_code") or {}
    state = j.get("state") or {}
    return AcctRow(
        id=parse_job_id(text),
        job_id=job_id,
        state=job_state(state.get("current") if isinstance(state, Mapping) else state),
        exit_code=number(code.get("return_code")),
        signal=number(sig) if sig is not None else None,
        derived_exit_code=number(dcode.get("return_code")),
        elapsed_s=float(number(t.get("elapsed")) or 0),
        alloc_tres=_tres((j.get("tres") or {}).get("allocated"), mem_mib=True),
        qos=str(j.get("qos") or ""),
        slurm_partition=str(j.get("partition") or ""),
        submit=timestamp(t.get("submission")),
        start=timestamp(t.get("start")),
        end=timestamp(t.get("end")),
        node_list=str(j.get("nodes") or ""),
        name=str(j.get("name") or ""),
    )


def task_bitmap(text: str) -> str:
    """slurmdbd's array task string, a hex bitmap (``0x2C``: bits 2, 3 and 5) as the 24.11 slurmrestd sends it
    (sacct prints it decoded: ``2-3,5``), -> ``2-3,5``; text that is already ranges is returned as is."""
    t = text.strip()
    if not t.lower().startswith("0x"):
        return t
    bits = int(t, 16)
    return compress_indices(i for i in range(bits.bit_length()) if bits >> i & 1)


def step_usage(doc: Mapping[str, Any]) -> list[StepUsage]:
    """Each step's usage TRES (``tres.requested.average`` / ``max``: sacct's TRESUsageInAve/Max) of a
    ``/slurmdb/<v>/jobs/`` response, keyed like the CLI path (``gres/gpuutil``)."""
    out = []
    for j in doc.get("jobs") or []:
        for s in j.get("steps") or []:
            sid = str((s.get("step") or {}).get("id") or "")
            if not sid:
                continue
            req = (s.get("tres") or {}).get("requested") or {}
            out.append(StepUsage(id=parse_job_id(_step_text(j, sid)), usage_ave=_tres(req.get("average")), usage_max=_tres(req.get("max"))))
    return out


def _step_text(j: Mapping[str, Any], sid: str) -> str:
    """``251.batch`` of array task 250_0 -> ``250_0.batch`` (sacct prints steps under the task's id)."""
    arr = j.get("array") or {}
    aid, task = number(arr.get("job_id")) or 0, number(arr.get("task_id"))
    if aid and task is not None:
        _, _, step = sid.partition(".")
        return f"{aid}_{task}.{step}" if step else f"{aid}_{task}"
    return sid


def tracked_tres(doc: Mapping[str, Any]) -> list[str]:
    """``/slurmdb/<v>/tres/``: the TRES slurmdbd tracks (``cpu``, ``gres/gpu``…), as AccountingStorageTRES names."""
    return [f"{t['type']}/{t['name']}" if t.get("name") else str(t["type"]) for t in doc.get("TRES") or doc.get("tres") or []]


# ---------------------------------------------------------------------------------------------- nodes
def node_gres(doc: Mapping[str, Any], slurm_partition: str | None) -> list[G.NodeGres]:
    """``/slurm/<v>/nodes/`` -> every node (of ``slurm_partition`` when given) with its state (``idle``,
    ``idle+drain``: the base state then its flags, as :func:`gres.node_usable` reads) and GRES."""
    out = []
    for n in doc.get("nodes") or []:
        if slurm_partition and slurm_partition not in (n.get("partitions") or []):
            continue
        states = n.get("state") or []
        state = "+".join(str(s).lower() for s in ([states] if isinstance(states, str) else states)) or "unknown"
        out.append(G.NodeGres(str(n.get("name") or ""), state, tuple(G.parse_gres(str(n.get("gres") or ""))),
                              tuple(G.parse_gres(str(n.get("gres_used") or "")))))
    return out


# ---------------------------------------------------------------------------------------------- submit
#: sbatch options a job description field takes as it is (``--account=research`` -> ``"account": "research"``).
_TEXT_OPTIONS = {"--account": "account", "--partition": "partition", "--qos": "qos", "--job-name": "name",
                 "--output": "standard_output", "--error": "standard_error", "--constraint": "constraints",
                 "--array": "array", "--reservation": "reservation", "--clusters": "clusters", "-M": "clusters",
                 "--gpus": "tres_per_job", "--comment": "comment", "--dependency": "dependency"}


class UnsupportedOption(ValueError):
    """An sbatch option the rest transport does not turn into a job description field."""


def job_description(options: Sequence[str], script: str, argv: Sequence[str], environment: Mapping[str, str],
                    cwd: str) -> dict[str, Any]:
    """The ``job/submit`` body for sbatch ``options`` (argv items ``--name=value``), the job script's text,
    the script's arguments (``argv[0]`` is its ``$0``) and its whole environment (slurmrestd exports nothing
    of its own; ``SLURM_*`` names are Slurm's to set). Understood: ``--account --partition --qos --job-name
    --output --error --constraint --array --reservation --clusters/-M --gpus --comment --dependency --gres
    (-> tres_per_node gres/<...>) --time (minutes) --requeue --no-requeue --signal=[B:]SIG@secs --exclusive``.
    Raises UnsupportedOption for anything else (the message names it)."""
    job: dict[str, Any] = {"script": script, "argv": list(argv), "current_working_directory": cwd,
                           "environment": [f"{k}={v}" for k, v in sorted(environment.items())]}
    for opt in options:
        name, sep, value = opt.partition("=")
        if name in _TEXT_OPTIONS and sep:
            job[_TEXT_OPTIONS[name]] = value
        elif name == "--gres" and sep:
            job["tres_per_node"] = ",".join(g if g.startswith("gres") else f"gres/{g}" for g in value.split(","))
        elif name == "--time" and sep:
            job["time_limit"] = {"set": True, "infinite": False, "number": _minutes(value)}
        elif name in ("--requeue", "--no-requeue") and not sep:
            job["requeue"] = name == "--requeue"
        elif name == "--exclusive" and not sep:
            job["shared"] = ["none"]
        elif name == "--signal" and sep:
            job.update(_signal(value))
        else:
            raise UnsupportedOption(f"sbatch option {opt!r} has no slurmrestd job description field here (transport rest)")
    return {"job": job}


def _minutes(text: str) -> int:
    s = parse_duration(text)
    if s is None:
        raise UnsupportedOption(f"--time={text}: no limit")
    return max(1, int(round(s / 60)))


def _signal(value: str) -> dict[str, Any]:
    """``B:USR1@60`` -> kill_warning_signal/delay/flags (sbatch(1) --signal: ``B:`` signals the batch shell only)."""
    flags, sig = [], value
    if ":" in value.split("@")[0]:
        opt, _, sig = value.partition(":")
        if "B" in opt:
            flags.append("BATCH_JOB")
    name, _, delay = sig.partition("@")
    return {"kill_warning_signal": name.removeprefix("SIG"),
            "kill_warning_delay": {"set": True, "infinite": False, "number": int(delay or 60)},
            "kill_warning_flags": flags}


def submitted_job_id(doc: Mapping[str, Any]) -> int:
    """The job id (array job id) of a ``job/submit`` response. Raises SlurmParseError when there is none."""
    jid = number(doc.get("job_id")) if doc.get("job_id") is not None else None
    if not jid:
        raise SlurmParseError(f"slurmrestd job/submit answered no job id: {error_text(doc) or doc}")
    return jid


def slurm_release(doc: Mapping[str, Any]) -> str:
    """``meta.slurm.release`` (``24.11.5``) of any response, '' when absent."""
    return str(((doc.get("meta") or {}).get("slurm") or {}).get("release") or "")
