"""Profile one work unit in-process: N tiny partitions in one ranged run, on a PostgreSQL-backed instance.

    bash resources/postgres/postgres.sh start
    .venv/bin/python bench/profile_unit.py [N=50] [pg|ephemeral]

Runs the embedding asset's body for a range of N generated fortune files (bench/make_corpus.py, 20 records
each) with Dagster's in-process executor under cProfile, prints wall seconds, the materializations'
embedding seconds and their ratio, then the top functions by own time (database connects, event writes and
the encoder's forward pass are the ones to look at). The profile is saved to /tmp/dagster-gpu-profile-unit<N>.prof.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import dagster as dg  # noqa: E402

import slurm_helpers as H  # noqa: E402
from make_corpus import make_corpus  # noqa: E402

from dagster_gpu import CorpusSource, TextFormat, embedding_asset  # noqa: E402
from dagster_gpu.definitions.asset_options import ComputeSpec  # noqa: E402
from dagster_gpu.embedding.spec import EmbeddingSpec  # noqa: E402


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    mode = sys.argv[2] if len(sys.argv) > 2 else "pg"
    work = Path(f"/tmp/dagster-gpu-profile-unit{n}")
    corpus = work / "corpus"
    make_corpus(corpus, n, 20)
    keys = sorted(p.name for p in corpus.iterdir())
    if mode == "pg":
        _, env = H.make_dagster_home()
        os.environ.update(env)
    asset = embedding_asset("profiled", corpus=CorpusSource(url=str(corpus), text_format=TextFormat(
        format="text", record_separator_line="%")), output=str(work / "out"), spec=EmbeddingSpec(batch_size=64),
        compute=ComputeSpec(device="cpu", max_partitions_per_run=n))
    job = dg.define_asset_job("profiled_job", selection=[asset], executor_def=dg.in_process_executor)
    defs = dg.Definitions(assets=[asset], jobs=[job])
    instance = dg.DagsterInstance.get() if mode == "pg" else dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(asset.partitions_def.name, keys)
    t0 = time.time()
    prof = cProfile.Profile()
    prof.enable()
    result = defs.get_job_def("profiled_job").execute_in_process(
        instance=instance, raise_on_error=False,
        tags={"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]})
    prof.disable()
    wall = time.time() - t0
    recs = instance.fetch_materializations(asset.key, limit=n + 5).records
    embed = sum(r.asset_materialization.metadata["embedding/seconds"].value for r in recs)
    print(f"success {result.success}; {len(recs)} materializations; wall {wall:.1f} s; embedding {embed:.1f} s; "
          f"ratio {embed / wall:.3f}")
    out = f"/tmp/dagster-gpu-profile-unit{n}.prof"
    prof.dump_stats(out)
    pstats.Stats(out).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
