"""``dagster-gpu index -m MODULE -a INDEX_ASSET --rebuild``: rebuild a vector index from the current outputs.

For an index whose table no longer fits its embeddings' outputs (a column whose type changed, e.g. another
vector dimension; columns added or dropped are followed by the index asset itself) or that lost partitions:
the LanceDB table is dropped and every partition the embeddings asset materialized is loaded again from its
output (:func:`dagster_gpu.definitions.index_rebuild.rebuild_index`), each recorded as a materialization of the
index asset. ``-a`` names the index asset or the embedding asset it follows. Refused (exit 2) while a run of
the index is in progress; exit 1 when some partitions failed to load (each named with its error), else 0.
"""

from __future__ import annotations

import argparse
import sys

from dagster_gpu.commands.code_module import add_workspace_argument, load_definitions
from dagster_gpu.commands.common import console as make_console
from dagster_gpu.commands.common import instance_or_none
from dagster_gpu.commands.search import SearchError, index_of
from dagster_gpu.definitions.index_rebuild import RebuildRefused, rebuild_index


def index_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="dagster-gpu index", description="maintain a vector index asset's LanceDB table")
    ap.add_argument("-m", "--module", required=True, help="module holding the Definitions (e.g. pipelines.definitions)")
    ap.add_argument("--attribute", default="defs")
    add_workspace_argument(ap)
    ap.add_argument("-a", "--asset", required=True, help="the index asset (or the embedding asset it follows), '/'-separated")
    ap.add_argument("--rebuild", action="store_true",
                    help="drop the table and load every materialized partition from its current output")
    args = ap.parse_args(argv)
    if not args.rebuild:
        ap.error("say what to do: --rebuild")

    import dagster as dg

    prog = "dagster-gpu index"
    loaded = load_definitions(args.module, args.attribute, prog, args.workspace)
    if loaded is None:
        return 2
    _, defs = loaded
    try:
        _, key, emb = index_of(defs, args.asset)
    except SearchError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    instance = instance_or_none(prog)
    if instance is None:
        return 2
    console = make_console()
    try:
        done = rebuild_index(instance, defs.get_assets_def(key), defs.get_assets_def(dg.AssetKey.from_user_string(emb)),
                             on_partition=lambda d: console.print(
                                 f"{d.partition_key}: " + (f"{d.facts['index_rows']} rows" if d.facts else f"failed: {d.error}"),
                                 markup=False, soft_wrap=True))
    except RebuildRefused as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    size = done.size.get("index/disk_bytes")
    console.print(f"rebuilt {key.to_user_string()}: {len(done.loaded)} partition(s), {done.rows} rows, ANN index "
                  f"{done.state}{f', {size} bytes on disk' if size is not None else ''}", markup=False, soft_wrap=True)
    if done.failed:
        print(f"{prog}: {len(done.failed)} partition(s) not loaded: "
              + "; ".join(f"{k}: {v}" for k, v in done.failed.items()), file=sys.stderr)
        return 1
    return 0
