"""The job array script and the manifest it reads.

The batch script is a constant (:data:`JOB_SCRIPT`): nothing about a step, a partition key or a path is
ever written into it. ``sbatch`` passes it five arguments, the Python interpreter, this file's path,
the manifest path, the batch id and the manifest's SHA-256 (hex), and task ``$SLURM_ARRAY_TASK_ID``
runs, with umask 077::

    <python> -I <.../dagster_gpu/slurm/script.py> <manifest.json> <batch id> <manifest sha256>

(run by path in isolated mode so a task starts without importing the ``dagster_gpu`` package; only
stdlib is needed; a requeued attempt first runs the entry's ``requeue_module``, which the Slurm backend names)
which reads entry ``tasks[SLURM_ARRAY_TASK_ID]`` of the manifest and ``exec``s its ``argv`` with its
``env`` on top of the job's environment.

Signals: every step of the chain ``exec``s the next (the job script, this runner, the requeue module), so the
step worker runs as the batch shell's own process. A signal Slurm sends to the batch shell (``sbatch
--signal=B:USR1@<s>``, ``scancel --batch``) or to the job's steps (``scancel``, a preempting QOS's SIGCONT +
SIGTERM at the start of its ``GraceTime``, slurm.schedmd.com/preempt.html) reaches the worker itself, which
stops gracefully (:mod:`dagster_gpu.worker.preemption`); nothing in the script traps or forwards it, so the script
stays the constant below. So a partition key or file name only ever travels as JSON data
and as an argv element, and no shell parses it.

Before it runs anything the task verifies its manifest (``docs/security.md``): a regular file (not a
symlink) owned by the task's user and writable by nobody else, whose content hashes to the SHA-256
recorded at submit and whose ``batch`` is the batch id the array was submitted with (both arguments
live in the controller, out of reach of whoever can write the spool). Otherwise it prints why
(path, owner, group, mode or the mismatch) to its log and exits 3 without running anything, which
fails the step. It also makes its own log (``sbatch --output``) 0600. Arrays submitted before these
arguments existed pass only the manifest path; their tasks still get the owner and mode checks.

Manifest (JSON, mode 0600, written atomically; format unchanged by the checks above)::

    {"version": 1, "batch": "<id>", "env_files": ["/home/u/.dagster-gpu.env"],
     "tasks": [{"launch_id": "...", "run_id": "...", "step_key": "...", "covers": "3 partitions 'a'…'c'",
                "argv": ["python", "-m", "dagster_gpu.worker.step_main", "api", "execute_step"], "env": {"K": "V"},
                "requeue_module": "dagster_gpu.slurm.requeue"}, ...]}

Secrets: the manifest holds none. The PostgreSQL password reaches the worker either through the job's
environment (``sbatch`` exports the submitter's environment; the instance config refers to it as
``{env: DAGSTER_PG_PASSWORD}``) or from ``env_files``: ``KEY=VALUE`` files that must be readable by
their owner only (mode 0600 or stricter) and owned by the task's user, else the task refuses to start.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Mapping, Sequence

if __package__:
    from dagster_gpu.slurm import trust
elif "_dagster_gpu_slurm_trust" in sys.modules:  # carried in the job script text (slurm/object_runner.py)
    trust = sys.modules["_dagster_gpu_slurm_trust"]
else:  # run by path (python -I .../script.py) in an array task: load the sibling, not the package
    import importlib.util

    _spec = importlib.util.spec_from_file_location("_dagster_gpu_slurm_trust", Path(__file__).with_name("trust.py"))
    trust = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
    _spec.loader.exec_module(trust)  # type: ignore[union-attr]

MANIFEST_VERSION = 1

JOB_SCRIPT = """#!/bin/bash
# dagster-gpu job array script (constant text: per-task commands come from the manifest, argument 3).
# usage (by sbatch): <this script> <python> <dagster_gpu/slurm/script.py> <manifest.json> <batch id> <manifest sha256>
set -euo pipefail
umask 077
exec "$1" -I "$2" "${@:3}"
"""

#: SHA-256 (hex) of :data:`JOB_SCRIPT`: what the file must hash to when ``sbatch`` reads it.
JOB_SCRIPT_SHA256 = trust.sha256_hex(JOB_SCRIPT.encode())

#: This file, passed to the job script as its second argument.
RUNNER = str(Path(__file__).resolve())
#: Exit status of an array task that refused to start (bad or untrusted manifest, env file).
REFUSED_EXIT = 3


class TaskManifestError(RuntimeError):
    """The manifest is missing, malformed, or has no entry for this array task (message says which)."""


def write_job_script(directory: Path, name: str = "dagster-gpu-array.sh") -> Path:
    """(Re)write :data:`JOB_SCRIPT` as ``<directory>/<name>``, mode 0700, atomically: a new temp file
    (O_EXCL, unpredictable name) in the same directory, then ``rename`` over the old one. Returns the
    path; check it with :func:`verify_job_script` right before ``sbatch`` reads it."""
    from dagster_gpu.core.jsonfile import write_atomic  # the package's writer; an array task runs this file by path

    return write_atomic(directory / name, JOB_SCRIPT, mode=0o700)


def verify_job_script(path: Path) -> str:
    """Check the job script just before ``sbatch`` reads it: a regular file owned by this user that
    neither group nor others can write, whose content is :data:`JOB_SCRIPT`. Returns its SHA-256 (hex)
    to record with the submission. Raises trust.UntrustedPathError naming the path, owner, mode or the
    hashes."""
    digest = trust.sha256_hex(trust.read_trusted(path, os.geteuid(), what="job script"))
    if digest != JOB_SCRIPT_SHA256:
        raise trust.UntrustedPathError(
            f"refusing job script {path}: its sha256 {digest} is not that of dagster-gpu's job script "
            f"({JOB_SCRIPT_SHA256}); it changed after it was written"
        )
    return digest


def write_manifest(path: Path, batch: str, tasks: Sequence[Mapping], env_files: Sequence[str] = ()) -> Path:
    """Write the manifest atomically with mode 0600 (temp file created O_EXCL with an unpredictable
    name, then rename). ``tasks[i]`` needs ``argv`` (list of str) and ``env``. Hash the result with
    :func:`manifest_sha256` for the job script's arguments."""
    for i, t in enumerate(tasks):
        argv = t.get("argv")
        if not isinstance(argv, (list, tuple)) or not argv or not all(isinstance(a, str) for a in argv):
            raise TaskManifestError(f"task {i}: argv must be a non-empty list of strings")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in dict(t.get("env", {})).items()):
            raise TaskManifestError(f"task {i}: env must map str to str")
    from dagster_gpu.core.jsonfile import write_atomic  # the package's writer; an array task runs this file by path

    doc = {"version": MANIFEST_VERSION, "batch": batch, "env_files": list(env_files), "tasks": list(tasks)}
    return write_atomic(path, json.dumps(doc), mode=0o600)


def manifest_sha256(path: Path) -> str:
    """SHA-256 (hex) of the manifest we just wrote, read back with the owner and mode checks."""
    return trust.sha256_hex(trust.read_trusted(path, os.geteuid(), what="manifest"))


def load_manifest(path: str | Path, batch: str | None = None, sha256: str | None = None) -> dict:
    """Read and parse a manifest as an array task: it must be a regular file (not a symlink) owned by
    this process's user that neither group nor others can write (checked on the open file), hash to
    ``sha256`` and be for ``batch`` when those are given.

    Raises trust.UntrustedPathError (path, owner, group, mode, or the mismatch), FileNotFoundError,
    ValueError (not JSON)."""
    return parse_manifest(trust.read_trusted(path, os.getuid(), what="manifest"), str(path), batch, sha256)


def parse_manifest(data: bytes, where: str, batch: str | None = None, sha256: str | None = None) -> dict:
    """The manifest document in ``data`` (read from ``where``: a path or an object-store URL, for messages)
    once it hashes to ``sha256`` and is for ``batch`` (when given: both were recorded by the controller at
    submit, out of reach of whoever can write where the manifest lies).

    Raises trust.UntrustedPathError (the mismatch), ValueError (not a JSON object)."""
    if sha256 is not None and trust.sha256_hex(data) != sha256:
        raise trust.UntrustedPathError(
            f"refusing manifest {where}: its sha256 {trust.sha256_hex(data)} is not the {sha256} recorded "
            "when the job array was submitted " + ("(the object changed after the submission: someone else wrote it "
                                                   "under the prefix)" if "://" in where else "(the file changed after sbatch)")
        )
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError(f"manifest {where} is not a JSON object")
    if batch is not None and doc.get("batch") != batch:
        raise trust.UntrustedPathError(
            f"refusing manifest {where}: it is for batch {doc.get('batch')!r}, but this job array was "
            f"submitted with batch {batch!r}"
        )
    return doc


def make_own_output_private() -> None:
    """chmod 0600 this process's stdout/stderr when they are regular files this user owns (the
    ``sbatch --output`` log, which slurmstepd may have created with the submitter's umask)."""
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077:
                os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o700)
        except OSError:
            pass


def read_env_file(path: str) -> dict[str, str]:
    """``KEY=VALUE`` lines (``#`` comments, blank lines skipped). Raises TaskManifestError (naming the
    path, owner, group and mode) if the file is missing, not a regular file, not owned by this user,
    or readable or writable by group/others (checked on the open file)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise TaskManifestError(f"env file {path}: {e}") from e
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        problem = trust.file_problem(st, os.getuid())
        if problem is None and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            problem = "it must be 0600 (owner only)"
        if problem:
            raise TaskManifestError(f"env file {trust.describe(path, st)}: {problem}")
        text = f.read()
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        k, sep, v = line.partition("=")
        if sep and k.strip():
            out[k.strip()] = v
    return out


def task_entry(manifest: Mapping, task_id: int) -> Mapping:
    """Entry ``task_id`` of a parsed manifest. Raises TaskManifestError."""
    if manifest.get("version") != MANIFEST_VERSION:
        raise TaskManifestError(f"unsupported manifest version {manifest.get('version')!r}")
    tasks = manifest.get("tasks") or []
    if not 0 <= task_id < len(tasks):
        raise TaskManifestError(f"array task {task_id} has no manifest entry ({len(tasks)} tasks)")
    return tasks[task_id]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of one array task: exec the manifest entry of ``$SLURM_ARRAY_TASK_ID``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (1, 3):
        print("usage: python -I .../dagster_gpu/slurm/script.py MANIFEST.json [BATCH MANIFEST_SHA256]", file=sys.stderr)
        return 2
    os.umask(0o077)
    make_own_output_private()
    batch, sha256 = (args[1], args[2]) if len(args) == 3 else (None, None)
    try:
        manifest = load_manifest(args[0], batch, sha256)
        task_id = int(os.environ["SLURM_ARRAY_TASK_ID"])
        entry = task_entry(manifest, task_id)
        env = dict(os.environ)
        for f in manifest.get("env_files", []):
            env.update(read_env_file(f))
        env.update(entry.get("env", {}))
    except (OSError, ValueError, KeyError, TaskManifestError) as e:  # UntrustedPathError is an OSError
        print(
            f"dagster-gpu: refusing to start array task {os.environ.get('SLURM_ARRAY_JOB_ID')}_"
            f"{os.environ.get('SLURM_ARRAY_TASK_ID')} from {args[0]} (nothing was run): {e}",
            file=sys.stderr,
        )
        return REFUSED_EXIT
    print(
        f"dagster-gpu: array task {os.environ.get('SLURM_ARRAY_JOB_ID')}_{task_id} runs step "
        f"{entry.get('step_key')!r} of run {entry.get('run_id')} ({entry.get('covers', '')})",
        file=sys.stderr,
        flush=True,
    )
    cmd = task_command(entry, env, int(os.environ.get("SLURM_RESTART_COUNT") or 0))
    os.execvpe(cmd[0], cmd, env)
    return 127  # pragma: no cover


def task_command(entry: Mapping, env: Mapping[str, str], restarts: int) -> list[str]:
    """The argv an array task runs for manifest ``entry``: its ``argv``, or, for a requeued attempt
    (``restarts`` = ``SLURM_RESTART_COUNT`` >= 1) of a step worker, ``<python> -m <requeue_module> <step key> --
    <argv...>``: the module the Slurm backend named skips a step that already recorded its outcome (it reads
    Dagster's event log; this file imports nothing beyond the standard library)."""
    cmd = list(entry["argv"])
    requeue_module = entry.get("requeue_module")
    if restarts > 0 and requeue_module and "DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS" in env:
        cmd = [cmd[0], "-m", str(requeue_module), str(entry.get("step_key") or ""), "--", *cmd]
    return cmd


if __name__ == "__main__":
    sys.exit(main())
