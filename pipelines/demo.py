"""The main job: embed the Debian ``fortunes`` corpus as a Dagster backfill through gpu_executor.

``python -m pipelines.demo`` (the README's first command runs it after set-up):
  1. copies the fortune data files (one partition per file; records separated by a ``%`` line) into
     the corpus directory;
  2. points DAGSTER_HOME at a project-local instance (SQLite, queued run coordinator);
  3. registers the dynamic partitions, submits an asset backfill of every partition, runs the Dagster
     daemon until the backfill ends, with a progress display;
  4. prints the per-partition summary (rows, seconds, texts/s, backend, GPU-seconds, cost);
  5. loads the embedded partitions into the LanceDB index (``fortune_embeddings_index``, a second backfill,
     ranged runs through gpu_executor on a CPU) and prints its rows (``--no-index`` skips it); then
     ``dagster-gpu search -m pipelines.definitions -a fortune_embeddings "..."`` queries it.
Before the backfill it records each file's source version as an observation of the corpus asset
(``fortune_embeddings_corpus``: what the corpus sensor records each tick), so the UI shows the corpus
upstream of the embeddings with a data version per partition, and a file changed later as "Unsynced".
With ``--backend slurm|kubernetes|auto`` it first starts what that backend needs (PostgreSQL, the
local Slurm cluster, the Kubernetes control plane: ``pipelines/demo_backends.py``; ``--slurm-version 24.11``
the Slurm 24.11 cluster instead of 22.05), keeps the instance on PostgreSQL (home ``.dagster_home_<backend>``,
``.dagster_home_<backend>-24.11`` for Slurm 24.11), runs the same backfill there and prints where each
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

from dagster_gpu.instance.run_queue import host_run_limit
from pipelines.demo_backends import (BACKENDS, DEFAULT_SLURM_VERSION, SLURM_SCRIPTS, WORKER_PYTHON_ENV, ServiceError,
                                     browse_script, executor_config, instance_yaml, start_services)

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


#: How the run worker reached Slurm, by ``--transport``, in the demo's summary.
TRANSPORT_WORDS = {"local": "slurm commands on this host", "ssh": "over ssh to the login node", "rest": "through slurmrestd"}


def target(backend: str, slurm_version: str, transport: str) -> str:
    """Where the demo runs, in words for its summary: the backend, and for ``slurm``/``auto`` the Slurm
    version and how it is reached (``--transport``), e.g. ``slurm (Slurm 22.05, over ssh to the login node)``."""
    if backend not in ("slurm", "auto"):
        return backend
    return f"{backend} (Slurm {slurm_version}, {TRANSPORT_WORDS[transport]})"


def where_table(instance, asset_key, rows, title: str = "Where each partition ran"):
    """Where each materialized partition of ``rows`` (the backfill's summary) ran (backend, scheduler id or
    process, device type) and what it cost (USD): its share of its unit's scheduler bill once that has
    landed, else the cost its step measured."""
    import dagster as dg
    from rich.table import Table

    t = Table(title=title)
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


def default_home(backend: str, slurm_version: str = DEFAULT_SLURM_VERSION) -> str:
    """The demo home's name under the checkout: ``.dagster_home`` (local), ``.dagster_home_<backend>``, and
    ``.dagster_home_<backend>-<version>`` for slurm/auto on another Slurm than the default (each cluster's
    job ids and bills stay in their own instance)."""
    if backend == "local":
        return ".dagster_home"
    if backend in ("slurm", "auto") and slurm_version != DEFAULT_SLURM_VERSION:
        return f".dagster_home_{backend}-{slurm_version}"
    return f".dagster_home_{backend}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=BACKENDS, default="local", help="where the steps run (default: local)")
    ap.add_argument("--slurm-version", choices=tuple(SLURM_SCRIPTS), default=DEFAULT_SLURM_VERSION,
                    help="the local Slurm cluster for --backend slurm|auto (default: 22.05, resources/slurm/cluster.sh; "
                         "24.11: resources/slurm/trixie.sh)")
    ap.add_argument("--transport", choices=("local", "ssh", "rest"), default="local",
                    help="how --backend slurm|auto reaches Slurm: local commands, ssh to the local login node "
                         "(resources/ssh/sshd.sh; Slurm 22.05 only), or rest: slurmrestd with a JWT (the 24.11 "
                         "cluster's, resources/slurm/trixie.sh; implies --slurm-version 24.11)")
    ap.add_argument("--events", choices=("direct", "relay"), default="direct",
                    help="how --backend slurm|auto's array tasks record their events: direct (into the instance's "
                         "PostgreSQL) or relay (into a file in the spool that the run worker reads and stores: compute "
                         "nodes need no database access)")
    ap.add_argument("--home", type=Path, default=None,
                    help="DAGSTER_HOME (default: .dagster_home, .dagster_home_<backend>, .dagster_home_<backend>-24.11)")
    ap.add_argument("--corpus", type=Path, default=REPO / ".demo" / "corpus")
    ap.add_argument("--output", type=Path, default=REPO / ".demo" / "embeddings")
    ap.add_argument("--limit", type=int, default=None, help="only the first N fortune files")
    ap.add_argument("--max-concurrent-runs", type=int, default=host_run_limit(),
                    help="the run queue limit of the demo instance (default: the host's CPU count, at least 1)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the backfill")
    ap.add_argument("--per-run", type=int, default=None,
                    help="partitions per run (the asset's max_partitions_per_run; default 50: one work unit embeds up to 50 files)")
    ap.add_argument("--summary-json", type=Path, default=None, help="also write the backfill's span and totals here")
    ap.add_argument("--no-index", action="store_true", help="do not load the outputs into the LanceDB index afterwards")
    args = ap.parse_args(argv)
    if args.transport == "rest":
        if "--slurm-version" in (argv if argv is not None else sys.argv) and args.slurm_version != "24.11":
            ap.error("--transport rest runs on the 24.11 cluster's slurmrestd: --slurm-version 24.11")
        args.slurm_version = "24.11"
    if args.per_run is not None:
        os.environ["DAGSTER_GPU_DEMO_PER_RUN"] = str(args.per_run)

    args.home = args.home or REPO / default_home(args.backend, args.slurm_version)
    prepared = prepare_corpus(args.corpus, limit=args.limit)
    args.home.mkdir(parents=True, exist_ok=True)
    try:
        if args.transport == "rest" and args.backend not in ("slurm", "auto"):
            raise ValueError("--transport rest needs --backend slurm|auto")
        if args.transport == "ssh" and (args.backend not in ("slurm", "auto") or args.slurm_version != DEFAULT_SLURM_VERSION):
            raise ValueError("--transport ssh needs --backend slurm|auto on Slurm 22.05")
        os.environ.update(start_services(args.backend, args.home, args.slurm_version, args.transport))
    except (ServiceError, OSError, ValueError) as e:
        print(f"demo: starting the services for --backend {args.backend} failed: {e}", file=sys.stderr)
        return 3
    (args.home / "dagster.yaml").write_text(instance_yaml(args.backend, args.max_concurrent_runs, args.home))
    browse = browse_script(args.backend, args.home, REPO, args.slurm_version)
    os.environ["DAGSTER_HOME"] = str(args.home.resolve())
    os.environ["DAGSTER_GPU_CORPUS_URL"] = str(args.corpus.resolve())
    os.environ["DAGSTER_GPU_OUTPUT_URL"] = str(args.output.resolve())
    run_config = None if args.backend == "local" else {"execution": {"config": executor_config(
        args.backend, args.home.resolve(), os.environ.get(WORKER_PYTHON_ENV) if args.slurm_version != DEFAULT_SLURM_VERSION else None,
        args.transport, args.events)}}

    import dagster as dg
    from dagster_gpu.commands.common import console as make_console
    from dagster_gpu.commands.progress import BackfillFailed, run_backfill_with_progress
    from pipelines.definitions import defs, fortune_corpus, fortune_embeddings, fortune_index

    console = make_console()
    instance = dg.DagsterInstance.get()
    # the files this run prepared (--limit N: the first N), not every file already in the corpus directory
    names = {p.name for p in prepared}
    listed = [f for f in fortune_corpus.list_files() if f.relative_name in names]
    keys = [f.key for f in listed]
    pdef_name = fortune_embeddings.partitions_def.name
    known = set(instance.get_dynamic_partitions(pdef_name))
    instance.add_dynamic_partitions(pdef_name, [k for k in keys if k not in known])
    record_corpus(instance, listed)
    on = target(args.backend, args.slurm_version, args.transport)
    console.print(f"Embedding {len(keys)} fortune files through gpu_executor on {on} (DAGSTER_HOME={args.home})")
    t0 = time.time()
    try:
        rows = run_backfill_with_progress(
            instance, defs, fortune_embeddings.key, keys, REPO / "workspace.yaml",
            title=f"fortunes demo: {len(keys)} partitions", timeout_s=args.timeout,
            daemon_log=args.home / "daemon.log", console=console, partitions_def_name=pdef_name, run_config=run_config,
        )
    except BackfillFailed as e:  # its error is printed above the summary
        rows = e.rows
    span = time.time() - t0
    if args.summary_json:
        from dagster_gpu.commands.progress import useful_fraction

        args.summary_json.write_text(json.dumps({
            "partitions": len(rows), "ok": sum(r.ok for r in rows), "span_s": round(span, 1),
            "embedding_s": round(sum(r.seconds or 0 for r in rows if r.ok), 1),
            "billed_s": round(sum(r.billed_seconds or 0 for r in rows if r.ok), 1),
            "measured_usd": sum(r.cost_usd or 0 for r in rows if r.ok),
            "billed_usd": sum(r.billed_cost_usd or 0 for r in rows),
            "bills_pending": sum(1 for r in rows if r.bill_pending),
            "useful_fraction": useful_fraction(rows), "per_run": fortune_embeddings.backfill_policy.max_partitions_per_run,
            "backend": args.backend, "transport": args.transport,
        }) + "\n")
    console.print(where_table(instance, fortune_embeddings.key, rows, title=f"Where each partition ran: {on}"))
    failed = [r for r in rows if not r.ok]
    if failed:
        console.print(f"[red]{len(failed)} partition(s) failed[/red]: see the list above, or the runs in the UI "
                      f"(bash {browse})")
        return 1
    if not args.no_index and index_backfill(instance, defs, fortune_index, [r.partition_key for r in rows], args,
                                            run_config, console):
        console.print(f"[red]the index backfill failed for some partitions[/red]: see its runs in the UI (bash {browse})")
        return 1
    console.print(f"Outputs under {args.output}; browse them with: bash {browse}")
    return 0


def record_corpus(instance, files) -> int:
    """Record the corpus asset's events for each file that is new or whose source version changed (as a corpus
    sensor tick does: :func:`dagster_gpu.partitions.source_versions.record_corpus_versions`); returns how many events."""
    from dagster_gpu.partitions.source_versions import record_corpus_versions
    from pipelines.definitions import fortune_embeddings

    return record_corpus_versions(instance, fortune_embeddings, files)


def index_backfill(instance, defs, index_asset, keys, args, run_config, console) -> int:
    """A backfill of ``index_asset`` over ``keys`` (the embedded partitions), the daemon running until it ends;
    prints the index's rows and the backfill's outcome. Returns the number of partitions not indexed."""
    from dagster_gpu.commands.backfill import DaemonProcess, submit_asset_backfill, wait_for_backfill
    from dagster_gpu.commands.progress import drain_other_runs
    from dagster_gpu.definitions.vector_index import META_EMBEDDINGS, META_TABLE, META_URI
    from dagster_gpu.index.lance import VectorIndex

    t0 = time.time()
    backfill_id = submit_asset_backfill(instance, defs, index_asset.key, keys, title=f"fortunes index: {len(keys)} partitions",
                                        run_config=run_config)
    console.print(f"Backfill [bold]{backfill_id}[/bold]: {len(keys)} partitions of {index_asset.key.to_user_string()}")
    with DaemonProcess(REPO / "workspace.yaml", log_file=args.home / "daemon-index.log") as daemon:
        final = wait_for_backfill(instance, backfill_id, len(keys), timeout_s=args.timeout, daemon=daemon,
                                  partitions_def_name=index_asset.partitions_def.name)
        drain_other_runs(instance, daemon, backfill_id, console, timeout_s=300)
    md = {k: str(getattr(v, "value", v)) for k, v in index_asset.metadata_by_key[index_asset.key].items()}
    ix = VectorIndex(md[META_URI], md[META_TABLE])
    try:
        rows = ix.count_rows()
    except Exception as e:  # no partition loaded: the table may not exist
        rows = f"no table ({type(e).__name__})"
    console.print(f"Index {ix!r}: {rows} rows; {final.succeeded}/{len(keys)} partitions loaded, backfill {final.status.lower()} "
                  f"in {final.runs} run(s), {time.time() - t0:.0f} s; search it with: .venv/bin/dagster-gpu search "
                  f"-m pipelines.definitions -a {md[META_EMBEDDINGS]} \"some text\"")
    return len(keys) - final.succeeded


if __name__ == "__main__":
    sys.exit(main())
