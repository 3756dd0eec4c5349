"""The array task runner when the compute nodes share no file system with the Dagster host (``transport: rest``
with ``relay_url``): it travels in the job script text, fetches the manifest from the object store and ships the
task's log there. Standard library plus fsspec (with the store's driver, e.g. s3fs) from the worker's Python.

The job script (:func:`job_script`) is constant text: a bash script holding this runner's source with the
sources it needs (:mod:`dagster_gpu.slurm.trust`, :mod:`dagster_gpu.core.object_parts`, :mod:`dagster_gpu.slurm.script`,
this file) as Python string literals, which ``exec "$1" -I -c "$RUNNER" "${@:2}"`` runs (isolated mode: nothing
from the working directory or ``PYTHONPATH``). Nothing about a step, a partition key or a path is in it.
slurmrestd submits its text with the job (``job.script`` of ``job/submit``, slurm.schedmd.com/rest_api.html);
``job.argv`` carries, after the interpreter::

    <manifest URL> <batch id> <manifest sha256> <storage options JSON> <env files JSON> <log prefix URL>

Each array task then:

1. loads ``env_files`` (``KEY=VALUE``, mode 0600, owned by the task's user: :func:`~dagster_gpu.slurm.script.
   read_env_file`) into its environment: the object store's credentials come from there or from the node's own
   provider chain (instance profile, workload identity), never from the script, the argv or the manifest;
2. opens its log, ``<log prefix>/<task id>.log/`` (parts ``00000001.log``, … of raw bytes:
   :mod:`dagster_gpu.core.object_parts`; a requeued attempt continues after the highest part), and ships its own
   messages and the step worker's output there at most every :data:`SHIP_INTERVAL_S` seconds and at the end;
   the same bytes go to the task's ``sbatch --output`` file on the node;
3. fetches the manifest and checks it as the spool's manifest is checked: its SHA-256 and batch id must be those
   recorded at submit (:func:`~dagster_gpu.slurm.script.parse_manifest`), so a manifest someone else wrote under the
   prefix is refused; a refusal prints why, runs nothing and exits :data:`~dagster_gpu.slurm.script.REFUSED_EXIT`;
4. runs the entry's command (:func:`~dagster_gpu.slurm.script.task_command`, the requeue module first on a requeued
   attempt) as its child with ``TMPDIR`` a new node-local scratch directory (0700 under the node's ``$TMPDIR`` or
   /tmp, removed at the end), forwarding SIGUSR1, SIGTERM, SIGINT and SIGCONT to it;
5. exits with the child's status, or ends by the child's signal.

Signals: a warning signal for the batch shell (``sbatch --signal=B:USR1@<s>``, ``scancel --batch``) reaches this
runner, which forwards it; ``scancel`` and a preempting QOS signal every process of the job step (slurmstepd's
proctrack), so the worker may get SIGTERM twice, which :class:`~dagster_gpu.worker.preemption.GracefulStop` treats
as one stop. The runner itself keeps running until the worker's output ends, so the log's last lines are shipped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

if __package__:
    from dagster_gpu.core import object_parts as parts
    from dagster_gpu.slurm import script, trust
else:  # carried in the job script: the bundle loaded these first (see job_script)
    trust = sys.modules["_dagster_gpu_slurm_trust"]
    parts = sys.modules["_dagster_gpu_core_object_parts"]
    script = sys.modules["_dagster_gpu_slurm_script"]

#: Seconds between two uploads of a busy task's log.
SHIP_INTERVAL_S = 1.0
#: What the runner forwards to the step worker.
FORWARDED = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGCONT)
#: Where the heredoc holding the runner ends (never a line of the sources: checked by job_script).
_END = "DAGSTER_GPU_RUNNER_END"


def log_prefix(prefix: str, task_id: int | str) -> str:
    """``<prefix>/<task id>.log``: where array task ``task_id`` ships its log (a prefix of parts)."""
    return f"{prefix.rstrip('/')}/{int(task_id)}.log"


class LogShipper:
    """Ships bytes to the object-store log ``url`` (a prefix of ``<seq>.log`` parts) from a daemon thread, at most
    every ``interval_s`` and at :meth:`close`. An upload that fails is retried with the next one; close raises
    OSError when its last upload fails."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None, interval_s: float = SHIP_INTERVAL_S):
        import fsspec

        self.url = url
        self._fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        self._root = root.rstrip("/")
        try:
            names = [str(e) for e in self._fs.ls(self._root, detail=False, refresh=True)]
        except FileNotFoundError:
            names = []
        self._next = parts.next_sequence(names, parts.LOG_SUFFIX)
        self._buf = bytearray()
        self._cond = threading.Condition()
        self._closed = False
        self._interval = interval_s
        self._thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)
        self._thread.start()

    def write(self, data: bytes) -> None:
        with self._cond:
            self._buf += data

    def _ship(self) -> None:
        with self._cond:
            data, self._buf = bytes(self._buf), bytearray()
        if not data:
            return
        try:
            self._fs.pipe_file(f"{self._root}/{parts.part_name(self._next, parts.LOG_SUFFIX)}", data)
        except BaseException:
            with self._cond:
                self._buf[:0] = data
            raise
        self._next += 1

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._cond.wait_for(lambda: self._closed, timeout=self._interval):
                    return
            try:
                self._ship()
            except Exception:  # noqa: BLE001 - kept for the next try; close() raises if it persists
                pass

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        try:
            self._ship()
        except Exception as e:
            raise OSError(f"task log {self.url}: could not upload its last lines: {type(e).__name__}: {e}") from e


def fetch(url: str, storage_options: Mapping[str, Any] | None) -> bytes:
    """The bytes of object ``url``. Raises FileNotFoundError, OSError."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    return fs.cat_file(path)


def _say(out, shipper: LogShipper | None, text: str) -> None:
    data = (text.rstrip("\n") + "\n").encode()
    out.write(data)
    out.flush()
    if shipper is not None:
        shipper.write(data)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of one array task (see the module doc). Returns the exit status (or ends by the worker's
    signal)."""
    args = list(sys.argv[1:] if argv is None else argv)
    out = sys.stdout.buffer
    if len(args) != 6:
        _say(out, None, "usage: <job script> <python> MANIFEST_URL BATCH SHA256 STORAGE_OPTIONS_JSON ENV_FILES_JSON "
                        "LOG_PREFIX")
        return 2
    manifest_url, batch, sha256, options_json, env_files_json, prefix = args
    os.umask(0o077)
    script.make_own_output_private()
    job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID", "")
    label = f"array task {job}_{task}"
    shipper = None
    try:
        storage_options = json.loads(options_json)
        env = dict(os.environ)
        for f in json.loads(env_files_json):
            env.update(script.read_env_file(f))
        os.environ.update(env)  # the object store's credentials, for this process's fsspec too
        shipper = LogShipper(log_prefix(prefix, task), storage_options)
        manifest = script.parse_manifest(fetch(manifest_url, storage_options), manifest_url, batch, sha256)
        entry = script.task_entry(manifest, int(task))
        env.update(entry.get("env", {}))
    except (OSError, ValueError, KeyError, TypeError, ImportError, script.TaskManifestError) as e:
        _say(out, shipper, f"dagster-gpu: refusing to start {label} from {manifest_url} (nothing was run): {e}")
        if shipper is not None:
            try:
                shipper.close()
            except OSError as ship_error:
                _say(out, None, str(ship_error))
        return script.REFUSED_EXIT
    _say(out, shipper, f"dagster-gpu: {label} runs step {entry.get('step_key')!r} of run {entry.get('run_id')} "
                       f"({entry.get('covers', '')}), manifest {manifest_url}, log {shipper.url}")
    scratch = tempfile.mkdtemp(prefix=f"dagster-gpu-{job}_{task}-", dir=os.environ.get("TMPDIR") or "/tmp")
    env["TMPDIR"] = scratch
    cmd = script.task_command(entry, env, int(os.environ.get("SLURM_RESTART_COUNT") or 0))
    rc = _run_shipping(cmd, env, out, shipper)
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        shipper.close()
    except OSError as e:
        _say(out, None, str(e))
    if rc < 0:  # end as the worker did, so Slurm records the signal
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    return rc


def _run_shipping(cmd: list[str], env: Mapping[str, str], out, shipper: LogShipper) -> int:
    """Run ``cmd`` with its stdout and stderr going to ``out`` and ``shipper``, forwarding :data:`FORWARDED`;
    returns its status (``-N`` for signal N)."""
    try:
        child = subprocess.Popen(cmd, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT)
    except OSError as e:
        _say(out, shipper, f"dagster-gpu: could not start {cmd[0]}: {e}")
        return 127
    previous = {s: signal.signal(s, lambda signum, _frame: child.send_signal(signum)) for s in FORWARDED}
    try:
        fd = child.stdout.fileno()
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except InterruptedError:  # pragma: no cover - PEP 475 retries it
                continue
            if not chunk:
                break
            out.write(chunk)
            out.flush()
            shipper.write(chunk)
        return child.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def job_script() -> str:
    """The constant job script of this mode (see the module doc). Raises RuntimeError if a source holds the
    heredoc's end line."""
    package = Path(__file__).resolve().parents[1]
    sources = {
        "_dagster_gpu_slurm_trust": (package / "slurm" / "trust.py").read_text(),
        "_dagster_gpu_core_object_parts": (package / "core" / "object_parts.py").read_text(),
        "_dagster_gpu_slurm_script": (package / "slurm" / "script.py").read_text(),
        "_dagster_gpu_slurm_object_runner": Path(__file__).resolve().read_text(),
    }
    bundle = "\n".join([
        "import sys, types",
        f"SOURCES = {sources!r}",
        "for _name, _src in SOURCES.items():",
        "    _m = types.ModuleType(_name)",
        "    _m.__file__ = '<dagster-gpu job script: ' + _name + '>'",
        "    sys.modules[_name] = _m",
        "    exec(compile(_src, _m.__file__, 'exec'), _m.__dict__)",
        "sys.exit(sys.modules['_dagster_gpu_slurm_object_runner'].main())",
    ])
    if any(line.strip() == _END for line in bundle.splitlines()):
        raise RuntimeError(f"a runner source holds the line {_END}")
    return (
        "#!/bin/bash\n"
        "# dagster-gpu job array script, nothing shared (constant text: per-task commands come from the manifest\n"
        "# on the object store, argument 2; the runner below is dagster_gpu/slurm/object_runner.py and its modules).\n"
        "# usage (by slurmrestd): <this script> <python> <manifest URL> <batch id> <manifest sha256>\n"
        "#   <storage options JSON> <env files JSON> <log prefix URL>\n"
        "set -euo pipefail\n"
        "umask 077\n"
        f"read -r -d '' RUNNER <<'{_END}' || true\n"
        f"{bundle}\n"
        f"{_END}\n"
        'exec "$1" -I -c "$RUNNER" "${@:2}"\n'
    )


if __name__ == "__main__":
    sys.exit(main())
