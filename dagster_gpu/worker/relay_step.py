"""``python -m dagster_gpu.worker.relay_step``: run one step as ``dagster api execute_step`` does, with every
event going to the relay channel instead of the instance's database (``events: relay``).

Reads ``DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS`` (the step args, as for ``dagster api execute_step``) and
:data:`~dagster_gpu.relay.channel.RELAY_ENV` (JSON ``{"channel": <path or URL>, "seed": <seed>}``, plus
``"storage_options"`` for an object channel: the endpoint and the like, never credentials), builds the
ephemeral instance of :func:`dagster_gpu.relay.storage.relay_instance`, and runs Dagster's own step
body (``dagster._cli.api._execute_step_command_body``: the step-worker-started event, the run status check,
repository load data, ``execute_plan_iterator``) against it. The step args' duplicate-launch guard
(``should_verify_step``) is not applied here: it reads the step's earlier attempts from the event log, which this
instance does not hold; the run worker launches each attempt once.

Exit status: 0 when the step ran (its success or failure is in the channel, as ``execute_step`` records it in
the event log); 2 when the environment holds no usable step args, channel or seed (the message says which);
an exception from opening the channel, or an object channel's OSError from its last upload at the end,
propagates (the worker could not record its events).
"""

from __future__ import annotations

import json
import os
import sys

from dagster._cli.api import _execute_step_command_body
from dagster._record import copy
from dagster._utils.interrupts import capture_interrupts

from dagster_gpu.instance.step_args import ENV_VAR as STEP_ARGS_ENV
from dagster_gpu.instance.step_args import decode_step_args
from dagster_gpu.relay.channel import RELAY_ENV
from dagster_gpu.relay.objects import open_channel_writer
from dagster_gpu.relay.storage import decode_seed, relay_instance
from dagster_gpu.worker.preemption import before_exit_preempted


def main() -> int:
    try:
        relay = json.loads(os.environ[RELAY_ENV])
        channel, seed = str(relay["channel"]), decode_seed(str(relay["seed"]))
        storage_options = dict(relay.get("storage_options") or {})
        args = copy(decode_step_args(os.environ[STEP_ARGS_ENV]), should_verify_step=False)
    except (KeyError, ValueError, TypeError) as e:
        print(f"dagster-gpu relay worker: no usable {RELAY_ENV} / {STEP_ARGS_ENV} in the environment: "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if seed.run.run_id != args.run_id:
        print(f"dagster-gpu relay worker: the seed is run {seed.run.run_id}'s, the step args run {args.run_id}'s",
              file=sys.stderr)
        return 2
    writer = open_channel_writer(channel, storage_options)
    forget = before_exit_preempted(writer.close)  # a graceful stop ends the process without the finally below
    try:
        with capture_interrupts():
            instance = relay_instance(seed, writer)
            for _ in _execute_step_command_body(args, instance, seed.run):
                pass
    finally:
        forget()
        writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
