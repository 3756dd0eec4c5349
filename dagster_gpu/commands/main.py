"""``dagster-gpu``: command-line tools.

    dagster-gpu backfill -m pipelines.definitions -a fortune_embeddings [--missing] [--failed] [--stale]
            [--partitions a,b] [--no-register] [--prune] [-w workspace.yaml] [--max-concurrent-runs N]
        register the asset's corpus files as partitions (those not yet registered) and record their source
        versions on its corpus asset (as a corpus sensor tick does: the UI counts the files), submit an asset
        backfill of the selected partitions (all registered by default; --missing: never materialized;
        --failed: latest run failed or canceled; --stale: file or fingerprint changed, as `stale` lists them;
        --prune first deletes the partitions of files no longer in the corpus, their output parquet files
        and their rows in the vector indexes that follow the asset) to $DAGSTER_HOME's instance; when a
        dagster-daemon already runs on it (`dagster dev`, a deployment: its heartbeats) leave the backfill to
        it, else check that -w's workspace loads and run a daemon on it until the backfill ends (and the runs
        its sensors started, queued or requested meanwhile, up to --runs-wait); within the same --runs-wait, wait
        until every vector index following the asset (with an automation condition) has materialized each partition
        the backfill materialized, after it (read from the instance, whoever requests the index's runs; a running
        daemon's too), and name each index still behind, with why and the command that loads it; show progress
        (plain lines when not on a terminal), the per-partition summary and the failed partitions. Partitions of files gone from
        the corpus are left out (named; --prune deletes them). A daemon that dies, the timeout or Ctrl-C cancels
        the backfill; one ending with an error stored on it shows the error and exits 1. The daemon it starts
        runs at most --max-concurrent-runs runs at once (default: the limit dagster.yaml sets, else the host's
        CPU count), without rewriting dagster.yaml.
    dagster-gpu stale -m MODULE -a ASSET [-w workspace.yaml] [--json]
        list the partitions whose file (source version) or embedding fingerprint (the asset's code version)
        changed since their latest materialization, with why; never materialized ones are "missing".
    dagster-gpu whatif (CORPUS [--pattern GLOB] [--recursive] | -m MODULE -a ASSET [-w workspace.yaml])
            [--snapshot snap.json | --save-snapshot snap.json] [...]
        print the cost policy's plan for a backfill without launching anything (live backend state
        and the asset's history by default; --snapshot for an offline plan); the partition keys are
        the asset's (CorpusSource's listing).
    dagster-gpu report -a ASSET (--backfill ID | --last N) [-o report.html]
        write a self-contained HTML report (cost, GPU-seconds, useful fraction, utilization,
        throughput, placements, estimate vs measured cost, failed partitions and why) of a backfill,
        or of the asset's last N materializations and its failed runs since.
    dagster-gpu search -m MODULE -a ASSET "text" [-k 10] [--fingerprint FP] [-w workspace.yaml] [--json]
        the nearest rows of a vector index asset (or of the index following an embedding asset): the
        query embedded with the rows' model and options and the model's query prompt.
    dagster-gpu index -m MODULE -a INDEX_ASSET --rebuild [-w workspace.yaml]
        drop the vector index asset's LanceDB table and load every partition its embeddings asset materialized from
        the current outputs (after a change of the output columns), recording a materialization per partition.

-m's module is imported from the working directory, else from the working_directory of -w's code locations
(default ./workspace.yaml). Each command's own options: dagster-gpu COMMAND --help.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from dagster_gpu.commands.code_module import load_definitions
from dagster_gpu.commands.common import no_instance_yaml_warning_once


def _backfill(argv: list[str]) -> int:
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

    import dagster as dg

    from dagster_gpu.commands.common import console as make_console, instance_or_none
    from dagster_gpu.corpus.listing import CorpusNotFound, CorpusUnreadable
    from dagster_gpu.definitions.partitions import (
        NoCorpus, bridged_selection, corpus_of, embeddings_followed, gone_partitions, indexes_following, prune_partitions,
        register_corpus_files, select_partitions,
    )
    from dagster_gpu.commands.index_wait import index_assets_following
    from dagster_gpu.commands.progress import BackfillAbandoned, BackfillFailed, run_backfill_with_progress
    from dagster_gpu.partitions.source_versions import record_corpus_versions

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
    from pathlib import Path

    from dagster_gpu.commands.backfill import live_backfill_daemon

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
        from dagster_gpu.commands.backfill import workspace_load_errors

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
        from dagster_gpu.instance.run_queue import daemon_instance_ref

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


def quiet_dagster_warnings() -> None:
    """Silence Dagster's BetaWarning and PreviewWarning (a parameter or API "currently in beta/preview"): they
    speak to the author of the code location, once per import, and would open every command's output. The
    code location's own process (``dagster dev``, the daemon) still shows them. Dagster's "no dagster.yaml found"
    warning shows once (:func:`dagster_gpu.commands.common.no_instance_yaml_warning_once`)."""
    import warnings

    import dagster as dg

    for category in (dg.BetaWarning, dg.PreviewWarning):
        warnings.filterwarnings("ignore", category=category)
    no_instance_yaml_warning_once()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"dagster-gpu: unknown command {cmd!r}\n{__doc__}", file=sys.stderr)
        return 2
    quiet_dagster_warnings()
    if cmd == "backfill":
        return _backfill(rest)
    import importlib

    return getattr(importlib.import_module(f"dagster_gpu.commands.{cmd}"), COMMANDS[cmd])(rest)


#: Every subcommand -> the function of ``dagster_gpu.commands.<name>`` that runs it (``backfill``: :func:`_backfill`
#: here); the module docstring (``dagster-gpu --help``) describes each.
COMMANDS = {"backfill": "_backfill", "stale": "stale_main", "whatif": "whatif_main", "report": "report_main",
            "search": "search_main", "index": "index_main"}


if __name__ == "__main__":
    sys.exit(main())
