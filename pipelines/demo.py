"""The main job: embed the Debian ``fortunes`` corpus as a Dagster backfill through gpu_executor.

``python -m pipelines.demo`` (the README's first command runs it after set-up):
  1. copies the fortune data files (one partition per file; records separated by a ``%`` line) into
     the corpus directory;
  2. points DAGSTER_HOME at a project-local instance (SQLite, queued run coordinator);
  3. registers the dynamic partitions, submits an asset backfill of every partition, runs the Dagster
     daemon until the backfill ends, with a progress display;
  4. prints the per-partition summary (rows, seconds, texts/s, backend, GPU-seconds, cost).
Exit code 1 if any partition failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORTUNES_DIR = Path("/usr/share/games/fortunes")

INSTANCE_YAML = """\
# project-local Dagster instance for the demo (SQLite storage under this directory)
run_coordinator:
  module: dagster._core.run_coordinator
  class: QueuedRunCoordinator
  config:
    max_concurrent_runs: {max_runs}
    dequeue_interval_seconds: 1
run_monitoring:
  enabled: true
  poll_interval_seconds: 5
telemetry:
  enabled: false
"""


def prepare_corpus(dest: Path, source: Path = FORTUNES_DIR, limit: int | None = None) -> list[Path]:
    """Copy fortune data files (not ``.dat`` indexes or ``.u8`` links) from ``source`` into ``dest``.

    Raises FileNotFoundError with the install command when the ``fortunes`` package is missing.
    """
    if not source.is_dir():
        raise FileNotFoundError(f"{source} not found: install the Debian package 'fortunes' (apt-get install fortunes)")
    files = sorted(p for p in source.iterdir() if p.is_file() and not p.is_symlink() and p.suffix not in (".dat", ".u8"))
    if limit:
        files = files[:limit]
    dest.mkdir(parents=True, exist_ok=True)
    for p in files:
        target = dest / p.name
        if not target.exists() or target.stat().st_size != p.stat().st_size:
            shutil.copyfile(p, target)
    return [dest / p.name for p in files]


def write_instance_yaml(home: Path, max_runs: int) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(INSTANCE_YAML.format(max_runs=max_runs))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, default=REPO / ".dagster_home", help="DAGSTER_HOME (default: .dagster_home)")
    ap.add_argument("--corpus", type=Path, default=REPO / ".demo" / "corpus")
    ap.add_argument("--output", type=Path, default=REPO / ".demo" / "embeddings")
    ap.add_argument("--limit", type=int, default=None, help="only the first N fortune files")
    ap.add_argument("--max-concurrent-runs", type=int, default=max(2, os.cpu_count() or 2))
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the backfill")
    ap.add_argument("--per-run", type=int, default=None,
                    help="partitions per run (the asset's max_partitions_per_run; default 50: one work unit embeds up to 50 files)")
    ap.add_argument("--summary-json", type=Path, default=None, help="also write the backfill's span and totals here")
    args = ap.parse_args(argv)
    if args.per_run is not None:
        os.environ["DAGSTER_GPU_DEMO_PER_RUN"] = str(args.per_run)

    prepare_corpus(args.corpus, limit=args.limit)
    write_instance_yaml(args.home, args.max_concurrent_runs)
    os.environ["DAGSTER_HOME"] = str(args.home.resolve())
    os.environ["DAGSTER_GPU_CORPUS_URL"] = str(args.corpus.resolve())
    os.environ["DAGSTER_GPU_OUTPUT_URL"] = str(args.output.resolve())

    import dagster as dg
    from rich.console import Console

    from dagster_gpu.report import run_backfill_with_progress
    from pipelines.definitions import defs, fortune_corpus, fortune_embeddings

    console = Console()
    instance = dg.DagsterInstance.get()
    keys = [f.key for f in fortune_corpus.list_files()]
    pdef_name = fortune_embeddings.partitions_def.name
    known = set(instance.get_dynamic_partitions(pdef_name))
    instance.add_dynamic_partitions(pdef_name, [k for k in keys if k not in known])
    console.print(f"Embedding {len(keys)} fortune files through gpu_executor (DAGSTER_HOME={args.home})")
    t0 = time.time()
    rows = run_backfill_with_progress(
        instance, defs, fortune_embeddings.key, keys, REPO / "workspace.yaml",
        title=f"fortunes demo: {len(keys)} partitions", timeout_s=args.timeout,
        daemon_log=args.home / "daemon.log", console=console, partitions_def_name=pdef_name,
    )
    span = time.time() - t0
    if args.summary_json:
        from dagster_gpu.report import useful_fraction

        args.summary_json.write_text(json.dumps({
            "partitions": len(rows), "ok": sum(r.ok for r in rows), "span_s": round(span, 1),
            "embedding_s": round(sum(r.seconds or 0 for r in rows if r.ok), 1),
            "billed_s": round(sum(r.billed_seconds or 0 for r in rows if r.ok), 1),
            "useful_fraction": useful_fraction(rows), "per_run": fortune_embeddings.backfill_policy.max_partitions_per_run,
        }) + "\n")
    failed = [r for r in rows if not r.ok]
    if failed:
        console.print(f"[red]{len(failed)} partition(s) failed[/red]: see the runs in the UI (dagster dev -w workspace.yaml)")
        return 1
    console.print(f"Outputs under {args.output}; browse them with: DAGSTER_HOME={args.home} .venv/bin/dagster dev -w workspace.yaml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
