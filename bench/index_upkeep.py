"""The index folder's size on disk after a load of the demo corpus and 20 updates, without and with the upkeep.

    .venv/bin/python bench/index_upkeep.py [--updates 20] [--cleanup-older-than-s 0.001] [--work DIR]

The corpus is the demo's, the Debian fortunes (``/usr/share/games/fortunes``, one partition per data file, the
records counted as ``bench/index_bench.py`` reads them); each partition's output is written by the real writer
with unit vectors of all-MiniLM-L6-v2's 384 dimensions drawn at random (the folder's size depends on the rows,
the commits and the index builds, not on the vectors' values; no model is loaded). Then, once per policy:

1. **load**: one run of the index asset over every partition (:func:`load_partitions`, one commit per partition),
   ending as a run does: :meth:`VectorIndex.ensure_ann_index` then :meth:`VectorIndex.maintain`;
2. **updates**: ``--updates`` times, one partition (round robin over the files) re-embedded (new vectors, same
   rows) and loaded by a one-partition run ending the same way, as the eager index does after the corpus sensor.

Policies: ``none`` (no compaction, LanceDB's 7-day cleanup at an index build: the behaviour before the upkeep) and
``upkeep`` (the defaults of ``vector_index_asset`` with ``cleanup_older_than`` = ``--cleanup-older-than-s``: the
bench's updates come seconds apart, where the default 10 minutes stands for updates spread over a day).
Prints and writes bench/results/index_upkeep.json: per policy the folder's bytes (``VectorIndex.disk_bytes``),
versions and fragments after the load and after the updates, and the wall seconds of each phase.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from index_bench import fortune_files  # noqa: E402


def _write(path: Path, pk: str, n: int, seed: int) -> str:
    sys.path.insert(0, str(REPO / "tests"))
    from index_helpers import write_output

    import numpy as np

    return str(write_output(path, n, 384, pk=pk, fingerprint="fp1-bench",
                            vectors=np.random.default_rng(seed).standard_normal((n, 384))))


def _state(ix) -> dict:
    return {"disk_bytes": ix.disk_bytes(), "versions": ix.versions(), "fragments": ix.fragments(), "rows": ix.count_rows()}


def run(policy: str, files: dict[str, list[str]], work: Path, updates: int, cleanup: timedelta) -> dict:
    from dagster_gpu.definitions.vector_index import load_partitions
    from dagster_gpu.index.lance import (
        DEFAULT_ANN_MIN_ROWS, DEFAULT_COMPACT_MIN_FRAGMENTS, DEFAULT_REBUILD_AFTER_VERSIONS, VectorIndex,
    )

    keys = sorted(files)
    outs = {k: _write(work / "out" / f"{k}.parquet", k, len(files[k]), i) for i, k in enumerate(keys)}
    ix = VectorIndex(str(work / f"lance-{policy}"), "fortunes")
    upkeep = policy == "upkeep"

    def index_run(run_keys):
        for done in load_partitions(ix, run_keys, outs.__getitem__):
            assert done.error is None, done.error
        ix.ensure_ann_index(DEFAULT_ANN_MIN_ROWS, cleanup_older_than=cleanup if upkeep else None,
                            max_versions=DEFAULT_REBUILD_AFTER_VERSIONS if upkeep else None)
        if upkeep:
            ix.maintain(DEFAULT_COMPACT_MIN_FRAGMENTS, cleanup)

    t0 = time.perf_counter()
    index_run(keys)
    loaded = {**_state(ix), "seconds": round(time.perf_counter() - t0, 2)}
    t0 = time.perf_counter()
    for u in range(updates):
        k = keys[u % len(keys)]
        outs[k] = _write(work / "out" / f"{k}.parquet", k, len(files[k]), 1000 + u)
        index_run([k])
    return {"after_load": loaded, "after_updates": {**_state(ix), "seconds": round(time.perf_counter() - t0, 2)}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument("--cleanup-older-than-s", type=float, default=0.001)
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args(argv)
    files = fortune_files()
    work = args.work or Path(tempfile.mkdtemp(prefix="index-upkeep-"))
    try:
        result = {"partitions": len(files), "records": sum(map(len, files.values())), "updates": args.updates,
                  "cleanup_older_than_s": args.cleanup_older_than_s}
        for policy in ("none", "upkeep"):
            result[policy] = run(policy, files, work, args.updates, timedelta(seconds=args.cleanup_older_than_s))
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2))
    out = REPO / "bench" / "results" / "index_upkeep.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
