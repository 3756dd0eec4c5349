"""One work unit: the step worker of a (possibly ranged) run embeds every partition of its range.

The unit loads the model once and embeds its partitions back to back. Each partition that succeeds is
materialized on its own, as soon as it ends (``AssetMaterialization(partition=key)`` with its own rows,
seconds, throughput, utilization, GPU-seconds, cost and placement), so a unit killed mid-range leaves its
finished partitions materialized. Each materialization is followed by the asset's five blocking output checks
for that partition (:mod:`dagster_gpu.instance.checks`). A partition whose file is missing or unreadable fails alone: its five
checks are recorded failed at once, with the reason; the unit goes on with the next one and raises ``dagster.Failure``
at the end naming every failed partition and why (Dagster then shows those partitions failed: a failed ranged run's
partitions minus those it materialized).

A retried step (RetryPolicy) or a re-launched worker skips the partitions this run already materialized,
so no partition is materialized twice by one run.

Billing: see :mod:`dagster_gpu.billing.apportion` — start-up is shared by file size, each partition is
billed its own interval on the device, and the shares of a unit add up to its measured wall seconds.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import dagster as dg
import psutil

from dagster_gpu.billing.apportion import partition_wall_seconds, startup_shares
from dagster_gpu.billing.keys import COST_USD
from dagster_gpu.billing.measured import measure
from dagster_gpu.billing.metering import useful_fraction
from dagster_gpu.corpus.group_reads import GroupPrefetcher
from dagster_gpu.corpus.groups import FileChanges, file_changes
from dagster_gpu.corpus.listing import CorpusFile, CorpusNotFound, CorpusSource, CorpusUnreadable
from dagster_gpu.corpus.prefetch import BatchPrefetcher
from dagster_gpu.embedding.devices import device_labels, unit_devices
from dagster_gpu.embedding.fingerprint import fingerprint, pooling_description
from dagster_gpu.embedding.model import LoadedModel, ModelNotFound, load_model
from dagster_gpu.embedding.pipeline import CheckpointPolicy, EmbeddingResult, Preempted, embed_partition, make_encoder
from dagster_gpu.embedding.spec import EmbeddingSpec
from dagster_gpu.embedding.writer import recorded_files
from dagster_gpu.instance.checks import (
    check_evaluations,
    check_outputs,
    materialization_target,
    partition_failed_evaluations,
    partition_failure_observation,
    verify_output,
)
from dagster_gpu.instance.connections import hold_storage_connections
from dagster_gpu.instance.events import PREEMPTED_PARTITION_KEY
from dagster_gpu.instance.run_tags import add_cost
from dagster_gpu.k8s.claim import allocated_device_uuids, claim_metadata
from dagster_gpu.partitions.source_versions import CONFIG_KEY, SOURCE_VERSION_KEY, input_tags, version_at_read
from dagster_gpu.telemetry.nvml import NvmlSampler
from dagster_gpu.worker.backend_env import backend_metadata
from dagster_gpu.worker.context import StepContext
from dagster_gpu.worker.embed_ahead import EmbedAhead
from dagster_gpu.worker.metadata import build_metadata, group_metadata
from dagster_gpu.worker.preemption import EXIT_PREEMPTED, GracefulStop, exit_preempted, process_stop
from dagster_gpu.worker.unit_log import PartitionWatch


@dataclass(frozen=True)
class UnitSpec:
    """What the asset asks of each unit: what to embed and how (``embedding``, built once by ``embedding_asset``),
    where to read and write, and how the unit runs.

    The corpus is read with ``corpus.storage_options`` (its ``TextFormat`` already carries ``embedding``'s id and
    carried columns); outputs are written and checked with ``output_storage_options`` (fsspec options of the output
    store, which may be another store).
    """

    corpus: CorpusSource
    output_uri_for: Callable[[str], str]
    embedding: EmbeddingSpec = EmbeddingSpec()
    #: ``auto`` (CUDA when present, else CPU), ``cpu``, ``cuda``, ``cuda:1``…
    device: str = "auto"
    #: records per I/O batch (bounds worker memory)
    read_batch_rows: int = 4096
    #: NVML sampling period, seconds
    telemetry_interval_s: float = 0.5
    output_storage_options: Mapping[str, Any] = field(default_factory=dict)
    #: the asset's code version (:func:`dagster_gpu.embedding.fingerprint.config_fingerprint`), tagged on each
    #: materialization so Dagster compares it with the definition's; "" = none.
    code_version: str = ""
    #: the options ``code_version`` hashes (:func:`dagster_gpu.embedding.fingerprint.config_fields`), recorded on
    #: each materialization as ``embedding/config`` (JSON) so that ``stale`` names the option that changed
    config: Mapping[str, Any] | None = None
    #: re-embedding a partition under the same fingerprint takes the previous output's vectors of unchanged
    #: texts (:mod:`dagster_gpu.embedding.reuse`); False embeds every record.
    reuse: bool = True
    #: read batches per checkpoint part (:mod:`dagster_gpu.embedding.checkpoint`): a stopped unit's rerun continues
    #: after the last part committed; 0 = no checkpoints (a rerun embeds the partition from its first record).
    checkpoint_every_batches: int = 1


@dataclass
class UnitOutcome:
    """What a unit did: partitions materialized (in order), skipped (already done by this run) and failed
    (key -> reason); ``cost_usd`` the measured cost of the materialized ones; ``checks_failed`` the failed
    partitions whose checks were recorded failed."""

    materialized: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    retryable: bool = False
    cost_usd: float = 0.0
    checks_failed: set[str] = field(default_factory=set)
    #: key -> the source version of the file a failed partition's attempt read (absent: it read none)
    failed_versions: dict[str, str] = field(default_factory=dict)


def already_materialized(instance: dg.DagsterInstance, run_id: str, asset_key: dg.AssetKey) -> set[str]:
    """Partition keys of ``asset_key`` that run ``run_id`` has materialized (by any step attempt)."""
    done: set[str] = set()
    for rec in instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records:
        ev = rec.event_log_entry.dagster_event
        mat = ev.step_materialization_data.materialization if ev is not None else None
        if mat is not None and mat.asset_key == asset_key and mat.partition is not None:
            done.add(mat.partition)
    return done


def _torch_gpu(model_device: str) -> tuple[str | None, int]:
    if not model_device.startswith("cuda"):
        return None, 0
    import torch

    return torch.cuda.get_device_name(0), torch.cuda.device_count()


def run_unit(context: dg.AssetExecutionContext, spec: UnitSpec) -> Iterator[dg.AssetMaterialization | dg.AssetCheckEvaluation | dg.Output]:
    """Embed every partition of the step's range; yield one materialization (and its check evaluations) per
    good partition, then the checks' op outputs.

    Raises ``dagster.Failure`` after the last partition when any failed (no retry when every failure is
    bad input — a missing or unreadable file, a missing model — that a retry cannot fix).
    """
    step = StepContext.from_env()
    # SIGTERM / SIGUSR1: stop after the batch on the device (worker/preemption.py). The step worker's entry point
    # took them before Dagster ran (worker/step_main.py): a signal it recorded before this body is a stop now.
    early = process_stop()
    stop = early or GracefulStop().install()
    try:
        if stop.requested:
            _report_stopped_before_body(context, stop, _unit_keys(context))
            exit_preempted(signum=stop.signum)
        yield from _run_unit(context, spec, step, stop)
    finally:
        if early is None:
            stop.restore()


def _unit_keys(context: dg.AssetExecutionContext) -> list[str]:
    """The partition keys of the step's range (one, several, or none for an unpartitioned asset)."""
    return list(context.partition_keys) if context.has_partition_key_range or context.has_partition_key else []


def _run_unit(context: dg.AssetExecutionContext, spec: UnitSpec, step: StepContext,
              stop: GracefulStop) -> Iterator[dg.AssetMaterialization | dg.AssetCheckEvaluation | dg.Output]:
    body_started = time.time()
    started = psutil.Process().create_time() if step.launched_by_executor else body_started
    keys = _unit_keys(context)
    outcome = UnitOutcome()
    hold_storage_connections(context.instance, len(keys))
    done = already_materialized(context.instance, context.run.run_id, context.asset_key)
    todo = [k for k in keys if k not in done]
    outcome.skipped = [k for k in keys if k in done]
    if outcome.skipped:
        context.log.info(f"{len(outcome.skipped)} partition(s) already materialized by this run, skipped: {_short(outcome.skipped)}")
    files = _resolve(spec.corpus, todo, outcome)
    yield from _failed_checks(context, outcome)
    loaded = _load(spec, [k for k in todo if k in files], outcome)
    yield from _failed_checks(context, outcome)
    if loaded is not None and files:
        ready = time.time()
        shares = startup_shares({k: f.size_bytes for k, f in files.items()})
        context.log.info(
            f"unit of {len(files)} partition(s) on {loaded.device}: start-up {ready - started:.1f} s "
            f"(process start to asset body {body_started - started:.1f} s, files and model {ready - body_started:.1f} s), "
            "shared by file size"
        )
        try:
            yield from _embed_all(context, spec, step, loaded, files, shares, ready - started, ready, outcome, stop)
        except Preempted as p:
            _report_preempted(context, stop, p, outcome, len(keys))
            exit_preempted(signum=stop.signum)
    yield from _failed_checks(context, outcome)
    if outcome.failed:
        lines = [f"{k}: {why}" for k, why in outcome.failed.items()]
        raise dg.Failure(
            description=(
                f"{len(outcome.failed)} of {len(keys)} partition(s) failed "
                f"({len(outcome.materialized)} materialized):\n" + "\n".join(lines)
            ),
            metadata={
                "dagster_gpu/failed_partitions": dg.MetadataValue.json(dict(outcome.failed)),
                "dagster_gpu/materialized_partitions": len(outcome.materialized),
            },
            allow_retries=outcome.retryable,
        )
    # the asset's checks are required outputs of its op: one per check, after every partition's evaluations
    yield from check_outputs(context.asset_key)


def _report_preempted(context: dg.AssetExecutionContext, stop: GracefulStop, p: Preempted, outcome: UnitOutcome,
                      n: int) -> None:
    """One engine event on the step: the unit was asked to stop and stopped without a step outcome (the
    partition it was on neither failed nor materialized; its rerun continues after the committed parts)."""
    _record_stop(context, stop, (
        f"partition {p.partition_key!r} stopped with {p.records} record(s) ({p.rows} row(s)) committed in checkpoint "
        f"parts; {len(outcome.materialized)} of {n} partition(s) materialized by this attempt"),
        "a requeue or retry reruns the step and continues after the parts",
        p.partition_key, int(p.records), int(p.rows), len(outcome.materialized))


def _report_stopped_before_body(context: dg.AssetExecutionContext, stop: GracefulStop, keys: Sequence[str]) -> None:
    """The same event when the stop signal came before the asset body (nothing embedded, nothing committed):
    :data:`PREEMPTED_PARTITION_KEY` names the range's first partition (the one it would have started), and
    ``dagster_gpu/before_body`` is true."""
    _record_stop(context, stop, f"before the asset body started ({_short(list(keys)) or 'no partition'}): nothing embedded",
                 "a requeue or retry reruns the step", keys[0] if keys else "", 0, 0, 0, before_body=True)


def _record_stop(context: dg.AssetExecutionContext, stop: GracefulStop, what: str, then: str, partition_key: str,
                 records: int, rows: int, materialized: int, before_body: bool = False) -> None:
    from dagster._core.events import EngineEventData

    seconds = stop.seconds_since()
    message = (f"dagster-gpu: preempted ({stop.signal_name or 'stop requested'}): {what}; exiting {seconds:.2f} s "
               f"after the signal with status {EXIT_PREEMPTED} and no step outcome, so {then}")
    context.log.warning(message)
    metadata: dict[str, Any] = {
        PREEMPTED_PARTITION_KEY: partition_key, "dagster_gpu/committed_records": records,
        "dagster_gpu/committed_rows": rows, "dagster_gpu/stop_signal": stop.signal_name,
        "dagster_gpu/stop_seconds": float(round(seconds, 3)), "dagster_gpu/materialized_partitions": materialized}
    if before_body:
        metadata["dagster_gpu/before_body"] = True
    try:
        context.instance.report_engine_event(message, context.run, EngineEventData(metadata=metadata),
                                             step_key=context.get_step_execution_context().step.key)
    except Exception as e:  # noqa: BLE001 - the event is a courtesy: the stop must still happen within the grace period
        context.log.warning(f"dagster-gpu: could not record the preemption event: {type(e).__name__}: {e}")


def _short(keys: Sequence[str], n: int = 5) -> str:
    return ", ".join(keys[:n]) + (f" … (+{len(keys) - n})" if len(keys) > n else "")


def _failed_checks(context: dg.AssetExecutionContext, outcome: UnitOutcome) -> Iterator[dg.AssetCheckEvaluation]:
    """A failed evaluation of each check of every partition that failed since the last call (the reason in
    its metadata): its planned check rows would otherwise read "in progress" until the run ends. Each such
    partition also gets an ``AssetObservation`` with the reason (:func:`partition_failure_observation`),
    logged first: the partition's own page shows it (open-source storage records no asset-failure event)."""
    for key, why in outcome.failed.items():
        if key not in outcome.checks_failed:
            outcome.checks_failed.add(key)
            context.log_event(partition_failure_observation(context.asset_key, key, why,
                                                            outcome.failed_versions.get(key)))
            yield from partition_failed_evaluations(
                context.asset_key, key, why, materialization_target(context.instance, context.asset_key, key),
                source_version=outcome.failed_versions.get(key))


def _resolve(corpus: CorpusSource, keys: list[str], outcome: UnitOutcome) -> dict[str, CorpusFile]:
    """Each key's file (one listing for the whole range at most); keys without one fail alone."""
    if not keys:
        return {}
    try:
        found = corpus.files_for_keys(keys, missing_ok=True)
    except (CorpusNotFound, CorpusUnreadable) as e:  # the corpus itself is gone, or its store refuses us
        found = {}
        for k in keys:
            outcome.failed[k] = f"partition {k!r}: {e}"
    for k in keys:
        if k not in found and k not in outcome.failed:
            outcome.failed[k] = f"partition {k!r}: no file in corpus {corpus.url!r} has this key (deleted or renamed?)"
    return found


def _load(spec: UnitSpec, keys: list[str], outcome: UnitOutcome) -> LoadedModel | None:
    if not keys:
        return None
    try:
        return load_model(spec.embedding.model, device=spec.device, **spec.embedding.load_options())
    except ModelNotFound as e:
        for k in keys:
            outcome.failed[k] = f"partition {k!r}: {e}"
        return None


def _embed_all(
    context: dg.AssetExecutionContext,
    spec: UnitSpec,
    step: StepContext,
    loaded: LoadedModel,
    files: dict[str, CorpusFile],
    shares: Mapping[str, float],
    startup_s: float,
    ready: float,
    outcome: UnitOutcome,
    stop: GracefulStop | None = None,
) -> Iterator[dg.AssetMaterialization | dg.AssetCheckEvaluation]:
    n = len(files)
    try:  # the prompt and the chunk window are the unit's: one that cannot be used fails every partition
        prompt_text, prompt_name = spec.embedding.resolve_prompt(loaded.model)
        # every device of the unit ("cuda" = each GPU torch sees), a model replica on each but the first
        devices = unit_devices(loaded.device)
        # tokenizer threads and CUDA stream: once per unit
        encoder = make_encoder(loaded.model, spec.embedding.batch_size, prompt=prompt_text,
                               **spec.embedding.encoder_options(), devices=devices if len(devices) > 1 else None)
    except ValueError as e:
        for k, f in files.items():
            outcome.failed[k] = f"partition {k!r} ({f.uri}): {e}"
        yield from _failed_checks(context, outcome)
        return
    lineage = unit_lineage(loaded, spec, prompt_text, prompt_name, int(encoder.dim))
    used = list(getattr(encoder, "devices", devices))
    devices_md = {"embedding/devices": len(used), "embedding/device_names": ", ".join(device_labels(used))}
    if len(used) > 1:
        context.log.info(f"embedding on {len(used)} devices: {devices_md['embedding/device_names']}")

    order = {k: i for i, k in enumerate(files)}  # each partition's place in the unit, for its log lines

    def embed_one(key: str, source: CorpusFile, reader: BatchPrefetcher):
        partition_lineage = lineage
        if source.group is not None:  # which files the output holds, at which versions: the next run's "changed"
            before = recorded_files(spec.output_uri_for(key), spec.output_storage_options)
            changes[key] = file_changes(before, source.member_versions)
            partition_lineage = {**lineage, "files": source.member_versions}
        # a DRA pod: the claim's devices (the NVIDIA driver sets no CUDA_VISIBLE_DEVICES)
        with PartitionWatch(key, order[key], n, source) as watch, NvmlSampler(
                spec.telemetry_interval_s, device_uuids=allocated_device_uuids if step.backend == "kubernetes" else None) as sampler:
            checkpoint = (CheckpointPolicy(read_versions.get(key, source.version), spec.checkpoint_every_batches)
                          if spec.checkpoint_every_batches > 0 else None)
            result = embed_partition(reader, spec.output_uri_for(key), loaded, encoder=encoder,
                                     output_storage_options=dict(spec.output_storage_options), partition_key=key,
                                     spec=spec.embedding, lineage=partition_lineage,
                                     reuse=spec.reuse, checkpoint=checkpoint,
                                     stop=stop.event if stop is not None else None,
                                     on_batch=watch.on_batch,
                                     doc_id_prefix=source.doc_key)  # a shard's rows carry the whole file's ids
        return result, sampler.summary()

    # the partitions are embedded on a thread; their events are written here while the next one encodes
    read_versions: dict[str, str] = {}  # each file's source version right before its read starts
    changes: dict[str, FileChanges] = {}  # a file group's files changed since its previous output

    def prefetch(source: CorpusFile) -> BatchPrefetcher:
        read_versions[source.key] = version_at_read(spec.corpus, source)
        return _prefetcher(spec, source)

    ahead = EmbedAhead(list(files.items()), embed_one, prefetch, ready).start()
    progress = _Progress(context, n)
    try:
        for done in ahead:
            key = done.key
            if done.error is not None:
                outcome.failed[key] = done.error
                if key in read_versions:  # the sensor requests it again once its file has another version
                    outcome.failed_versions[key] = read_versions[key]
                outcome.retryable = outcome.retryable or done.retryable
                context.log.error(done.error)
                yield from _failed_checks(context, outcome)
                continue
            out_uri = spec.output_uri_for(key)
            md = _metadata(step, loaded, spec, done.source, done.result, done.telemetry,
                           partition_wall_seconds(startup_s, shares[key], done.interval_s), position=(done.index, n),
                           lineage=lineage, devices=devices_md, changes=changes.get(key))
            md[SOURCE_VERSION_KEY] = read = read_versions.get(key, done.source.version)
            outcome.materialized.append(key)
            yield dg.AssetMaterialization(asset_key=context.asset_key, partition=key, metadata=md, tags={
                **version_tags(spec.code_version, lineage["fingerprint"], done.source),
                **input_tags(context.instance, context.assets_def, context.asset_key, key, read)})
            outcome.cost_usd += md[COST_USD]
            # the materialization is stored by now: the evaluations target it (the UI's partition status needs that)
            yield from check_evaluations(context.asset_key, key, verify_output(
                out_uri, expected_dim=done.result.dim, records_read=done.result.records,
                skipped_empty_rows=done.result.skipped_empty_rows + done.result.skipped_undecodable_rows,
                storage_options=spec.output_storage_options),
                materialization_target(context.instance, context.asset_key, key))
            progress.partition_done(done.index)
    finally:
        ahead.close()
        encoder.close()
        if outcome.cost_usd:  # the Runs page shows what the run cost: one tag update per unit
            add_cost(context.instance, context.run.run_id, outcome.cost_usd)


def shard_metadata(source: CorpusFile) -> dict[str, Any]:
    """A shard partition's materialization metadata (empty for a whole file): ``dagster_gpu/shard`` ("2 of 4",
    1-based), ``dagster_gpu/shard_file`` (the whole file's partition key), ``dagster_gpu/shard_range`` ("row groups
    3–5" or "bytes 0–1048576", end exclusive), ``dagster_gpu/shard_first_record`` and ``dagster_gpu/shard_records``
    (the file's record ids ``first … first + records − 1``), ``corpus/file_bytes`` (the whole file's size)."""
    s = source.shard
    if s is None:
        return {}
    what = "row groups" if s.unit == "row_groups" else "bytes"
    return {"dagster_gpu/shard": f"{s.index + 1} of {s.count}", "dagster_gpu/shard_file": source.file_key,
            "dagster_gpu/shard_range": f"{what} {s.start}–{s.end}", "dagster_gpu/shard_first_record": int(s.first_record),
            "dagster_gpu/shard_records": int(s.records or 0), "corpus/file_bytes": int(source.file_bytes)}


class _Progress:
    """One run-log line per tenth of the unit (not per partition: each line is an event-log write; every
    partition has its own materialization event)."""

    def __init__(self, context: dg.AssetExecutionContext, n: int):
        self.context, self.n, self.every = context, n, max(1, n // 10)
        self.t0 = time.time()

    def partition_done(self, index: int) -> None:
        done = index + 1
        if done % self.every == 0 and done < self.n:
            rate = done / max(time.time() - self.t0, 1e-9)
            self.context.log.info(f"{done}/{self.n} partitions embedded ({rate:.2f} partitions/s)")


def _prefetcher(spec: UnitSpec, source: CorpusFile) -> BatchPrefetcher:
    """A started reader of ``source`` (a bounded queue of record batches, see ``corpus.prefetch``; a file group's
    files one after another, see ``corpus.group_reads``)."""
    if source.group is not None:
        return GroupPrefetcher(source, spec.corpus.text_format, spec.read_batch_rows,
                               dict(spec.corpus.storage_options)).start()
    return BatchPrefetcher(source.uri, spec.corpus.text_format, spec.read_batch_rows,
                           dict(spec.corpus.storage_options), shard=source.shard).start()


def unit_lineage(loaded: LoadedModel, spec: UnitSpec, prompt_text: str, prompt_name: str | None, dim: int) -> dict:
    """Everything that changes a vector, and its fingerprint (:func:`dagster_gpu.embedding.fingerprint.fingerprint`):
    written into each output's key-value metadata and onto each materialization."""
    e = spec.embedding
    revision = str(getattr(loaded, "revision", "") or "")
    fields = dict(model_revision=revision, model=e.model, prompt=prompt_text, normalize=e.normalize,
                  truncate_dim=e.truncate_dim, output_dtype=e.output_dtype,
                  max_seq_length=int(loaded.max_seq_length), chunking=e.chunking_description())
    pooling = pooling_description(loaded.model)
    return {"fingerprint": fingerprint(pooling=pooling, **fields), **fields, "pooling": pooling,
            "prompt_name": prompt_name, "dim": dim, "weights_dtype": loaded.dtype,
            "code_version": spec.code_version or None}


#: Dagster's tags of a materialization's code and data version (dagster._core.definitions.data_version
#: CODE_VERSION_TAG / DATA_VERSION_TAG): Dagster adds them only to materializations it derives from an Output, so a
#: body that yields its own AssetMaterialization sets them, or staleness has nothing to compare.
CODE_VERSION_TAG = "dagster/code_version"
DATA_VERSION_TAG = "dagster/data_version"


def version_tags(code_version: str, fingerprint: str, source: CorpusFile) -> dict[str, str]:
    """The materialization's tags: the asset's code version, and as data version the first 16 hex digits of
    sha256 over the fingerprint and the corpus file's version (key, size, mtime; a file group's source version
    too: one file of it may change with the sum of sizes and the latest mtime unchanged): a changed file or
    another configuration gives another data version."""
    version = f"{fingerprint}\0{source.key}\0{source.size_bytes}\0{source.mtime!r}"
    if source.group is not None:
        version += f"\0{source.version}"
    tags = {DATA_VERSION_TAG: hashlib.sha256(version.encode()).hexdigest()[:16]}
    if code_version:
        tags[CODE_VERSION_TAG] = code_version
    return tags


def _metadata(step, loaded, spec, source, result: EmbeddingResult, telemetry, wall_s: float, position,
              lineage: Mapping[str, Any] | None = None, devices: Mapping[str, Any] | None = None,
              changes: FileChanges | None = None) -> dict:
    product, count = telemetry.product_name, len(telemetry.device_uuids)
    if product is None:
        product, count = _torch_gpu(loaded.device)
    billing = measure(step.rates, wall_s, loaded.device, product, count, step.device_fraction)
    claim = claim_metadata() if step.backend == "kubernetes" else {}
    unit = {
        "dagster_gpu/unit_partitions": int(position[1]),
        "dagster_gpu/unit_position": int(position[0]),
        "embedding/useful_fraction": useful_fraction([(result.seconds, wall_s)]) or 0.0,
        **({CONFIG_KEY: dg.MetadataValue.json(dict(spec.config))} if spec.config else {}),
        **(devices or {}),  # embedding/devices (count), embedding/device_names
    }
    return build_metadata(
        result=result,
        model_name=spec.embedding.model,
        model_device=loaded.device,
        telemetry=telemetry,
        billing=billing,
        backend=step.backend,
        placement=step.placement,
        backend_metadata={**backend_metadata(step.backend), **claim, **unit, "corpus/file": source.uri,
                          "corpus/bytes": int(source.size_bytes),  # the cost policy's partition size
                          **shard_metadata(source), **group_metadata(source, changes)},
        lineage=lineage,
    )
