"""``dagster-gpu whatif``: print the plan for a backfill without launching anything.

    dagster-gpu whatif CORPUS [--pattern GLOB] [--recursive] [--executor-config executor.yaml] [--asset KEY]
        [--save-snapshot snap.json]
    dagster-gpu whatif -m MODULE --asset KEY [...]     (the asset's own corpus: URL, pattern, sub-directories)
    dagster-gpu whatif CORPUS --snapshot snap.json [--rate-card ratecard.yaml]
        [--tag dagster-gpu/deadline-seconds=600 ...] [--history history.json] [--json] [--max-rows N] [--per-run K]

Live by default: the backends configured in ``--executor-config`` (gpu_executor's config, the
``execution: config:`` mapping; none given = ``local`` only) are asked for their state exactly as
``backend: auto`` asks them before a launch (:func:`dagster_gpu.executor.auto.gather_snapshot`; an
unreachable backend is planned around, with the reason), and the throughput comes from ``--asset``'s
earlier materializations in ``$DAGSTER_HOME``'s instance (:func:`dagster_gpu.instance.history.runtime_model`).
``--save-snapshot FILE`` writes the live snapshot as JSON for later offline plans; ``--snapshot FILE``
plans offline from such a file (example: ``resources/whatif-snapshot.json``).

CORPUS is a directory or an fsspec URL (``s3://bucket/prefix``); each corpus file is one partition, listed
and keyed by :class:`dagster_gpu.corpus.CorpusSource` exactly as the asset's partitions are (key = the file
name, see :func:`dagster_gpu.core.partition_keys.partition_key_for`; ``--pattern``/``--recursive`` as the asset's
CorpusSource has them, or ``-m MODULE --asset KEY`` to take the asset's own), its size in bytes the
partition size. The plans are :func:`dagster_gpu.policy.whatif.plan`'s, one per mode (``auto``, ``slurm``,
``kubernetes``); printed: backend + estimated cost per partition (its share of its unit's), the part of it that is
expected preemption rework, and the totals of the three modes.

Preemption: each preemptible pool's rate (per GPU-hour) is the snapshot's (the backend's configured prior,
``preemptions_per_gpu_hour``) blended with the preemptions ``$DAGSTER_HOME``'s instance observed in that pool
(:func:`dagster_gpu.instance.preemption.with_learned_rates`); a preemption loses a start-up and half a
checkpoint interval (``--checkpoint-records``, the asset's own with ``-m``; none: half the partition in flight).
The rate used per pool, and whether learned or prior, is printed above the totals (JSON: ``preemption``). ``whatif_main(argv)`` is the entry point the ``dagster-gpu`` CLI hooks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.commands.code_module import add_workspace_argument, import_code_module
from dagster_gpu.commands.common import console, instance_or_none
from dagster_gpu.core.request import BACKENDS, GpuRequest
from dagster_gpu.corpus.listing import CorpusSource
from dagster_gpu.definitions.assets import DEFAULT_PARTITIONS_PER_RUN
from dagster_gpu.definitions.partitions import corpus_of
from dagster_gpu.executor.auto import checkpoint_records, gather_snapshot
from dagster_gpu.executor.fleet import gather_fleet, with_learned_fleet_rates
from dagster_gpu.executor.step_handler import GpuStepHandler
from dagster_gpu.fleet.whatif import plan_fleet, totals_by_cluster
from dagster_gpu.instance.history import fetch_unit_samples, runtime_model
from dagster_gpu.instance.preemption import with_learned_rates
from dagster_gpu.k8s.kueue import queue_lines
from dagster_gpu.partitions.run_ranges import max_partitions_per_run
from dagster_gpu.partitions.unit_cost import cost_source, overheads
from dagster_gpu.policy.batching import UnitCost, trickle
from dagster_gpu.policy.runtime import HistoryPoint, RuntimeModel
from dagster_gpu.policy.snapshot import Snapshot
from dagster_gpu.policy.whatif import MODES, PlanRow, plan, totals


def list_partitions(corpus: CorpusSource) -> list[tuple[str, int]]:
    """``(partition key, size in bytes)`` of each file of ``corpus``, sorted by key: the asset's partition keys
    (:meth:`CorpusSource.list_files`, the listing the corpus sensor and ``dagster-gpu backfill`` register).
    Raises CorpusNotFound (a FileNotFoundError) when the corpus URL does not exist."""
    return [(f.key, f.size_bytes) for f in corpus.list_files(members=False)]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dagster-gpu whatif", 
                                 description="What-if: print the plan for a backfill without launching anything.")
    ap.add_argument("corpus", nargs="?", help="corpus directory or fsspec URL; one file per partition "
                    "(default with -m: the asset's corpus)")
    ap.add_argument("--pattern", default="*", help="shell glob on file names, as the asset's CorpusSource (default *)")
    ap.add_argument("--recursive", action="store_true", help="include sub-directories, as the asset's CorpusSource")
    ap.add_argument("-m", "--module", help="module holding the Definitions: plan the corpus of --asset as defined there")
    add_workspace_argument(ap)
    ap.add_argument("--snapshot", help="plan offline from this snapshot JSON (Snapshot.to_json) instead of live state")
    ap.add_argument("--executor-config", help="gpu_executor config YAML for live state (default: local only)")
    ap.add_argument("--save-snapshot", help="write the live snapshot JSON here (for --snapshot later)")
    ap.add_argument("-a", "--asset", help="asset key ('/'-separated) whose materializations in $DAGSTER_HOME give the throughput")
    ap.add_argument("--rate-card", help="rate card YAML (default: the snapshot's, else the packaged one)")
    ap.add_argument("--tag", action="append", default=[], help="step tag KEY=VALUE (dagster-gpu/...)")
    ap.add_argument("--history", help="JSON list of HistoryPoint fields (rows, texts_per_second, bytes, ...)")
    ap.add_argument("--json", action="store_true", help="print the plan as JSON instead of tables")
    ap.add_argument("--max-rows", type=int, default=50, help="partitions shown in the table (default 50)")
    ap.add_argument("--checkpoint-records", type=int, help="records between checkpoint parts, what a preemption loses "
                    "half of (default: the asset's checkpoint_every_batches x read_batch_rows with -m, else 0: no "
                    "checkpoints, a preemption loses half the partition in flight)")
    ap.add_argument("--per-run", type=int, help="partitions per run, each run one work unit (default: the asset's "
                    "max_partitions_per_run with -m, else 50, embedding_asset's default; 1: a unit per partition)")
    tr = ap.add_argument_group("trickle", "price a trickle of files under the corpus sensor instead of a backfill "
                               "(no corpus needed): useful fraction and cost per day, knob off and on")
    tr.add_argument("--trickle-every", type=float, metavar="S", help="one file every S seconds")
    tr.add_argument("--file-bytes", type=int, default=2000, help="bytes per file (default 2000)")
    tr.add_argument("--max-delay", type=float, action="append", default=[], metavar="S",
                    help="corpus_sensor max_delay_seconds to price (repeatable; the knob off is always shown)")
    tr.add_argument("--target", type=float, default=0.5, help="target_useful_fraction (default 0.5)")
    tr.add_argument("--tick", type=float, default=30.0, help="sensor interval in seconds (default 30)")
    tr.add_argument("--startup-seconds", type=float, metavar="S",
                    help="a unit's start-up (default: learned from -a's finished units, else the packaged "
                         "calibration; about 2 s with the local fork server, docs/benchmarks.md)")
    tr.add_argument("--on", default="local/cpu", metavar="BACKEND/DEVICE",
                    help="rate card entry billed (default local/cpu); a GPU device prices at the GPU throughput")
    return ap


def trickle_rows(args: argparse.Namespace, model: RuntimeModel, rc: RateCard | None, instance=None) -> list[dict]:
    """One row per knob setting (off, then each ``--max-delay``): :func:`dagster_gpu.policy.batching.trickle`
    with ``model``'s embedding seconds per byte and a unit's start-up and per-partition seconds: learned from
    ``-a``'s finished units on that kind of device in ``instance``, else the packaged unit calibration
    (:func:`dagster_gpu.partitions.unit_cost.overheads`); ``--startup-seconds`` overrides the start-up (e.g.
    a fork server's)."""

    backend, _, device = args.on.partition("/")
    rate = (rc or RateCard.load()).gpu_hour_rate(backend, device or "cpu")
    cpu = (device or "cpu") == "cpu"
    tps = model.cpu_rate() if cpu else model.texts_per_second
    units = fetch_unit_samples(instance, args.asset, cpu=cpu) if instance is not None and args.asset else []
    startup_s, per_partition_s, where = overheads(units, model.rows_per_byte / tps, str(args.asset))
    if args.startup_seconds is not None:
        startup_s, where = args.startup_seconds, f"--startup-seconds, {where}"
    cost = UnitCost(startup_s, per_partition_s, model.rows_per_byte / tps,
                    source=cost_source(startup_s, per_partition_s, where, model, cpu))
    rows = []
    for delay in [None, *args.max_delay]:
        p = trickle(args.trickle_every, args.file_bytes, cost, rate_usd_per_hour=rate, tick_s=args.tick,
                    max_delay_s=delay, target_useful_fraction=args.target, max_per_unit=args.per_run)
        rows.append({"max_delay_seconds": delay, "files_per_unit": p.files_per_unit, "units_per_day": p.units_per_day,
                     "useful_fraction": p.useful_fraction, "billed_s_per_day": p.billed_s_per_day,
                     "cost_usd_per_day": p.cost_usd_per_day, "freshness_mean_s": p.freshness_mean_s,
                     "rate_usd_per_hour": rate, "cost_source": cost.source})
    return rows


def _print_trickle(rows: list[dict], args: argparse.Namespace) -> None:
    from rich.table import Table


    t = Table(title=f"a file of {args.file_bytes} bytes every {args.trickle_every:g} s, sensor every {args.tick:g} s, "
                    f"on {args.on} at {rows[0]['rate_usd_per_hour']:.4f} USD/h")
    for c in ("max_delay_seconds", "files/unit", "units/day", "useful", "billed s/day", "USD/day", "freshness (mean s)"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row("off" if r["max_delay_seconds"] is None else f"{r['max_delay_seconds']:g}", str(r["files_per_unit"]),
                  f"{r['units_per_day']:.0f}", f"{r['useful_fraction']:.1%}", f"{r['billed_s_per_day']:.0f}",
                  f"{r['cost_usd_per_day']:.4f}", f"{r['freshness_mean_s']:.0f}")
    console().print(t)
    console().print(f"costs: {rows[0]['cost_source']}", soft_wrap=True, markup=False)


def _executor_config(path: str | None, rate_card: str | None) -> dict:
    """gpu_executor's config from a YAML file (the mapping itself, or a run config holding
    ``execution: config:``); ``{}`` (local only) when no file is given. Raises ValueError naming the file
    when it holds no mapping."""
    import yaml

    cfg: dict = {}
    if path:
        doc = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(doc, dict):
            raise ValueError(f"{path}: expected a mapping (gpu_executor's config)")
        cfg = dict(doc.get("execution", {}).get("config", doc) if "execution" in doc else doc)
    if rate_card:
        cfg["rate_card"] = rate_card
    return cfg


def corpus_for(args: argparse.Namespace) -> tuple[CorpusSource, int, float | None]:
    """The corpus to plan, the partitions per run and the records between checkpoint parts: the asset's own
    CorpusSource, ``max_partitions_per_run`` and op tag ``dagster-gpu/checkpoint-records`` with ``-m MODULE --asset
    KEY`` (CORPUS, when also given, must be its URL), else one on CORPUS with ``--pattern``/``--recursive``, 50
    (embedding_asset's default) and None (no checkpoints). Raises ValueError."""

    if args.module:
        if not args.asset:
            raise ValueError("-m/--module needs --asset KEY (the asset whose corpus to plan)")
        import dagster as dg


        module = import_code_module(args.module, args.workspace)
        defs = getattr(module, "defs", None)
        if not isinstance(defs, dg.Definitions):
            raise ValueError(f"module {args.module!r} has no Definitions named 'defs'")
        key = dg.AssetKey.from_user_string(args.asset)
        if key not in {a.key for a in defs.resolve_all_asset_specs()}:
            raise ValueError(f"module {args.module!r} defines no asset {args.asset!r}")
        asset = defs.get_assets_def(key)
        corpus = corpus_of(asset, module)
        if args.corpus and args.corpus.rstrip("/") != corpus.url.rstrip("/"):
            raise ValueError(f"CORPUS {args.corpus!r} is not asset {args.asset}'s corpus {corpus.url!r}")

        return corpus, max_partitions_per_run(asset), checkpoint_records(dict(asset.op.tags or {}))
    if not args.corpus:
        raise ValueError("CORPUS is required (or -m MODULE --asset KEY to plan the asset's own corpus)")
    return CorpusSource(url=args.corpus, pattern=args.pattern, recursive=args.recursive), DEFAULT_PARTITIONS_PER_RUN, None


def live_snapshot(executor_config: dict) -> Snapshot:
    """Ask each backend configured in ``executor_config`` for its state, as ``backend: auto`` does."""

    handler = GpuStepHandler(executor_config, Path(tempfile.gettempdir()) / "dagster-gpu-whatif")
    return gather_snapshot(handler, handler.candidates)


def instance_runtime_model(instance, asset_key: str | None) -> RuntimeModel:
    """The asset's runtime model from ``instance`` (a DagsterInstance, ``$DAGSTER_HOME``'s); the no-history
    fallback when there is no asset or no instance."""
    if not asset_key or instance is None:
        return RuntimeModel.from_history([])

    return runtime_model(instance, asset_key)


def learned_snapshot(instance, snapshot: Snapshot) -> Snapshot:
    """``snapshot`` with each pool's preemption rate learned from ``instance`` (a DagsterInstance,
    ``$DAGSTER_HOME``'s; :func:`dagster_gpu.instance.preemption.with_learned_rates`); as it is without one."""
    if instance is None:
        return snapshot

    return with_learned_rates(instance, snapshot)


def open_instance(prog: str = "whatif"):
    """``(ok, instance)``: ``$DAGSTER_HOME``'s DagsterInstance, ``(True, None)`` when the variable is not set
    (whatif then plans on the fallback and the configured preemption priors), ``(False, None)`` after one line
    on stderr when it is set but unusable (:func:`dagster_gpu.commands.common.instance_or_none`)."""
    if not os.environ.get("DAGSTER_HOME"):
        return True, None

    instance = instance_or_none(prog)
    return instance is not None, instance


def preemption_summary(snapshot: Snapshot) -> dict[str, dict]:
    """backend -> its preemption pool, rate per GPU-hour, whether learned, and how it was set: the
    configured backends whose rate is above 0."""
    out = {}
    for b in BACKENDS:
        st = snapshot.backend(b)
        if st is not None and st.preemptions_per_gpu_hour > 0:
            out[b] = {"pool": st.preemption_pool, "preemptions_per_gpu_hour": st.preemptions_per_gpu_hour,
                      "learned": st.preemption_learned, "source": st.preemption_source or "as in the snapshot"}
    return out


def runtime_source(model: RuntimeModel, plans: dict[str, list[PlanRow]]) -> str:
    """``model``'s source in words for the devices ``plans`` place partitions on (a CPU-only host's plan names
    the CPU figure only; nothing placed: both devices)."""
    devices = {r.placement.chosen.device for rows in plans.values() for r in rows
               if r.placement is not None and r.placement.chosen is not None}
    return model.describe(gpu=any(d != "cpu" for d in devices), cpu="cpu" in devices)


def whatif_main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code (0 ok, 2 bad input: the reason on stderr after ``whatif:``)."""
    args = _parser().parse_args(argv)
    ok, instance = open_instance()
    if not ok:
        return 2
    try:
        tags = dict(t.split("=", 1) for t in args.tag)
        request = GpuRequest.from_tags(tags)
        rc = RateCard.load(args.rate_card) if args.rate_card else None
        if args.snapshot and args.save_snapshot:
            raise ValueError("--save-snapshot saves live state; it cannot be combined with --snapshot")
        if args.snapshot:
            try:
                snapshot = Snapshot.loads(Path(args.snapshot).read_text(), rate_card=rc)
            except FileNotFoundError as e:
                raise FileNotFoundError(
                    f"snapshot {args.snapshot!r} not found: leave --snapshot out to plan on live state, save one with "
                    f"--save-snapshot FILE, or start from resources/whatif-snapshot.json"
                ) from e
        else:
            config = _executor_config(args.executor_config, args.rate_card)
            if config.get("clusters"):  # a fleet of named clusters: planned and totalled per cluster
                if args.save_snapshot:
                    raise ValueError("--save-snapshot saves one state per backend; a fleet (clusters:) is planned live")
                return _fleet_main(args, config, request, instance)
            snapshot = live_snapshot(config)
            if args.save_snapshot:
                Path(args.save_snapshot).write_text(json.dumps(snapshot.to_json(), indent=1) + "\n")
                print(f"whatif: live snapshot saved to {args.save_snapshot}", file=sys.stderr)
        if args.history:
            model = RuntimeModel.from_history([HistoryPoint(**h) for h in json.loads(Path(args.history).read_text())])
        else:
            model = instance_runtime_model(instance, args.asset)
        if args.trickle_every is not None:
            rows = trickle_rows(args, model, rc, instance)
            if args.json:
                print(json.dumps({"trickle": rows}, indent=1))
            else:
                _print_trickle(rows, args)
            return 0
        corpus, per_run, checkpoints = corpus_for(args)
        partitions = list_partitions(corpus)
        per_run = args.per_run or per_run
        if args.checkpoint_records is not None:
            checkpoints = args.checkpoint_records if args.checkpoint_records > 0 else None
        model = replace(model, checkpoint_records=checkpoints)
        snapshot = learned_snapshot(instance, snapshot)
        plans = {m: plan(partitions, request, snapshot, model, m, per_run) for m in MODES}
    except (ValueError, OSError, KeyError, TypeError, ImportError) as e:
        print(f"whatif: {e}", file=sys.stderr)
        return 2
    if args.json:
        sums = {m: totals(rows) for m, rows in plans.items()}
        print(json.dumps({
            "runtime_model": runtime_source(model, plans),
            "partitions_per_run": per_run,
            "checkpoint_records": model.checkpoint_records,
            "preemption": preemption_summary(snapshot),
            "plans": {m: [{"partition": r.partition, "bytes": r.size_bytes, "error": r.error, "unit": r.unit,
                           "cost_usd": r.cost_usd, "preemption_cost_usd": r.preemption_cost_usd,
                           "placement": r.placement.to_json() if r.placement else None}
                          for r in rows]
                      for m, rows in plans.items()},
            "totals_usd": {m: None if t.infeasible else t.cost_usd for m, t in sums.items()},
            "preemption_usd": {m: None if t.infeasible else t.preemption_cost_usd for m, t in sums.items()},
            "infeasible": {m: t.infeasible for m, t in sums.items()},
        }, indent=1))
        return 0
    _print_tables(plans, model, args.max_rows, {b for b in BACKENDS if snapshot.backend(b) is not None},
                  preemption_summary(snapshot), snapshot.kubernetes.queue if snapshot.kubernetes else None)
    return 0


def _fleet_main(args: argparse.Namespace, config: dict, request: GpuRequest, instance) -> int:
    """The plan over a fleet (:func:`dagster_gpu.fleet.whatif.plan_fleet`): ``auto`` and each cluster alone, one
    unit per partition, totals per cluster; an unreachable cluster is planned around, with its reason."""

    handler = GpuStepHandler(config, Path(tempfile.gettempdir()) / "dagster-gpu-whatif")
    fleet = with_learned_fleet_rates(instance, gather_fleet(handler, handler.candidates))
    if args.history:
        model = RuntimeModel.from_history([HistoryPoint(**h) for h in json.loads(Path(args.history).read_text())])
    else:
        model = instance_runtime_model(instance, args.asset)
    corpus, _per_run, checkpoints = corpus_for(args)
    model = replace(model, checkpoint_records=checkpoints)
    partitions = list_partitions(corpus)
    modes = ["auto", *(c.name for c in fleet.clusters)]
    plans = {m: plan_fleet(partitions, request, fleet, model, m) for m in modes}
    sums = {m: {t.cluster: {"partitions": t.partitions, "cost_usd": t.cost_usd, "last_finish_s": t.last_finish_s}
                for t in totals_by_cluster(rows)} for m, rows in plans.items()}
    unreachable = {c.name: c.state.reason for c in fleet.clusters if not c.state.reachable}
    if args.json:
        print(json.dumps({
            "fleet": [{"cluster": c.name, "kind": c.kind, "reachable": c.state.reachable} for c in fleet.clusters],
            "unreachable": unreachable,
            "plans": {m: [{"partition": r.partition, "bytes": r.size_bytes, "error": r.error, "cost_usd": r.cost_usd,
                           "cluster": r.placement.cluster if r.placement else None,
                           "placement": r.placement.to_json() if r.placement else None} for r in rows]
                      for m, rows in plans.items()},
            "totals_by_cluster": sums,
            "infeasible": {m: sum(1 for r in rows if r.placement is None) for m, rows in plans.items()},
        }, indent=1))
        return 0
    from rich.table import Table


    con = console()
    for name, why in unreachable.items():
        con.print(f"cluster {name} skipped: {why}", soft_wrap=True, markup=False)
    t = Table(title=f"Fleet plan over {len(partitions)} partitions (one unit each), totals per cluster")
    for col in ("mode", "cluster", "partitions", "cost USD", "last finish s", "infeasible"):
        t.add_column(col)
    for m, rows in plans.items():
        bad = sum(1 for r in rows if r.placement is None)
        for c, tot in sums[m].items() or {"-": {"partitions": 0, "cost_usd": 0.0, "last_finish_s": 0.0}}.items():
            t.add_row("auto (policy)" if m == "auto" else f"all-{m}", c, str(tot["partitions"]),
                      f"{tot['cost_usd']:.6f}", f"{tot['last_finish_s']:.0f}", str(bad))
    con.print(t)
    return 0


def _print_tables(plans: dict[str, list[PlanRow]], model: RuntimeModel, max_rows: int, configured: set[str],
                  preemption: dict[str, dict] | None = None, queue=None) -> None:
    from rich.table import Table


    con = console()
    auto = plans["auto"]
    units = len({r.unit for r in auto})
    t = Table(title=f"Plan (policy 'auto'): {len(auto)} partitions in {units} work unit(s); runtime from "
                    f"{runtime_source(model, plans)}; "
                    "start, runtime and deadline are the unit's, cost the partition's share (by bytes)")
    numeric = ("MB", "unit", "start s", "runtime s", "cost USD", "preempt USD")
    for col in ("partition", "MB", "unit", "backend", "device", "start s", "runtime s", "cost USD", "preempt USD",
                "deadline"):
        t.add_column(col, justify="right" if col in numeric else "left")
    for r in auto[:max_rows]:
        a = r.placement.chosen if r.placement else None
        if a is None:
            t.add_row(r.partition, f"{r.size_bytes / 1e6:.1f}", str(r.unit), "-", "-", "-", "-", "-", "-", r.error[:60])
            continue
        t.add_row(
            r.partition, f"{r.size_bytes / 1e6:.1f}", str(r.unit), a.backend, a.device or "", f"{a.start_delay_s:.0f}",
            f"{a.runtime_s:.0f}", f"{r.cost_usd:.6f}", f"{r.preemption_cost_usd:.6f}",
            "met" if r.placement.deadline_met else "MISS",
        )
    if len(auto) > max_rows:
        t.add_row(f"... {len(auto) - max_rows} more", "", "", "", "", "", "", "", "", "")
    con.print(t)
    for b, pre in (preemption or {}).items():
        con.print(f"preemption on {b} ({pre['pool'] or 'unnamed pool'}): {pre['preemptions_per_gpu_hour']:.3g} per "
                  f"GPU-h ({pre['source']})", soft_wrap=True, markup=False)
    for line in queue_lines(queue, [r.placement.chosen for r in auto if r.placement]):  # the Kueue queue and its state
        con.print(line, soft_wrap=True, markup=False)
    s = Table(title=f"Totals over {len(auto)} partitions (cost includes the expected preemption rework)")
    for col in ("mode", "cost USD", "preempt USD", "vs auto", "infeasible", "deadline misses", "last finish s",
                "backends"):
        s.add_column(col)
    base = totals(auto)
    for m, rows in plans.items():
        tot = totals(rows)
        bad = tot.infeasible
        # a mode that cannot place a partition has no total: a sum over the others would read as cheap
        s.add_row(
            "all-" + m if m != "auto" else "auto (policy)", "-" if bad else f"{tot.cost_usd:.6f}",
            "-" if bad else f"{tot.preemption_cost_usd:.6f}",
            f"{tot.cost_usd / base.cost_usd:.2f}x" if base.cost_usd > 0 and not bad and not base.infeasible else "-",
            str(bad), str(tot.deadline_misses), f"{tot.last_finish_s:.0f}" if not bad else "-",
            ", ".join(f"{k}={v}" for k, v in sorted(tot.backends.items()))
            or ("not configured" if m != "auto" and m not in configured else tot.first_error),
        )
    con.print(s)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(whatif_main())
