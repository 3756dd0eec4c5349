"""A user's terminate must stop every worker, even where Dagster expects to resume the run.

With ``run_monitoring: {enabled: true, max_resume_run_attempts: N>0}`` Dagster's StepDelegatingExecutor
does not forward a termination to the step handler (``instance.run_will_resume`` counts resume attempts
only, not *why* the run worker is stopping), so a run terminated from the UI would leave its Slurm array
tasks and Kubernetes pods running. :class:`GpuStepDelegatingExecutor` checks, after the executor loop
ends, whether the run is CANCELING/CANCELED (a user's terminate; a crashed or SIGTERMed run worker leaves
the run STARTED and is resumed) and whether Dagster skipped the forwarding; if so it terminates every
launched worker of the run whose step recorded no outcome after its launch, through the same backend
``terminate`` the step handler uses.

Without it (measured on the local Slurm cluster, tests/test_terminate_resume_e2e.py): the run worker logs
"not forwarding to steps because run will be resumed"; running tasks end only when Dagster's cancellation
thread in the step worker notices the run (~10 s), and a task still pending starts after the terminate,
holds a GPU and ends COMPLETED instead of CANCELLED.
"""

from __future__ import annotations

from dagster import DagsterEvent, DagsterExecutionInterruptedError, DagsterRunStatus, MetadataValue
from dagster._core.events import EngineEventData
from dagster._core.executor.step_delegating import StepDelegatingExecutor

from dagster_gpu.instance.events import HANDLE_KEY, last_outcomes, launches


def unfinished_launches(instance, run_id: str) -> list[tuple[str, str, dict]]:
    """(step key, backend name, handle) of every launch of the run whose step recorded no outcome after it."""
    latest: dict[str, tuple[int, str, dict]] = {}
    for launch in launches(instance, run_id):
        if launch.step_key and launch.has_handle:
            latest[launch.step_key] = (launch.storage_id, launch.backend, launch.handle)
    done = last_outcomes(instance, run_id)
    return [(k, name, h) for k, (sid, name, h) in latest.items() if done.get(k, 0) < sid]


class GpuStepDelegatingExecutor(StepDelegatingExecutor):
    """StepDelegatingExecutor that never leaves workers behind after a user's terminate (see module doc)."""

    def execute(self, plan_context, execution_plan):
        try:
            yield from super().execute(plan_context, execution_plan)
        except DagsterExecutionInterruptedError:  # how the loop ends after a terminate ("steps still in flight")
            yield from self._terminate_after_user_cancel(plan_context)
            raise
        yield from self._terminate_after_user_cancel(plan_context)

    def _pop_events(self, instance, run_id, seen_storage_ids):
        """Dagster's read of the run's new events, after storing what relayed workers wrote
        (:mod:`dagster_gpu.relay.pump`): a relayed step's events are seen in the same poll."""
        self._step_handler.relay.pump(instance, run_id)
        return super()._pop_events(instance, run_id, seen_storage_ids)

    def _terminate_after_user_cancel(self, plan_context):
        instance, run_id = plan_context.instance, plan_context.run_id
        run = instance.get_run_by_id(run_id)
        if run is None or run.status not in (DagsterRunStatus.CANCELING, DagsterRunStatus.CANCELED):
            return
        if not instance.run_will_resume(run_id):
            return  # Dagster forwarded the terminate to the step handler already
        for step_key, name, handle in unfinished_launches(instance, run_id):
            yield DagsterEvent.engine_event(
                plan_context,
                f"Terminating the {name} worker of step {step_key}: the run was terminated by a user (run "
                f"monitoring would resume it otherwise, so Dagster did not forward the terminate)",
                EngineEventData(metadata={HANDLE_KEY: MetadataValue.json(dict(handle))}),
            )
            self._step_handler.backend(name).terminate(handle)
