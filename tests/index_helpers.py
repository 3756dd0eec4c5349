"""Outputs for the index tests, written by the real writer (dagster_gpu.embedding.writer), and a loader process.

``python tests/index_helpers.py load DB TABLE KEY ROWS DIM FP SEED [REPEAT]`` replaces partition KEY of the
index at DB by a fresh output of ROWS rows, REPEAT times, printing "staged" before each commit starts and
"committed <version>" after it (the concurrency and kill tests read these lines).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dagster_gpu.embedding.writer import AtomicParquetWriter, lineage_metadata, output_schema, output_table  # noqa: E402


def output_rows(n: int, dim: int, *, pk: str, fingerprint: str, seed: int = 0, vectors=None, model_revision="sha256:test",
                texts=None, carried=None):
    """An output table (writer's schema, lineage metadata with ``fingerprint``) of ``n`` rows of ``pk``; with
    ``texts`` its ``text`` column (include_text), with ``carried`` ({name: pyarrow array}) carried columns."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    vec = rng.standard_normal((n, dim)).astype(np.float32) if vectors is None else np.asarray(vectors, np.float32)
    vec /= np.linalg.norm(vec, axis=1, keepdims=True)
    kv = lineage_metadata(fingerprint=fingerprint, model="all-MiniLM-L6-v2", model_revision=model_revision,
                          lineage={"normalize": True, "max_seq_length": 256, "output_dtype": "float32"})
    schema = output_schema(dim, metadata=kv, include_text=texts is not None,
                           carried=[pa.field(k, v.type) for k, v in (carried or {}).items()])
    t = output_table(schema, doc_ids=[f"{pk}/{i}" for i in range(n)], record_ids=list(range(n)), chunk_index=[0] * n,
                     char_start=[0] * n, char_end=[10] * n, token_count=[5] * n, hashes=[f"{seed:032x}{i:032x}" for i in range(n)],
                     vectors=vec, texts=texts, carried=carried)
    return t, schema


def write_output(path: Path, n: int, dim: int, *, pk: str, fingerprint: str, seed: int = 0, vectors=None,
                 model_revision: str = "sha256:test", texts=None, carried=None) -> Path:
    t, schema = output_rows(n, dim, pk=pk, fingerprint=fingerprint, seed=seed, vectors=vectors, model_revision=model_revision,
                            texts=texts, carried=carried)
    path.parent.mkdir(parents=True, exist_ok=True)
    with AtomicParquetWriter(str(path), schema) as w:
        w.write(t)
    return path


def _load(db: str, table: str, key: str, rows: int, dim: int, fp: str, seed: int, repeat: int = 1) -> None:
    from dagster_gpu.index.lance import VectorIndex
    from dagster_gpu.index.rows import index_rows

    ix = VectorIndex(db, table)
    for i in range(repeat):
        t, _ = output_rows(rows, dim, pk=key, fingerprint=fp, seed=seed + i)
        r = index_rows(t, key, fp)
        print("staged", flush=True)
        res = ix.replace_partition(key, r)
        print("committed", res.version, res.retries, res.attempts, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "load":
        a = sys.argv[2:]
        _load(a[0], a[1], a[2], int(a[3]), int(a[4]), a[5], int(a[6]), int(a[7]) if len(a) > 7 else 1)
    elif sys.argv[1] == "optimize":  # compaction in a loop: makes the partitions' merges lose commits
        from dagster_gpu.index.lance import VectorIndex

        ix = VectorIndex(sys.argv[2], sys.argv[3])
        for _ in range(int(sys.argv[4])):
            tbl = ix.open()
            try:
                tbl.optimize()
                print("optimized", flush=True)
            except RuntimeError as e:
                print("optimize lost", str(e)[:80], flush=True)
