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

import sys
from importlib import import_module

#: command -> (module, function) that runs it. A command's module is imported when the command runs:
#: ``dagster-gpu --help`` then starts in the interpreter's time alone instead of importing Dagster and every command.
COMMANDS = {
    "backfill": ("dagster_gpu.commands.backfill_command", "backfill_main"),
    "stale": ("dagster_gpu.commands.stale", "stale_main"),
    "whatif": ("dagster_gpu.commands.whatif", "whatif_main"),
    "report": ("dagster_gpu.commands.report", "report_main"),
    "search": ("dagster_gpu.commands.search", "search_main"),
    "index": ("dagster_gpu.commands.index", "index_main"),
}


def quiet_dagster_warnings() -> None:
    """Silence Dagster's BetaWarning and PreviewWarning (a parameter or API "currently in beta/preview"): they
    speak to the author of the code location, once per import, and would open every command's output. The
    code location's own process (``dagster dev``, the daemon) still shows them. Dagster's "no dagster.yaml found"
    warning shows once (:func:`dagster_gpu.commands.common.no_instance_yaml_warning_once`)."""
    import warnings

    import dagster as dg

    from dagster_gpu.commands.common import no_instance_yaml_warning_once  # deferred: --help loads no Dagster

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
    module, function = COMMANDS[cmd]
    return getattr(import_module(module), function)(rest)  # deferred: `dagster-gpu --help` imports no command


if __name__ == "__main__":
    sys.exit(main())
