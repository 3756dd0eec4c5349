"""The Slurm backend on the local cluster: a task held until an administrator releases it fails its step
after its wait limit and is cancelled (by the settler); a job submitted to a named cluster (``sbatch --parsable`` prints
``<id>;<cluster>``) is polled and cancelled with ``-M <cluster>``.

Needs ``resources/slurm/cluster.sh start`` and ``resources/slurm/trixie.sh start`` (both name their cluster
``dagstergpu``); each test runs on both (22.05 and 24.11). The tasks request no GPU, so they do
not hold the GPUs other tests use; every job they submit is cancelled at the end.
"""

from __future__ import annotations

import os
import time

import pytest

from tests import slurm_helpers as H

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


@pytest.fixture(autouse=True)
def _cluster(slurm_cluster):
    """Every test on each local cluster (22.05 and 24.11; tests/conftest.py)."""
    return slurm_cluster


def _spy_client():
    """A real SlurmClient that also records every command it runs."""
    from dagster_gpu.slurm.client import SlurmClient

    class SpyClient(SlurmClient):
        def _run_once(self, argv, ok_codes=(0,), forward_env=False):
            self.argvs.append(list(argv))
            return super()._run_once(argv, ok_codes, forward_env=forward_env)

    # already submitting with SLURM_UMASK=0077, so the coalescer uses this very client (not a copy without argvs)
    c = SpyClient(slurm_conf=H.slurm_conf(), extra_env={"SLURM_UMASK": "0077"})
    c.argvs = []
    return c


def _backend(tmp_path, client, **kw):
    from dagster_gpu.slurm.backend import SlurmBackend, SlurmSettings

    settings = SlurmSettings(
        slurm_conf=H.slurm_conf(), account="research", spool_dir=str(tmp_path / "spool"), settle_wait_seconds=0,
        coalesce_window_seconds=0.2, coalesce_max_window_seconds=1.0, poll_interval_seconds=0.5,
        python=os.environ.get(H.WORKER_PYTHON_ENV), **kw,  # the 24.11 cluster's tasks run in a chroot
    )  # fmt: skip
    return SlurmBackend(settings, client=client)


def _launch(key: str, argv: tuple[str, ...]):
    from dagster_gpu.contracts import StepLaunch
    from dagster_gpu.policy.placement import Placement
    from dagster_gpu.core.request import GpuRequest

    return StepLaunch(
        run_id=f"waits-{key}", step_key="trivial", partition_keys=(key,), attempt=0, argv=argv, env={},
        request=GpuRequest(count=0), placement=Placement(backend="slurm", reason="test"),
    )  # fmt: skip


def _until(backend, handle, pred, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        st = backend.state(handle)
        seen.append(st)
        if pred(st):
            return st, seen
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; last states: {[(s.status.value, s.message) for s in seen[-3:]]}")


def test_special_exit_task_fails_its_step_after_the_held_limit_and_is_cancelled(tmp_path):
    from dagster_gpu.contracts import WorkerStatus
    from dagster_gpu.executor.settle import Settler

    client = _spy_client()
    backend = _backend(tmp_path, client, wait_limits_seconds={"held": 4.0})
    h = backend.launch(_launch("held", ("/bin/sleep", "300")))
    label = f"{h['array_job_id']}_{h['array_task_id']}"
    try:
        _until(backend, h, lambda s: s.status == WorkerStatus.RUNNING, 90, f"{label} running")
        client.run(["scontrol", "requeuehold", "State=SpecialExit", label])
        held, _ = _until(backend, h, lambda s: "SPECIAL_EXIT" in s.message, 60, f"{label} in SPECIAL_EXIT")
        assert held.status == WorkerStatus.REQUEUED  # within the limit: the step waits
        t0 = time.monotonic()
        failed, _ = _until(backend, h, lambda s: s.status == WorkerStatus.FAILED, 60, f"{label} failed by its wait limit")
        assert time.monotonic() - t0 < 30
        assert failed.message.startswith(f"Slurm array task {label} is SPECIAL_EXIT (reason job requeued in held state): "
                                         f"held until an administrator releases it (scontrol release {label}); waited ")
        assert "over the Slurm backend's wait_limits_seconds.held = 4 s, so the task is cancelled" in failed.message
        assert failed.abandoned and ["scancel", label] not in client.argvs  # state only reads
        Settler(write=lambda bill: 0).settle(backend, h)  # what the step handler's settler does next
        assert ["scancel", label] in client.argvs  # cancelled, so a release cannot run the failed step again

        def cancelled():
            return [r.state.name for r in client.squeue([h["array_job_id"]]) if r.array_task_id == h["array_task_id"]] == ["CANCELLED"]

        deadline = time.monotonic() + 60
        while not cancelled() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert cancelled()
    finally:
        client.scancel([label])


def test_job_on_a_named_cluster_is_polled_and_cancelled_with_dash_m(tmp_path):
    from dagster_gpu.contracts import WorkerStatus

    client = _spy_client()
    cluster = "dagstergpu"  # cluster.sh's and trixie.sh's ClusterName: sbatch -M prints "<id>;dagstergpu"
    backend = _backend(tmp_path, client, extra_sbatch_args=(f"--clusters={cluster}",))
    h = backend.launch(_launch("m", ("/bin/sleep", "300")))
    label = f"{h['array_job_id']}_{h['array_task_id']}"
    try:
        assert h["cluster"] == cluster
        assert backend.handle_metadata(h)["slurm/cluster"] == cluster
        _until(backend, h, lambda s: s.status == WorkerStatus.RUNNING, 90, f"{label} running")
        backend.terminate(h)
        done, _ = _until(backend, h, lambda s: s.status == WorkerStatus.FAILED, 90, f"{label} cancelled")
        assert f"Slurm array task {label} ended CANCELLED" in done.message
    finally:
        client.scancel([label], cluster=cluster)
    sbatch = [a for a in client.argvs if a[0] == "sbatch" and "--parsable" in a]
    assert len(sbatch) == 1 and f"--clusters={cluster}" in sbatch[0]
    later = [a for a in client.argvs if a[0] in ("squeue", "sacct", "scancel") and f"--jobs={h['array_job_id']}" in a or a[-1:] == [label]]
    assert {a[0] for a in later} == {"squeue", "sacct", "scancel"}
    assert all(a[1:3] == ["-M", cluster] for a in later), later
