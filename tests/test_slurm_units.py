"""Slurm pieces that need no cluster: the job script/manifest, the spool lock, the client's environment,
and the coalescer's grouping (with a real ``sbatch`` only when the cluster runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dagster_gpu.slurm.client import SlurmClient
from dagster_gpu.slurm.script import JOB_SCRIPT, RUNNER, TaskManifestError, read_env_file, task_entry, write_job_script, write_manifest
from dagster_gpu.slurm.spool import Spool


def test_job_script_is_constant_and_manifest_is_private(tmp_path):
    script = write_job_script(tmp_path)
    assert script.read_text() == JOB_SCRIPT and os.stat(script).st_mode & 0o777 == 0o700
    weird = "p it's \"$(touch /tmp/pwned)\"; `x`"
    m = write_manifest(tmp_path / "b" / "manifest.json", "b1", [{"argv": ["echo", weird], "env": {"K": weird}, "partition_key": weird}])
    assert os.stat(m).st_mode & 0o777 == 0o600
    doc = json.loads(m.read_text())
    assert task_entry(doc, 0)["argv"] == ["echo", weird]
    with pytest.raises(TaskManifestError):
        task_entry(doc, 1)
    with pytest.raises(TaskManifestError):
        write_manifest(tmp_path / "x.json", "b", [{"argv": "echo hi", "env": {}}])  # a string is not argv


def test_runner_execs_the_manifest_entry_without_a_shell(tmp_path):
    out = tmp_path / "out.txt"
    weird = "a b 'c' $(d) ; e"
    m = write_manifest(
        tmp_path / "manifest.json",
        "b1",
        [{"argv": [sys.executable, "-c", "import os,sys; open(sys.argv[1],'w').write(sys.argv[2]+'|'+os.environ['K'])", str(out), weird],
          "env": {"K": weird}}],
    )  # fmt: skip
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_JOB_ID": "1"}
    cp = subprocess.run(["bash", str(write_job_script(tmp_path)), sys.executable, RUNNER, str(m)], env=env, capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr
    assert out.read_text() == f"{weird}|{weird}"


def test_env_file_must_be_private(tmp_path):
    f = tmp_path / "secrets.env"
    f.write_text("# comment\nDAGSTER_PG_PASSWORD=s3cret=x\n\n")
    os.chmod(f, 0o644)
    with pytest.raises(TaskManifestError, match="0600"):
        read_env_file(str(f))
    os.chmod(f, 0o600)
    assert read_env_file(str(f)) == {"DAGSTER_PG_PASSWORD": "s3cret=x"}


def test_client_scrubs_slurm_environment(monkeypatch):
    for k, v in {"SQUEUE_FORMAT": "%i", "SACCT_FORMAT": "JobID", "SBATCH_PARTITION": "x", "SLURM_JOB_ID": "9", "SLURM_CONF": "/c"}.items():
        monkeypatch.setenv(k, v)
    env = SlurmClient().env()
    assert "SQUEUE_FORMAT" not in env and "SACCT_FORMAT" not in env and "SBATCH_PARTITION" not in env
    assert "SLURM_JOB_ID" not in env and env["SLURM_CONF"] == "/c"
    assert SlurmClient(slurm_conf="/d").env()["SLURM_CONF"] == "/d"


def test_spool_lock_excludes_other_processes(tmp_path):
    sp = Spool(tmp_path)
    code = (
        "import sys; from dagster_gpu.slurm.spool import Spool\n"
        f"with Spool({str(tmp_path)!r}).lock(timeout_s=0) as got: print(got)"
    )
    with sp.lock() as got:
        assert got
        cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert cp.stdout.strip() == "False"
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert cp.stdout.strip() == "True"
