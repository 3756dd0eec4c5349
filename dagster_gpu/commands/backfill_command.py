"""``dagster-gpu backfill``: register the asset's corpus files, select partitions, submit an asset backfill and run the
Dagster daemon until it ends, with progress and a per-partition summary (the options: :mod:`dagster_gpu.commands.main`)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import dagster as dg

from dagster_gpu.commands.backfill import live_backfill_daemon, workspace_load_errors
from dagster_gpu.commands.code_module import load_definitions
from dagster_gpu.commands.common import console as make_console
from dagster_gpu.commands.common import instance_or_none
from dagster_gpu.commands.index_wait import index_assets_following
from dagster_gpu.corpus.listing import CorpusNotFound, CorpusUnreadable
from dagster_gpu.definitions.partitions import (
    NoCorpus,
    bridged_selection,
    corpus_of,
    embeddings_followed,
    gone_partitions,
    indexes_following,
    prune_partitions,
    register_corpus_files,
    select_partitions,
)
from dagster_gpu.instance.run_queue import daemon_instance_ref
from dagster_gpu.partitions.source_versions import record_corpus_versions


def backfill_main(argv: list[str]) -> int:
    """``dagster-gpu backfill`` (its arguments and steps: :mod:`dagster_gpu.commands.main`'s docstring); the exit
    status: 0 when every selected partition materialized (or none was selected with a filter), 1 when one failed or the
    backfill ended otherwise, 2 for bad arguments, a code location or workspace that does not load, a corpus that
    cannot be listed."""
    ap = argparse.ArgumentParser(prog="dagster-gpu backfill")
    ap.add_argument("-m", "--module", required=True, help="module holding the Definitions (e.g. pipelines.definitions)")
    ap.add_argument("--attribute", default="defs")
    ap.add_argument("-a", "--asset", required=True, help="asset key, '/'-separated")
    ap.add_argument("--partitions", default=None, help="comma-separated partition keys (default: all registered)")
    ap.add_argument("--missing", action="store_true", help="only partitions never materialized")
    ap.add_argument("--failed", action="store_true", help="only partitions whose latest run failed or was canceled")
    ap.add_argument("--stale", action="store_true", help="only partitions whose file or fingerprint changed (dagster-gpu stale)")
    ap.add_argument("--no-register", action="store_true", help="do not add the corpus files as partitions first")
    ap.add_argument("--prune", action="store_true",
                    help="first delete the partitions whose corpus file is gone, their outputs and index rows "
                         "(their materializations stay)")
    ap.add_argument("-w", "--workspace", default="workspace.yaml",
                    help="workspace the dagster-daemon this command starts loads (default ./workspace.yaml); not "
                         "needed when a daemon already runs on the instance: the backfill is submitted to it")
    ap.add_argument("--timeout", type=float, default=24 * 3600.0)
    ap.add_argument("--bills-wait", type=float, default=60.0,
                    help="seconds to keep the daemon up after the runs end for the schedulers' bills (default 60)")
    ap.add_argument("--runs-wait", type=float, default=300.0,
                    help="seconds to keep the daemon this command started up for the runs its sensors started, "
                         "queued or requested as a backfill meanwhile (the index following the embeddings), which "
                         "stopping it would fail or leave queued (default 300)")
    ap.add_argument("--max-concurrent-runs", type=int, default=None, metavar="N",
                    help="runs the dagster-daemon this command starts runs at once (its QueuedRunCoordinator's "
                         "max_concurrent_runs, for that daemon only: dagster.yaml is not rewritten); default: the "
                         "limit $DAGSTER_HOME/dagster.yaml sets (concurrency.runs.max_concurrent_runs or "
                         "run_coordinator.config.max_concurrent_runs), else os.cpu_count() (at least 1). Refused "
                         "when a daemon already runs on the instance: its limit is its dagster.yaml's")
    args = ap.parse_args(argv)
    if args.max_concurrent_runs is not None and args.max_concurrent_runs < 1:
        ap.error(f"--max-concurrent-runs must be at least 1, got {args.max_concurrent_runs}")
    if args.partitions and (args.missing or args.failed or args.stale):
        ap.error("--partitions cannot be combined with --missing/--failed/--stale")
    from dagster_gpu.commands.progress import (  # deferred: it loads the Kubernetes client; --help 1.8 -> 1.3 s CPU
        BackfillAbandoned,
        BackfillFailed,
        run_backfill_with_progress,
    )

    console = make_console()
    loaded = load_definitions(args.module, args.attribute, "dagster-gpu backfill", args.workspace)
    if loaded is None:
        return 2
    module, defs = loaded
    key = dg.AssetKey.from_user_string(args.asset)
    keys_defined = defs.resolve_all_asset_keys()
    if key not in keys_defined:
        known = ", ".join(sorted(k.to_user_string() for k in keys_defined))
        print(f"dagster-gpu backfill: no asset {args.asset!r} in {args.module}.{args.attribute} (assets: {known})", file=sys.stderr)
        return 2
    asset = defs.get_assets_def(key)
    try:  # a vector index asset: its partitions are its embedding asset's, registered from that one's corpus
        follows = embeddings_followed(asset, defs.resolve_asset_graph().assets_defs)
    except NoCorpus as e:
        print(f"dagster-gpu backfill: {e}", file=sys.stderr)
        return 2
    source = follows or asset
    instance = instance_or_none("dagster-gpu backfill")
    if instance is None:
        return 2
    running = live_backfill_daemon(instance)
    if running is not None and args.max_concurrent_runs is not None:
        print(f"dagster-gpu backfill: --max-concurrent-runs applies to the dagster-daemon this command starts, but one "
              f"already runs on this instance (id {running.daemon_id}): its limit is max_concurrent_runs under "
              f"run_coordinator.config (or concurrency.runs) in {instance.root_directory}/dagster.yaml; set it there "
              f"and restart that daemon, or stop it and run this command without it", file=sys.stderr)
        return 2
    if running is None and not Path(args.workspace).is_file():
        print(f"dagster-gpu backfill: workspace file {args.workspace} not found: no dagster-daemon runs on this "
              f"instance, and the one this command starts loads the code from it (-w PATH, e.g. the repository's "
              f"workspace.yaml)", file=sys.stderr)
        return 2
    if running is None:  # the daemon this command starts must load the code: say now, before anything is stored
        try:
            failing = workspace_load_errors(instance, args.workspace)
        except Exception:  # noqa: BLE001 - a file Dagster cannot read: the daemon exits, and its log says why
            failing = {}
        if failing:
            print(f"dagster-gpu backfill: workspace file {args.workspace} does not load: "
                  + "; ".join(f"code location {name!r}: {why}" for name, why in failing.items()), file=sys.stderr)
            return 2
    gone: set[str] = set()  # registered partitions whose corpus file is gone (known when the corpus was listed)
    if args.prune or not args.no_register:
        try:
            corpus = corpus_of(source, module)
            files = corpus.list_files(members=False)
            columnless = [] if corpus.group_buckets else corpus.text_format.columnless([f.uri for f in files])
            if columnless:  # each would fail its partition, after its unit loaded the model
                names = ", ".join(Path(u).name for u in columnless[:5]) + (" …" if len(columnless) > 5 else "")
                print(f"dagster-gpu backfill: {len(columnless)} of {len(files)} files of corpus {corpus.url} (pattern "
                      f"{corpus.pattern!r}) are read as text, which has no columns: id_column / carry_columns need "
                      f"parquet or JSON Lines files (narrow the pattern, e.g. '*.jsonl', or set TextFormat(format=...)): "
                      f"{names}", file=sys.stderr)
                return 2
            done = prune_partitions(instance, source, corpus, delete_outputs=True, files=files,
                                    indexes=indexes_following(defs.resolve_asset_graph().assets_defs, source.key)) if args.prune else []
            pruned = [p.partition_key for p in done if p.error is None]
            added = [] if args.no_register else register_corpus_files(instance, source, corpus, files=files)
            recorded = 0 if args.no_register else record_corpus_versions(instance, source, files)
            gone = set(gone_partitions(instance, source, files))
        except (NoCorpus, CorpusNotFound, CorpusUnreadable, TypeError, ValueError) as e:
            print(f"dagster-gpu backfill: {e}", file=sys.stderr)
            return 2
        if args.prune:
            console.print(f"Corpus {corpus.url}: {len(pruned)} partition(s) of deleted files removed"
                          + (f": {', '.join(pruned)}" if pruned else ""), soft_wrap=True)
            for p in done:
                console.print(f"  {p.describe()}", soft_wrap=True, markup=False)
        if not args.no_register:
            console.print(f"Corpus {corpus.url}: {len(added)} new partition(s) registered"
                          + (f", {recorded // 2} file version(s) recorded on {source.key.to_user_string()}_corpus"
                             if recorded else ""), soft_wrap=True)
    if args.partitions:
        keys = [k.strip() for k in args.partitions.split(",") if k.strip()]
        unknown = sorted(set(keys) - set(instance.get_dynamic_partitions(asset.partitions_def.name)))
        if unknown:
            print(f"dagster-gpu backfill: partitions not registered for {args.asset}: {', '.join(unknown)}", file=sys.stderr)
            return 2
    else:
        try:
            keys = select_partitions(instance, asset, missing=args.missing, failed=args.failed, stale=args.stale,
                                     corpus=corpus_of(asset, module) if args.stale and follows is None else None,
                                     follows=follows)
        except (NoCorpus, CorpusNotFound, CorpusUnreadable) as e:
            print(f"dagster-gpu backfill: {e}", file=sys.stderr)
            return 2
        if left_out := [k for k in keys if k in gone]:  # their unit would fail on the missing file
            keys = [k for k in keys if k not in gone]
            console.print(f"{len(left_out)} registered partition(s) whose corpus file is gone left out: "
                          f"{', '.join(left_out[:5])}" + (" …" if len(left_out) > 5 else "")
                          + ("" if args.prune else "; --prune deletes them (with their outputs and index rows)"),
                          soft_wrap=True, markup=False)
    if not keys:
        flags = (("missing", args.missing), ("failed", args.failed), ("stale", args.stale))
        what = " and ".join(w for w, on in flags if on) or "registered"
        print(f"no {what} partitions of {args.asset} to backfill", file=sys.stderr)
        return 0 if (args.missing or args.failed or args.stale) else 2
    if (args.missing or args.failed or args.stale) and follows is None:
        # scattered keys: one unit over them and the few fine keys between, where that is cheaper than more units
        selected = keys
        keys = bridged_selection(instance, asset, selected, corpus_of(asset, module))
        if len(keys) > len(selected):
            extra = [k for k in keys if k not in set(selected)]
            console.print(f"{len(extra)} materialized partition(s) between them redone in the same unit "
                          f"(cheaper than another unit's start-up): {', '.join(extra[:10])}" + (" …" if len(extra) > 10 else ""),
                          soft_wrap=True, markup=False)
    daemon_ref = None
    if running is None:
        daemon_ref, limit, why = daemon_instance_ref(instance.root_directory, args.max_concurrent_runs)
        console.print(f"The dagster-daemon this command starts runs at most {limit} runs at once ({why})",
                      soft_wrap=True, markup=False)
    try:
        rows = run_backfill_with_progress(
            instance, defs, key, keys, args.workspace, title=f"dagster-gpu backfill of {args.asset}", timeout_s=args.timeout,
            partitions_def_name=asset.partitions_def.name,
            console=console, bills_wait_s=args.bills_wait, runs_wait_s=args.runs_wait, running_daemon=running,
            daemon_instance_ref=None if running is not None else daemon_ref,
            indexes=index_assets_following(defs, key) if follows is None else (),
            code_location=f"-m {shlex.quote(args.module)}"
                          + ("" if args.attribute == "defs" else f" --attribute {shlex.quote(args.attribute)}"),
        )
    except (BackfillAbandoned, BackfillFailed) as e:
        print(f"dagster-gpu backfill: {e}", file=sys.stderr)
        return 1
    return 1 if any(not r.ok for r in rows) else 0
