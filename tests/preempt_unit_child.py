"""Child process of tests/test_preempt_unit.py: materialize one partition of an embedding asset in process on the
instance in $DAGSTER_HOME (the real work unit inside Dagster's op machinery), a checkpoint part per read batch.

    python -m tests.preempt_unit_child CORPUS_DIR OUTPUT_DIR
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    import dagster as dg

    from dagster_gpu import CorpusSource, TextFormat, embedding_asset
    from tests.checkpoint_child import BATCH_SIZE, PARTITION_KEY, READ_BATCH_ROWS

    corpus, output = argv
    asset = embedding_asset(name="emb", corpus=CorpusSource(url=corpus, text_format=TextFormat(format="text")),
                            output_url=output, device="cpu", batch_size=BATCH_SIZE, read_batch_rows=READ_BATCH_ROWS,
                            checkpoint_every_batches=1)
    instance = dg.DagsterInstance.get()
    instance.add_dynamic_partitions("emb_files", [PARTITION_KEY])
    result = dg.materialize([asset], instance=instance, partition_key=PARTITION_KEY, raise_on_error=False)
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
