"""The step's ``ExecuteStepArgs`` as they travel to a worker: ``DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS``.

Dagster writes the value as base64 of zlib of the serdes JSON of ``ExecuteStepArgs``
(``ExecuteStepArgs.get_command_env``). The backends read it back from a Slurm task's manifest entry or a
pod's container env to find the run, the step and the Dagster instance (to write observations, or to
check a requeued attempt), and the requeue check writes it back with ``should_verify_step=False``.
"""

from __future__ import annotations

import base64
import zlib
from typing import Mapping

from dagster import deserialize_value, serialize_value
from dagster._grpc.types import ExecuteStepArgs

ENV_VAR = "DAGSTER_COMPRESSED_EXECUTE_STEP_ARGS"


def decode_step_args(compressed: str) -> ExecuteStepArgs:
    """ExecuteStepArgs from the value of :data:`ENV_VAR`. Raises ValueError (binascii/zlib/serdes errors
    are ValueErrors or zlib.error) when the value is not one."""
    try:
        return deserialize_value(zlib.decompress(base64.b64decode(compressed.encode())).decode(), ExecuteStepArgs)
    except zlib.error as e:
        raise ValueError(f"{ENV_VAR} is not zlib-compressed step args: {e}") from e


def step_args_from_env(env: Mapping[str, str]) -> ExecuteStepArgs | None:
    """The step args in an environment mapping (a Slurm manifest entry's ``env``, a pod's container env),
    or None when it has none."""
    raw = env.get(ENV_VAR)
    return decode_step_args(raw) if raw else None


def encode_step_args(args: ExecuteStepArgs) -> str:
    """The value of :data:`ENV_VAR` for ``args`` (the inverse of :func:`decode_step_args`)."""
    return base64.b64encode(zlib.compress(serialize_value(args).encode())).decode()
