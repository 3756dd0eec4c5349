"""A stop signal that reaches a step worker after Dagster took over and before the asset body: the worker started
by the executor's command (:func:`dagster_gpu.executor.command.worker_argv`, the entry point
``dagster_gpu.worker.step_main``) records it, and the unit stops at its first line without a step outcome (exit 143,
one ``preempted`` engine event, no STEP_FAILURE); launched again as the step handler does after a preemption
(``should_verify_step`` off), the step succeeds and materializes the partition once.

Before the entry point took the signal, Dagster's handler got it (``dagster/_utils/interrupts.py``
``setup_interrupt_handlers``, under ``capture_interrupts`` in ``dagster/_cli/api.py`` ``execute_step_command``, 1.13)
and the op's error boundary failed the step with ``DagsterExecutionInterruptedError``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import dagster as dg
from dagster._core.definitions.reconstruct import reconstructable
from dagster._grpc.types import ExecuteStepArgs
from dagster._record import copy

from dagster_gpu.executor.command import WORKER_MODULE, worker_argv, worker_env
from dagster_gpu.worker.preemption import EXIT_PREEMPTED
from tests.checkpoint_child import write_corpus

ROOT = Path(__file__).resolve().parents[1]
KEY = "a.txt"


def _run_worker(args: ExecuteStepArgs, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(list(worker_argv(args)), cwd=ROOT, env={**env, **worker_env(args, "emb_job", "emb")},
                          capture_output=True, text=True, timeout=600)


def _types(instance: dg.DagsterInstance, run_id: str) -> list[dg.DagsterEventType]:
    return [r.event_log_entry.dagster_event.event_type for r in instance.get_records_for_run(run_id).records
            if r.event_log_entry.dagster_event is not None]


def test_sigterm_before_the_asset_body_is_a_preemption_and_the_relaunch_materializes(tmp_path, monkeypatch):
    corpus, out, marker = tmp_path / "corpus", tmp_path / "out", tmp_path / "signalled"
    corpus.mkdir()
    write_corpus(corpus / KEY, 20, max_words=8)
    for k, v in {"EARLY_STOP_CORPUS": str(corpus), "EARLY_STOP_OUTPUT": str(out)}.items():
        monkeypatch.setenv(k, v)
    from tests.early_stop_pipeline import emb_job  # reads the corpus and output from the environment above

    env = {**os.environ, "EARLY_STOP_MARKER": str(marker), "DAGSTER_GPU_CPU_SHARE": "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    (tmp_path / "home").mkdir()
    with dg.DagsterInstance.local_temp(str(tmp_path / "home")) as instance:
        instance.add_dynamic_partitions("emb_files", [KEY])
        origin = reconstructable(emb_job).get_python_origin()
        run = instance.create_run_for_job(emb_job(), tags={"dagster/partition": KEY}, job_code_origin=origin)
        args = ExecuteStepArgs(job_origin=origin, run_id=run.run_id,
                               step_keys_to_execute=["emb"], instance_ref=instance.get_ref())
        assert worker_argv(args)[1:3] == ("-m", WORKER_MODULE)

        first = _run_worker(args, env)
        assert first.returncode == EXIT_PREEMPTED, first.stdout + first.stderr
        assert marker.read_text().isdigit()  # the worker did signal itself, from inside Dagster's step execution
        types = _types(instance, run.run_id)
        assert dg.DagsterEventType.STEP_FAILURE not in types and dg.DagsterEventType.STEP_SUCCESS not in types
        assert dg.DagsterEventType.STEP_START in types  # Dagster had started the step: the signal came after
        assert dg.DagsterEventType.ASSET_MATERIALIZATION not in types
        stops = [r.event_log_entry for r in instance.get_records_for_run(
            run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT).records if "preempted" in r.event_log_entry.message]
        assert len(stops) == 1 and "SIGTERM" in stops[0].message and "before the asset body" in stops[0].message
        md = stops[0].dagster_event.engine_event_data.metadata
        assert md["dagster_gpu/preempted_partition"].text == KEY and md["dagster_gpu/committed_rows"].value == 0
        assert md["dagster_gpu/before_body"].value is True

        second = _run_worker(copy(args, should_verify_step=False), env)  # as the step handler relaunches it
        assert second.returncode == 0, second.stdout + second.stderr
        types = _types(instance, run.run_id)
        assert types.count(dg.DagsterEventType.STEP_SUCCESS) == 1 and dg.DagsterEventType.STEP_FAILURE not in types
        assert types.count(dg.DagsterEventType.ASSET_MATERIALIZATION) == 1
    assert (out / "emb" / f"{KEY}.parquet").exists()
