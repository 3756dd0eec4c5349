"""``dagster-gpu stale -m MODULE -a ASSET [--json]``: the asset's stale partitions and why.

One listing of the corpus and two event-log queries (per 500 partitions), against $DAGSTER_HOME's instance.
Exit 0 (also when some are stale: staleness is a state, not an error), 2 for bad arguments or an unreadable
corpus. The table lists the stale partitions; missing, gone and in-progress ones are counted below it (all
of them in ``--json``).
"""

from __future__ import annotations

import argparse
import json
import sys

from dagster_gpu.commands.code_module import add_workspace_argument, load_definitions
from dagster_gpu.commands.common import console as make_console
from dagster_gpu.commands.common import instance_or_none
from dagster_gpu.corpus.listing import CorpusNotFound, CorpusUnreadable
from dagster_gpu.definitions.partitions import (
    NoCorpus,
    corpus_of,
    embeddings_followed,
    index_staleness,
    partition_staleness,
)


def stale_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="dagster-gpu stale")
    ap.add_argument("-m", "--module", required=True, help="module holding the Definitions (e.g. pipelines.definitions)")
    ap.add_argument("--attribute", default="defs")
    add_workspace_argument(ap)
    ap.add_argument("-a", "--asset", required=True, help="asset key, '/'-separated")
    ap.add_argument("--json", action="store_true", help="print {stale: [...], missing, gone, in_progress} as JSON")
    args = ap.parse_args(argv)

    import dagster as dg

    prog = "dagster-gpu stale"
    loaded = load_definitions(args.module, args.attribute, prog, args.workspace)
    if loaded is None:
        return 2
    module, defs = loaded
    key = dg.AssetKey.from_user_string(args.asset)
    if key not in defs.resolve_all_asset_keys():
        known = ", ".join(sorted(k.to_user_string() for k in defs.resolve_all_asset_keys()))
        print(f"{prog}: no asset {args.asset!r} in {args.module}.{args.attribute} (assets: {known})", file=sys.stderr)
        return 2
    asset = defs.get_assets_def(key)
    instance = instance_or_none(prog)
    if instance is None:
        return 2
    try:  # a vector index asset: stale behind its embeddings; an embedding asset: behind its corpus and code
        follows = embeddings_followed(asset, defs.resolve_asset_graph().assets_defs)
        found = (index_staleness(instance, asset, follows.key) if follows is not None
                 else partition_staleness(instance, asset, corpus_of(asset, module)))
    except (NoCorpus, CorpusNotFound, CorpusUnreadable, TypeError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"asset": key.to_user_string(), **found.to_json()}, indent=2))
        return 0
    from rich.table import Table

    console = make_console()
    table = Table(title=f"Stale partitions of {key.to_user_string()}: {len(found.stale)}")
    table.add_column("partition")
    table.add_column("why")
    for s in found.stale:
        table.add_row(s.partition_key, "; ".join(s.reasons))
    if found.stale:
        console.print(table)
    else:
        console.print(f"no stale partitions of {key.to_user_string()}")
    failed = _failed_line(found)
    if follows is not None:
        console.print(f"{len(found.missing)} missing (not embedded yet), {failed}{len(found.in_progress)} in progress"
                      + (f"; load the stale ones: dagster-gpu backfill -m {args.module} -a {key.to_user_string()} --stale"
                         if found.stale else ""), soft_wrap=True, markup=False)
        return 0
    console.print(f"{len(found.missing)} missing (never materialized), {failed}{len(found.gone)} gone (file deleted: "
                  f"backfill --prune), {len(found.in_progress)} in progress"
                  + (f"; embed the stale ones: dagster-gpu backfill -m {args.module} -a {key.to_user_string()} --stale"
                     if found.stale else ""), soft_wrap=True, markup=False)
    return 0


def _failed_line(found) -> str:
    """``"N failed (backfill --failed; a: why, b: why), "``, or ``""`` when none failed (reasons where known)."""
    if not found.failed:
        return ""
    why = [f"{k}: {found.failed_why[k]}" for k in found.failed if k in found.failed_why]
    return f"{len(found.failed)} failed (latest run failed: backfill --failed{'; ' + '; '.join(why) if why else ''}), "
