"""The first thing a requeued Slurm array task runs: skip a step that already finished, else rerun it.

An array task that Slurm requeued (``SLURM_RESTART_COUNT`` >= 1, e.g. after preemption) is started by
``dagster_gpu/slurm/script.py`` as::

    <worker python> -m dagster_gpu.slurm.requeue <step key> -- <worker argv...>

This module reads the run's event log (the instance named in the step args of
``DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS``; for a relayed step, ``events: relay``, the task's relay channel in the
spool or on the object store, since the task cannot reach the instance): when the step already recorded an outcome in an earlier attempt
it exits 0 without running anything; otherwise it rewrites the step args with
``should_verify_step=False`` and ``exec``s the worker argv. The earlier attempt is dead (Slurm requeues only
after killing it), so the duplicate-run guard of ``dagster api execute_step`` would only stop the
legitimate rerun of a step that started but never finished; the outcome check keeps a step that did finish
from running twice.
"""

from __future__ import annotations

import json
import os
import sys
from typing import MutableMapping, Sequence

from dagster import DagsterInstance
from dagster._record import copy

from dagster_gpu.instance.events import outcome_recorded
from dagster_gpu.instance.step_args import ENV_VAR, decode_step_args, encode_step_args
from dagster_gpu.relay.channel import RELAY_ENV
from dagster_gpu.relay.objects import outcome_in_any_channel

#: This module's name, which the Slurm backend puts in each manifest entry (``requeue_module``) for the
#: array task's runner (``dagster_gpu/slurm/script.py``) to run first in a requeued attempt.
MODULE = "dagster_gpu.slurm.requeue"


def prepare_requeued_attempt(env: MutableMapping[str, str], step_key: str | None) -> bool:
    """False when the step already recorded an outcome (success, failure, up for retry) in the run's event
    log; else rewrite the step args in ``env`` with ``should_verify_step=False`` and return True.
    Raises KeyError when ``env`` has no step args."""
    args = decode_step_args(env[ENV_VAR])
    keys = args.step_keys_to_execute or ([step_key] if step_key else [])
    if RELAY_ENV in env:  # the relay worker never applies the duplicate-run guard; only the channel can tell
        relay = json.loads(env[RELAY_ENV])
        return not outcome_in_any_channel(str(relay["channel"]), set(keys), relay.get("storage_options"))
    with DagsterInstance.from_ref(args.instance_ref) as instance:
        if outcome_recorded(instance, args.run_id, keys):
            return False
    env[ENV_VAR] = encode_step_args(copy(args, should_verify_step=False))
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """``<step key> -- <worker argv...>``: exit 0 when the step is done, else exec the worker argv."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m dagster_gpu.slurm.requeue STEP_KEY -- ARGV...", file=sys.stderr)
        return 2
    step_key, cmd = args[0] or None, args[2:]
    env = dict(os.environ)
    restarts = env.get("SLURM_RESTART_COUNT", "?")
    if not prepare_requeued_attempt(env, step_key):
        print(f"dagster-gpu: requeued attempt {restarts}: the step already recorded its outcome; nothing to do",
              file=sys.stderr)  # fmt: skip
        return 0
    print(f"dagster-gpu: requeued attempt {restarts}: rerunning the step", file=sys.stderr, flush=True)
    os.execvpe(cmd[0], cmd, env)
    return 127  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
