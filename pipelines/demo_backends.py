"""What ``python -m pipelines.demo --backend slurm|kubernetes|auto`` starts and how it configures the runs.

The same services and settings the end-to-end tests use: PostgreSQL (``resources/postgres/postgres.sh``),
the local Slurm cluster (``resources/slurm/cluster.sh``, Slurm 22.05; or ``resources/slurm/trixie.sh``, Slurm
24.11: :data:`SLURM_SCRIPTS`), the Kubernetes 1.34 control plane (``resources/k8s/cluster.sh``). Each script is
called with ``status``/``start``/``env`` only; nothing is stopped.

- :func:`start_services` runs the scripts the backend needs and returns the environment they export
  (``SLURM_CONF``, ``DAGSTER_PG_*``; for 24.11 also ``PATH`` with its client wrappers first and
  ``DAGSTER_GPU_SLURM_WORKER_PYTHON``, the interpreter its array tasks run; the PostgreSQL password is read from its 0600 file into the
  process environment, never written into a file of ours).
- :func:`instance_yaml` is the demo instance on PostgreSQL (Slurm tasks and pods write their events to it).
- :func:`executor_config` is gpu_executor's ``execution: config:`` for the backend, passed as the
  backfill's run config.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
from pathlib import Path

from pipelines.instance_yaml import dagster_yaml

REPO = Path(__file__).resolve().parents[1]
BACKENDS = ("local", "slurm", "kubernetes", "auto")
K8S_DIR = Path(os.environ.get("DAGSTER_GPU_K8S_DIR", "/tmp/dagster-gpu-k8s"))
K8S_NAMESPACE = "dagster-gpu"
PG_SECRET = "dagster-postgresql-secret"
#: ``--slurm-version`` -> the script that starts that local Slurm cluster and prints its environment
#: (resources/slurm/README.md: 22.05 from Debian bookworm, 24.11 from a Debian trixie root beside it).
SLURM_SCRIPTS = {"22.05": "resources/slurm/cluster.sh", "24.11": "resources/slurm/trixie.sh"}
DEFAULT_SLURM_VERSION = "22.05"
#: Set by ``trixie.sh env``: an interpreter path that exists where the 24.11 cluster's array tasks run.
WORKER_PYTHON_ENV = "DAGSTER_GPU_SLURM_WORKER_PYTHON"


def slurm_script(version: str = DEFAULT_SLURM_VERSION) -> str:
    """The resources/ script (relative to the repository) of the local Slurm cluster of ``version``.
    Raises ValueError naming the versions there are."""
    try:
        return SLURM_SCRIPTS[version]
    except KeyError:
        raise ValueError(f"no local Slurm cluster of version {version!r}: choose one of {', '.join(SLURM_SCRIPTS)}") from None


def demo_db(home: Path) -> str:
    """The demo home's own PostgreSQL database (``dagster_gpu_demo_<sha256 of its path, 8 hex>``): homes and
    checkouts never share partitions or runs. Only hex digits follow the fixed prefix (safe in SQL)."""
    return f"dagster_gpu_demo_{hashlib.sha256(str(Path(home).resolve()).encode()).hexdigest()[:8]}"


class ServiceError(RuntimeError):
    """A service script failed; the message names the script, the step and the log to read."""


def _script(args: list[str], log: Path) -> str:
    """Run a resources/ script, appending its output to ``log``; returns stdout. Raises ServiceError."""
    cp = subprocess.run(["bash", *args], cwd=REPO, capture_output=True, text=True)
    with open(log, "a") as f:
        f.write(f"$ bash {' '.join(args)}\n{cp.stdout}{cp.stderr}\n")
    if cp.returncode != 0:
        raise ServiceError(f"`bash {' '.join(args)}` failed (exit {cp.returncode}); see {log}")
    return cp.stdout


def _exports(text: str) -> dict[str, str]:
    out = {}
    for word in text.replace("export ", " ").split():
        if "=" in word:
            k, v = word.split("=", 1)
            out[k] = v
    return out


def start_services(backend: str, home: Path, slurm_version: str = DEFAULT_SLURM_VERSION, transport: str = "local") -> dict[str, str]:
    """Start (idempotently) what ``backend`` needs, logging to ``home``/services.log, and create the home's
    database (:func:`demo_db`); for slurm/auto the cluster of ``slurm_version`` (:func:`slurm_script`).
    Returns environment variables to set. Raises ServiceError (a script failed) or ValueError (no such
    Slurm version)."""
    slurm = slurm_script(slurm_version)
    if backend == "local":
        return {}
    log = home / "services.log"
    env: dict[str, str] = {}
    _script(["resources/postgres/postgres.sh", "start"], log)
    pg = _exports(_script(["resources/postgres/postgres.sh", "env"], log))
    env.update({k: v for k, v in pg.items() if k.startswith("DAGSTER_PG_")})
    env["DAGSTER_PG_PASSWORD"] = Path(pg["DAGSTER_PG_PASSWORD_FILE"]).read_text().strip()
    _create_database(env, demo_db(home))
    if backend in ("slurm", "auto"):
        try:
            _script([slurm, "status"], log)
        except ServiceError:
            _script([slurm, "start"], log)
        env.update(_exports(_script([slurm, "env"], log)))
        if transport == "ssh":  # the login node in front of it (resources/ssh/sshd.sh: OpenSSH on 127.0.0.1)
            _script(["resources/ssh/sshd.sh", "start"], log)
            env.update(_exports(_script(["resources/ssh/sshd.sh", "env"], log)))
        if transport == "rest":  # trixie.sh's slurmrestd: a token file and the tasks' secrets file, both 0600
            _script([slurm, "token", str(REST_TOKEN_LIFESPAN_S), "root", str(home.resolve() / REST_TOKEN_FILE)], log)
            _private_file(home / REST_SECRETS_FILE, f"DAGSTER_PG_PASSWORD={env['DAGSTER_PG_PASSWORD']}\n")
    if backend in ("kubernetes", "auto"):
        _script(["resources/k8s/cluster.sh", "start"], log)
        _k8s_secret(env["DAGSTER_PG_PASSWORD"])
    return env


def _create_database(env: dict[str, str], db: str) -> None:
    import psycopg2

    conn = psycopg2.connect(host=env["DAGSTER_PG_HOST"], port=env["DAGSTER_PG_PORT"], user=env["DAGSTER_PG_USER"],
                            password=env["DAGSTER_PG_PASSWORD"], dbname=env.get("DAGSTER_PG_DB", "dagster"))
    try:
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,))
        if cur.fetchone() is None:
            cur.execute(f"CREATE DATABASE {db}")  # demo_db: a fixed prefix and hex digits, never user input
    finally:
        conn.close()


def browse_script(backend: str, home: Path, repo: Path, slurm_version: str = DEFAULT_SLURM_VERSION) -> Path:
    """``<home>/dagster-dev.sh``: ``dagster dev`` on the demo's instance, with the environment its services
    export (the PostgreSQL password read from its file when the script runs, never written into it; for
    slurm/auto that of the Slurm cluster of ``slurm_version``). Returns its path. Raises ValueError (no such
    Slurm version)."""
    slurm = slurm_script(slurm_version)
    q = shlex.quote
    lines = ["#!/usr/bin/env bash", "# dagster dev on this demo home's instance (written by scripts/demo.sh)",
             "set -euo pipefail", f"cd {q(str(repo))}"]
    if backend != "local":
        lines += ['eval "$(bash resources/postgres/postgres.sh env)"',
                  'DAGSTER_PG_PASSWORD="$(cat "$DAGSTER_PG_PASSWORD_FILE")"', "export DAGSTER_PG_PASSWORD"]
    if backend in ("slurm", "auto"):
        lines.append(f'eval "$(bash {slurm} env)"')
    lines += [f"export DAGSTER_HOME={q(str(Path(home).resolve()))}", 'exec .venv/bin/dagster dev -w workspace.yaml "$@"']
    path = Path(home) / "dagster-dev.sh"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


def _k8s_secret(password: str) -> None:
    """The PostgreSQL password as a Secret in the namespace (step pods read it by reference)."""
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    api = client.CoreV1Api(config.new_client_from_config(config_file=str(K8S_DIR / "admin.kubeconfig")))
    secret = client.V1Secret(metadata=client.V1ObjectMeta(name=PG_SECRET), string_data={"postgresql-password": password})
    try:
        api.create_namespaced_secret(K8S_NAMESPACE, secret)
    except ApiException as e:
        if e.status != 409:
            raise
        api.replace_namespaced_secret(PG_SECRET, K8S_NAMESPACE, secret)


def instance_yaml(backend: str, max_runs: int, home: Path) -> str:
    """dagster.yaml: SQLite for ``local``; PostgreSQL (password by env reference, the home's own database) for
    the others."""
    header = f"# project-local Dagster instance for the demo ({'SQLite under this directory' if backend == 'local' else 'PostgreSQL'})\n"
    return header + dagster_yaml(None if backend == "local" else demo_db(home), max_runs=max_runs,
                                 extra="run_monitoring:\n  enabled: true\n  poll_interval_seconds: 5\n")


#: What the demo's array tasks inherit from the submitter over ssh (a local sbatch exports everything): the
#: instance and corpus/output URLs (DAGSTER_*), the model caches, the checkout.
SSH_FORWARD_ENV = ("DAGSTER_*", "HF_*", "TRANSFORMERS_*", "SENTENCE_TRANSFORMERS_*", "PYTHONPATH")


#: The demo's slurmrestd token (``trixie.sh token``; slurmrestd's client re-reads the file when it changes) and
#: the KEY=VALUE file the array tasks load the PostgreSQL password from (the slurm section's env_files: a job's
#: environment from slurmrestd carries no secret). Both 0600 in the demo's home.
REST_TOKEN_FILE = "slurmrestd.jwt"
REST_SECRETS_FILE = "worker-secrets.env"
#: Seconds the demo's token lives: the demo's default --timeout (3600 s) plus start-up.
REST_TOKEN_LIFESPAN_S = 4 * 3600


def _private_file(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def rest_settings(home: Path, forward_env: tuple[str, ...] | list[str] = (*SSH_FORWARD_ENV, "PATH")) -> dict:
    """The slurm section's ``transport: rest`` keys for the 24.11 cluster's slurmrestd (``DAGSTER_GPU_SLURMRESTD_URL``
    from ``trixie.sh env``): user root, the token file and secrets file :func:`start_services` wrote in ``home``,
    the variables put in each job's environment (``rest.forward_env``). The spool stays ``spool_dir``: /tmp and
    the checkout are the same paths in the cluster's root. Raises KeyError when the URL is not set."""
    return {
        "transport": "rest",
        "rest": {
            "url": os.environ["DAGSTER_GPU_SLURMRESTD_URL"],
            "user": "root",
            "token_file": str(home / REST_TOKEN_FILE),
            "forward_env": list(forward_env),
        },
        "env_files": [str(home / REST_SECRETS_FILE)],
    }


def ssh_settings(remote_spool_dir: str | Path, forward_env: tuple[str, ...] | list[str] = SSH_FORWARD_ENV,
                 control_dir: str | Path | None = None) -> dict:
    """The slurm section's ``transport: ssh`` keys for the local login node: host, port, user, key and
    known_hosts from ``resources/ssh/sshd.sh env`` (its ``DAGSTER_GPU_SSH_*`` variables, set by
    :func:`start_services`), the cluster-side spool ``ssh.remote_spool_dir``, the variables the array tasks
    inherit (``forward_env``, ``ssh.forward_env`` patterns) and, when given, the master's socket directory.
    Raises KeyError naming the variable when the sshd environment is not set."""
    cfg = {
        "transport": "ssh",
        "ssh": {
            "host": os.environ["DAGSTER_GPU_SSH_HOST"],
            "port": int(os.environ["DAGSTER_GPU_SSH_PORT"]),
            "user": os.environ["DAGSTER_GPU_SSH_USER"],
            "identity_file": os.environ["DAGSTER_GPU_SSH_KEY"],
            "known_hosts_file": os.environ["DAGSTER_GPU_SSH_KNOWN_HOSTS"],
            "remote_spool_dir": str(remote_spool_dir),
            "forward_env": list(forward_env),
        },
    }
    if control_dir is not None:
        cfg["ssh"]["control_dir"] = str(control_dir)
    return cfg


def executor_config(backend: str, home: Path, slurm_worker_python: str | None = None, transport: str = "local",
                    events: str = "direct") -> dict:
    """gpu_executor's config for ``backend`` (the local Slurm cluster's account, the test namespace).

    ``slurm_worker_python`` (``DAGSTER_GPU_SLURM_WORKER_PYTHON`` from ``trixie.sh env``): the interpreter that
    exists where the Slurm array tasks run, set as the slurm section's ``python`` (the job script's) and
    ``worker_python`` (the step worker's); only that section, so pods keep their image's python. ``events``: the
    slurm section's ``events`` (``relay``: the array tasks' events come back through the spool, not the database)."""
    cfg: dict = {"backend": backend, "retries": {"disabled": {}}}
    if backend in ("slurm", "auto"):
        cfg["slurm"] = {"account": "research", "spool_dir": str(home / "slurm-spool")}
        if slurm_worker_python:
            cfg["slurm"].update(python=slurm_worker_python, worker_python=slurm_worker_python)
        if transport == "ssh":
            cfg["slurm"].update(ssh_settings(home / "cluster-spool"))
            if os.environ.get("SLURM_CONF"):  # the login node's shell has no SLURM_CONF of its own: name the cluster's
                cfg["slurm"]["slurm_conf"] = os.environ["SLURM_CONF"]
        if transport == "rest":
            cfg["slurm"].update(rest_settings(home))
        if events != "direct":
            cfg["slurm"]["events"] = events
    if backend in ("kubernetes", "auto"):
        passed = ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_USER", "DAGSTER_GPU_CORPUS_URL", "DAGSTER_GPU_OUTPUT_URL")
        env_vars = [f"{k}={os.environ[k]}" for k in passed if k in os.environ]
        cfg["kubernetes"] = {
            "kubeconfig": str(K8S_DIR / "executor.kubeconfig"),
            "namespace": K8S_NAMESPACE,
            "image": "dagster-gpu:dev",
            "postgres_password_secret": {"name": PG_SECRET, "key": "postgresql-password", "env": "DAGSTER_PG_PASSWORD"},
            "container_context": {"env_vars": env_vars, "service_account_name": "dagster-gpu-worker"},
        }
    if backend in ("slurm", "kubernetes"):
        cfg["local"] = {"enabled": False}
    return cfg
