"""The main job: embed the Debian ``fortunes`` corpus as a Dagster backfill through gpu_executor.

``python -m pipelines.demo`` (the README's first command runs it after set-up):
  1. copies the fortune data files (one partition per file; records separated by a ``%`` line) into
     the corpus directory;
  2. points DAGSTER_HOME at a project-local instance (SQLite, queued run coordinator);
  3. registers the dynamic partitions, submits an asset backfill of every partition, runs the Dagster
     daemon until the backfill ends, with a progress display;
  4. prints the per-partition summary (rows, seconds, texts/s, backend, GPU-seconds, cost).
With ``--backend slurm|kubernetes|auto`` it first starts what that backend needs (PostgreSQL, the
local Slurm cluster, the Kubernetes control plane: ``pipelines/demo_backends.py``), keeps the instance
on PostgreSQL (home ``.dagster_home_<backend>``), runs the same backfill there and prints where each
partition ran (Slurm job id, pod, or local process) and what it cost.
Exit code 1 if any partition failed, 3 if a service could not be started (the message names the log).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from pipelines.demo_backends import BACKENDS, ServiceError, browse_script, executor_config, instance_yaml, start_services

REPO = Path(__file__).resolve().parents[1]
FORTUNES_DIR = Path("/usr/share/games/fortunes")



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


def where_table(instance, asset_key, rows):
    """Where each materialized partition of ``rows`` (the backfill's summary) ran (backend, scheduler id or
    process, device type) and what it cost (USD): its share of its unit's scheduler bill once that has
    landed, else the cost its step measured."""
    import dagster as dg
    from rich.table import Table

    t = Table(title="Where each partition ran")
    for col in ("partition", "backend", "where", "device type", "GPU-seconds", "cost (USD)", "billing source"):
        t.add_column(col, justify="right" if col in ("GPU-seconds", "cost (USD)") else "left")
    for row in (r for r in rows if r.ok):
        k, bill = row.partition_key, row.bill
        recs = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[k]), limit=1).records
        if not recs:
            continue
        md = {n: v.value for n, v in recs[0].asset_materialization.metadata.items()}
        where = (f"Slurm job {md['slurm/job_id']}" if "slurm/job_id" in md else
                 f"pod {md.get('k8s/namespace', '')}/{md['k8s/pod']}" if "k8s/pod" in md else "local process")
        gpu_s, cost, source = ((bill.gpu_seconds, bill.cost_usd, bill.source) if bill else
                               (md.get("billing/gpu_seconds", 0), md.get("billing/cost_usd", 0), md.get("billing/source", "")))
        t.add_row(k, str(md.get("dagster_gpu/backend", "")), where, str(md.get("billing/device_type", "")),
                  f"{gpu_s:.2f}", f"{cost:.6f}", str(source))
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=BACKENDS, default="local", help="where the steps run (default: local)")
    ap.add_argument("--home", type=Path, default=None, help="DAGSTER_HOME (default: .dagster_home, .dagster_home_<backend>)")
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

    args.home = args.home or REPO / (".dagster_home" if args.backend == "local" else f".dagster_home_{args.backend}")
    prepared = prepare_corpus(args.corpus, limit=args.limit)
    args.home.mkdir(parents=True, exist_ok=True)
    try:
        os.environ.update(start_services(args.backend, args.home))
    except (ServiceError, OSError) as e:
        print(f"demo: starting the services for --backend {args.backend} failed: {e}", file=sys.stderr)
        return 3
    (args.home / "dagster.yaml").write_text(instance_yaml(args.backend, args.max_concurrent_runs, args.home))
    browse = browse_script(args.backend, args.home, REPO)
    os.environ["DAGSTER_HOME"] = str(args.home.resolve())
    os.environ["DAGSTER_GPU_CORPUS_URL"] = str(args.corpus.resolve())
    os.environ["DAGSTER_GPU_OUTPUT_URL"] = str(args.output.resolve())
    run_config = None if args.backend == "local" else {"execution": {"config": executor_config(args.backend, args.home.resolve())}}

    import dagster as dg
    from dagster_gpu.cli_common import console as make_console
    from dagster_gpu.report import run_backfill_with_progress
    from pipelines.definitions import defs, fortune_corpus, fortune_embeddings

    console = make_console()
    instance = dg.DagsterInstance.get()
    # the files this run prepared (--limit N: the first N), not every file already in the corpus directory
    names = {p.name for p in prepared}
    keys = [f.key for f in fortune_corpus.list_files() if f.relative_name in names]
    pdef_name = fortune_embeddings.partitions_def.name
    known = set(instance.get_dynamic_partitions(pdef_name))
    instance.add_dynamic_partitions(pdef_name, [k for k in keys if k not in known])
    console.print(f"Embedding {len(keys)} fortune files through gpu_executor on {args.backend} (DAGSTER_HOME={args.home})")
    t0 = time.time()
    rows = run_backfill_with_progress(
        instance, defs, fortune_embeddings.key, keys, REPO / "workspace.yaml",
        title=f"fortunes demo: {len(keys)} partitions", timeout_s=args.timeout,
        daemon_log=args.home / "daemon.log", console=console, partitions_def_name=pdef_name, run_config=run_config,
    )
    span = time.time() - t0
    if args.summary_json:
        from dagster_gpu.report import useful_fraction

        args.summary_json.write_text(json.dumps({
            "partitions": len(rows), "ok": sum(r.ok for r in rows), "span_s": round(span, 1),
            "embedding_s": round(sum(r.seconds or 0 for r in rows if r.ok), 1),
            "billed_s": round(sum(r.billed_seconds or 0 for r in rows if r.ok), 1),
            "measured_usd": sum(r.cost_usd or 0 for r in rows if r.ok),
            "billed_usd": sum(r.billed_cost_usd or 0 for r in rows),
            "bills_pending": sum(1 for r in rows if r.bill_pending),
            "useful_fraction": useful_fraction(rows), "per_run": fortune_embeddings.backfill_policy.max_partitions_per_run,
        }) + "\n")
    console.print(where_table(instance, fortune_embeddings.key, rows))
    failed = [r for r in rows if not r.ok]
    if failed:
        console.print(f"[red]{len(failed)} partition(s) failed[/red]: see the list above, or the runs in the UI "
                      f"(bash {browse})")
        return 1
    console.print(f"Outputs under {args.output}; browse them with: bash {browse}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
