"""The corpus, options and child process of the checkpoint tests (tests/test_checkpoint.py, test_checkpoint_kill.py).

Run as ``python -m tests.checkpoint_child zygote`` (see :func:`zygote`) or
``python -m tests.checkpoint_child SOURCE OUTPUT READY_FILE [graceful]``: loads the packaged test model
(all-MiniLM-L6-v2 on CPU, one torch thread), creates READY_FILE, then embeds SOURCE into OUTPUT with a checkpoint
part per read batch. With ``graceful`` it installs the worker's SIGTERM/SIGUSR1 handler
(:class:`dagster_gpu.worker.preemption.GracefulStop`) and exits with ``EXIT_PREEMPTED`` when stopped, as the work
unit does; without it a signal ends the process wherever it is.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

#: Records per read batch and texts per forward pass: small, so a short file has many checkpoint parts.
READ_BATCH_ROWS = 16
BATCH_SIZE = 8
PARTITION_KEY = "part.txt"
SOURCE_VERSION = "size=1,mtime=1"
LINEAGE = {"fingerprint": "fp-test", "model": "all-MiniLM-L6-v2", "model_revision": "packaged"}
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega the of and to in is it that was for on are with as his they be at one").split()


def write_corpus(path: Path, records: int, seed: int = 7, max_words: int = 60) -> Path:
    """``records`` lines of 3-``max_words`` random words (every 13th line blank: read, counted, not embedded)."""
    rng = random.Random(seed)
    lines = ["" if i % 13 == 12 else " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, max_words)))
             for i in range(records)]
    path.write_text("\n".join(lines) + "\n")
    return path


def text_format():
    from dagster_gpu.corpus.readers import TextFormat

    return TextFormat(format="text")


def load_test_model():
    """The packaged model on CPU with one torch thread (vectors are then the same bits in every process)."""
    import torch

    torch.set_num_threads(1)
    from dagster_gpu.embedding.model import load_model

    return load_model("all-MiniLM-L6-v2", device="cpu")


def embed(source: str, output: str, model, *, checkpoint: bool = True, stop=None, version: str = SOURCE_VERSION,
          lineage=None, storage_options=None, on_batch=None):
    from dagster_gpu.embedding.pipeline import CheckpointPolicy, embed_partition
    from dagster_gpu.embedding.spec import EmbeddingSpec

    return embed_partition(source, output, model, text_format(), spec=EmbeddingSpec(batch_size=BATCH_SIZE), read_batch_rows=READ_BATCH_ROWS,
                           partition_key=PARTITION_KEY, lineage=dict(lineage or LINEAGE), storage_options=storage_options,
                           checkpoint=CheckpointPolicy(version, 1) if checkpoint else None, stop=stop, on_batch=on_batch)


def zygote() -> int:
    """Load the model once, then embed each ``SOURCE OUTPUT`` line of stdin in a forked child, printing its pid.

    The kill tests SIGKILL those children: a fork of a loaded model starts embedding at once, where a fresh
    interpreter would spend seconds importing torch first. torch runs one intra-op thread (no OpenMP pool
    exists to be forked) and nothing was tokenized before the fork; SIGCHLD is ignored so the kernel reaps
    the children."""
    import signal

    os.environ["DAGSTER_GPU_CPU_SHARE"] = "0"
    model = load_test_model()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    print("ready", flush=True)
    for line in sys.stdin:
        source, output = line.split()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                embed(source, output, model)
                code = 0
            finally:
                os._exit(code)
        print(pid, flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv == ["zygote"]:
        return zygote()
    source, output, ready = argv[:3]
    graceful = len(argv) > 3 and argv[3] == "graceful"
    os.environ["DAGSTER_GPU_CPU_SHARE"] = "0"
    model = load_test_model()
    stop = None
    if graceful:
        from dagster_gpu.worker.preemption import GracefulStop

        stop = GracefulStop().install()
    Path(ready).touch()
    try:
        embed(source, output, model, stop=stop.event if stop else None)
    except Exception as e:
        from dagster_gpu.embedding.pipeline import Preempted
        from dagster_gpu.worker.preemption import exit_preempted

        if isinstance(e, Preempted):
            print(f"preempted after {e.records} records, {stop.seconds_since():.3f} s after {stop.signal_name}",
                  flush=True)
            exit_preempted()
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
