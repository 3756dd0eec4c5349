"""``dagster-gpu``: command-line tools.

    dagster-gpu backfill -m pipelines.definitions -a fortune_embeddings [--partitions a,b] [-w workspace.yaml]
        submit an asset backfill (all registered partitions by default) to $DAGSTER_HOME's instance,
        run the Dagster daemon until it ends, show progress and the per-partition summary.
    dagster-gpu whatif CORPUS --snapshot snap.json [...]
        print the cost policy's plan for a backfill without launching anything.
"""

from __future__ import annotations

import argparse
import importlib
import sys


def _backfill(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="dagster-gpu backfill")
    ap.add_argument("-m", "--module", required=True, help="module holding the Definitions (e.g. pipelines.definitions)")
    ap.add_argument("--attribute", default="defs")
    ap.add_argument("-a", "--asset", required=True, help="asset key, '/'-separated")
    ap.add_argument("--partitions", default=None, help="comma-separated partition keys (default: all registered)")
    ap.add_argument("-w", "--workspace", default="workspace.yaml", help="workspace the daemon loads")
    ap.add_argument("--timeout", type=float, default=24 * 3600.0)
    args = ap.parse_args(argv)

    import dagster as dg

    from dagster_gpu.report import run_backfill_with_progress

    defs = getattr(importlib.import_module(args.module), args.attribute)
    key = dg.AssetKey.from_user_string(args.asset)
    asset = defs.get_assets_def(key)
    instance = dg.DagsterInstance.get()
    keys = args.partitions.split(",") if args.partitions else list(instance.get_dynamic_partitions(asset.partitions_def.name))
    if not keys:
        print(f"no partitions of {args.asset} to backfill", file=sys.stderr)
        return 2
    rows = run_backfill_with_progress(
        instance, defs, key, keys, args.workspace, title=f"dagster-gpu backfill of {args.asset}", timeout_s=args.timeout,
        partitions_def_name=asset.partitions_def.name,
    )
    return 1 if any(not r.ok for r in rows) else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "backfill":
        return _backfill(rest)
    if cmd == "whatif":
        from dagster_gpu.policy.whatif import whatif_main

        return whatif_main(rest)
    print(f"dagster-gpu: unknown command {cmd!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
