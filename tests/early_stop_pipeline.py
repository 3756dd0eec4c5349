"""Code location of tests/test_early_stop.py: one embedding asset (``emb``, the packaged model on CPU) over the corpus
directory in ``$EARLY_STOP_CORPUS``, written under ``$EARLY_STOP_OUTPUT``.

A step worker (``$DAGSTER_RUN_STEP_KEY`` set: :func:`dagster_gpu.executor.command.worker_env`) that imports this module
while ``$EARLY_STOP_MARKER`` names a file that does not exist yet creates it and sends itself SIGTERM: the module is
imported by Dagster's step execution (``recon_job_from_origin`` in ``dagster/_cli/api.py``
``_execute_step_command_body``, inside ``capture_interrupts()``), so the signal arrives after Dagster took over and
before the asset body, every time.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import dagster as dg

from dagster_gpu import ComputeSpec, CorpusSource, EmbeddingSpec, OutputSpec, TextFormat, embedding_asset
from tests.checkpoint_child import BATCH_SIZE, READ_BATCH_ROWS

_marker = os.environ.get("EARLY_STOP_MARKER")
if _marker and os.environ.get("DAGSTER_RUN_STEP_KEY") and not Path(_marker).exists():
    Path(_marker).write_text(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGTERM)

emb = embedding_asset(
    name="emb", corpus=CorpusSource(url=os.environ.get("EARLY_STOP_CORPUS", "/nonexistent"), text_format=TextFormat(format="text")),
    output=OutputSpec(url=os.environ.get("EARLY_STOP_OUTPUT", "/nonexistent")),
    compute=ComputeSpec(device="cpu", read_batch_rows=READ_BATCH_ROWS), spec=EmbeddingSpec(batch_size=BATCH_SIZE))


def emb_job() -> dg.JobDefinition:
    """The asset's job (a function, for ``dagster.reconstructable``)."""
    return dg.Definitions(assets=[emb], jobs=[dg.define_asset_job("emb_job", selection=[emb])]).resolve_job_def("emb_job")
