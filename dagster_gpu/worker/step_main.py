"""The step worker's entry point: take SIGTERM / SIGUSR1 first, then run the step as Dagster does.

    python -m dagster_gpu.worker.step_main api execute_step          # what ``python -m dagster api execute_step`` runs
    python -m dagster_gpu.worker.step_main dagster_gpu.worker.relay_step   # a relayed step (``events: relay``)

Its first call installs :func:`dagster_gpu.worker.preemption.install_process_stop` (before Dagster is imported),
so a stop signal that reaches the worker before its asset body starts (a Kueue eviction right after the pod
started, a Slurm preemption during start-up) is recorded instead of failing the step through Dagster's handler;
the unit then stops at once without a step outcome and exits with
:data:`~dagster_gpu.worker.preemption.EXIT_PREEMPTED`, as a preemption in its body does. The rest of the argument
list is Dagster's CLI's (``api execute_step``: the step args travel in ``DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS``)
or the relay worker module (:data:`RELAY_MODULE`, whose ``main()`` gives the exit status). Anything else exits 2
with a message naming what was given.
"""

from __future__ import annotations

from dagster_gpu.worker.preemption import install_process_stop

install_process_stop()  # before anything else the worker imports: see the module doc

import sys  # noqa: E402 - after the handler on purpose

#: The relayed step worker's module, the one argument this entry point accepts instead of Dagster's CLI's.
RELAY_MODULE = "dagster_gpu.worker.relay_step"


def main(argv: list[str]) -> int:
    if argv == [RELAY_MODULE]:
        from dagster_gpu.worker import relay_step  # deferred: it imports Dagster, after the signal handler

        return relay_step.main()
    if argv[:2] != ["api", "execute_step"]:
        print(f"dagster-gpu step worker: expected 'api execute_step' or {RELAY_MODULE!r}, got {argv!r}",
              file=sys.stderr)
        return 2
    from dagster._cli import main as dagster_main  # dagster/__main__.py runs the same

    sys.argv = ["dagster", *argv]
    dagster_main()  # click exits through SystemExit with the command's status
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
