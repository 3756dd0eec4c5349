"""The job array script and the manifest it reads.

The batch script is a constant (:data:`JOB_SCRIPT`): nothing about a step, a partition key or a path is
ever written into it. ``sbatch`` passes it three arguments, the Python interpreter, this file's path
and the manifest path, and task ``$SLURM_ARRAY_TASK_ID`` runs::

    <python> -I <.../dagster_gpu/slurm/script.py> <manifest.json>

(run by path in isolated mode so a task starts without importing the ``dagster_gpu`` package; only
stdlib is needed; a requeued attempt runs :data:`REQUEUE_MODULE` before the step)
which reads entry ``tasks[SLURM_ARRAY_TASK_ID]`` of the manifest and ``exec``s its ``argv`` with its
``env`` on top of the job's environment. So a partition key or file name only ever travels as JSON data
and as an argv element, and no shell parses it.

Manifest (JSON, mode 0600, written atomically)::

    {"version": 1, "batch": "<id>", "env_files": ["/home/u/.dagster-gpu.env"],
     "tasks": [{"launch_id": "...", "run_id": "...", "step_key": "...", "partition_key": "...",
                "argv": ["python", "-m", "dagster", "api", "execute_step"], "env": {"K": "V"}}, ...]}

Secrets: the manifest holds none. The PostgreSQL password reaches the worker either through the job's
environment (``sbatch`` exports the submitter's environment; the instance config refers to it as
``{env: DAGSTER_PG_PASSWORD}``) or from ``env_files``: ``KEY=VALUE`` files that must be readable by
their owner only (mode 0600 or stricter), else the task refuses to start.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Mapping, Sequence

MANIFEST_VERSION = 1

JOB_SCRIPT = """#!/bin/bash
# dagster-gpu job array script (constant text: per-task commands come from the manifest, argument 3).
# usage (by sbatch): <this script> <python interpreter> <dagster_gpu/slurm/script.py> <manifest.json>
set -eu
exec "$1" -I "$2" "$3"
"""

#: This file, passed to the job script as its second argument.
RUNNER = str(Path(__file__).resolve())
#: What a requeued attempt runs before the step (with the worker's interpreter): it skips a step that
#: already recorded its outcome and reruns any other (the Slurm backend's side, which reads Dagster's
#: event log; this file imports nothing beyond the standard library).
REQUEUE_MODULE = "dagster_gpu.executor.backends.slurm_requeue"


class ManifestError(RuntimeError):
    """The manifest is missing, malformed, or has no entry for this array task (message says which)."""


def write_job_script(directory: Path) -> Path:
    """Write :data:`JOB_SCRIPT` as ``<directory>/dagster-gpu-array.sh`` (0700) if absent or different."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "dagster-gpu-array.sh"
    if not path.exists() or path.read_text() != JOB_SCRIPT:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(JOB_SCRIPT)
        os.chmod(tmp, 0o700)
        os.replace(tmp, path)
    return path


def write_manifest(path: Path, batch: str, tasks: Sequence[Mapping], env_files: Sequence[str] = ()) -> Path:
    """Write the manifest atomically with mode 0600. ``tasks[i]`` needs ``argv`` (list of str) and ``env``."""
    for i, t in enumerate(tasks):
        argv = t.get("argv")
        if not isinstance(argv, (list, tuple)) or not argv or not all(isinstance(a, str) for a in argv):
            raise ManifestError(f"task {i}: argv must be a non-empty list of strings")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in dict(t.get("env", {})).items()):
            raise ManifestError(f"task {i}: env must map str to str")
    doc = {"version": MANIFEST_VERSION, "batch": batch, "env_files": list(env_files), "tasks": list(tasks)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)
    return path


def read_env_file(path: str) -> dict[str, str]:
    """``KEY=VALUE`` lines (``#`` comments, blank lines skipped). Raises ManifestError if the file is
    readable or writable by group/others, or missing."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ManifestError(f"env file {path}: {e}") from e
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ManifestError(f"env file {path} has mode {oct(st.st_mode & 0o777)}; it must be 0600 (owner only)")
    out: dict[str, str] = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        k, sep, v = line.partition("=")
        if sep and k.strip():
            out[k.strip()] = v
    return out


def task_entry(manifest: Mapping, task_id: int) -> Mapping:
    """Entry ``task_id`` of a parsed manifest. Raises ManifestError."""
    if manifest.get("version") != MANIFEST_VERSION:
        raise ManifestError(f"unsupported manifest version {manifest.get('version')!r}")
    tasks = manifest.get("tasks") or []
    if not 0 <= task_id < len(tasks):
        raise ManifestError(f"array task {task_id} has no manifest entry ({len(tasks)} tasks)")
    return tasks[task_id]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of one array task: exec the manifest entry of ``$SLURM_ARRAY_TASK_ID``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -I .../dagster_gpu/slurm/script.py MANIFEST.json", file=sys.stderr)
        return 2
    try:
        manifest = json.loads(Path(args[0]).read_text())
        task_id = int(os.environ["SLURM_ARRAY_TASK_ID"])
        entry = task_entry(manifest, task_id)
        env = dict(os.environ)
        for f in manifest.get("env_files", []):
            env.update(read_env_file(f))
        env.update(entry.get("env", {}))
    except (OSError, ValueError, KeyError, ManifestError) as e:
        print(f"dagster-gpu: cannot start array task from {args[0]}: {e}", file=sys.stderr)
        return 3
    print(
        f"dagster-gpu: array task {os.environ.get('SLURM_ARRAY_JOB_ID')}_{task_id} runs step "
        f"{entry.get('step_key')!r} of run {entry.get('run_id')} (partition {entry.get('partition_key')!r})",
        file=sys.stderr,
        flush=True,
    )
    restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    cmd = list(entry["argv"])
    if restarts > 0 and "DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS" in env:
        # a requeued attempt: the worker's interpreter first checks the run's event log (REQUEUE_MODULE)
        cmd = [cmd[0], "-m", REQUEUE_MODULE, str(entry.get("step_key") or ""), "--", *cmd]
    os.execvpe(cmd[0], cmd, env)
    return 127  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
