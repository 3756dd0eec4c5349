"""The embedding asset factory: one dynamic partition per corpus file, one parquet file per partition."""

import contextlib
import dataclasses
import posixpath
import warnings
from typing import Any, Mapping, Sequence

import dagster as dg

from dagster_gpu.instance.checks import check_specs
from dagster_gpu.corpus.listing import CorpusSource
from dagster_gpu.embedding.fingerprint import config_fields, config_fingerprint, output_columns
from dagster_gpu.core.request import (
    TAG_ASSET_KEY, TAG_CHECKPOINT_RECORDS, TAG_CORPUS_URL, TAG_GROUP_BUCKETS, TAG_PARTITIONS_DEF, TAG_SHARD_BYTES,
    GpuRequest,
)
from dagster_gpu.worker.unit import UnitSpec, run_unit

#: Definition metadata of an embedding asset: its embedding options (JSON, ``config_fields``), what its
#: code version hashes; ``dagster-gpu stale`` compares each materialization's ``embedding/config`` with it.
CONFIG_METADATA_KEY = "dagster_gpu/config"


def output_uri_for(output_url: str, asset_name: str, partition_key: str) -> str:
    """``<output_url>/<asset_name>/<output name>``: :func:`dagster_gpu.core.partition_keys.output_name_for` (``<key>.parquet``
    for a lower-case key; unique under case folding, no doubled extension). Outputs written under the
    earlier ``<key>.parquet`` name are found by :func:`dagster_gpu.embedding.outputs.locate_output`."""
    from dagster_gpu.core.partition_keys import output_name_for

    return posixpath.join(output_url.rstrip("/"), asset_name, output_name_for(partition_key))


#: A backfill's (and the sensor's and schedule's) runs embed at most this many partitions each, by default.
DEFAULT_PARTITIONS_PER_RUN = 50



@contextlib.contextmanager
def beta_parameters_of_ours():
    """Silence Dagster's BetaWarning while this library builds an asset with a parameter Dagster 1.13 marks beta
    (``backfill_policy``): the choice is ours, not the code location author's, and the warning was printed on
    every import (each command twice, the daemon's log once per evaluation)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        yield

def embedding_asset(
    *,
    corpus: CorpusSource,
    output_url: str,
    name: str = "embeddings",
    partitions_def: dg.DynamicPartitionsDefinition | None = None,
    model: str = "all-MiniLM-L6-v2",
    batch_size: int = 64,
    max_seq_length: int | None = None,
    device: str = "auto",
    dtype: str | None = None,
    read_batch_rows: int = 4096,
    gpu: GpuRequest = GpuRequest(),
    telemetry_interval_s: float = 0.5,
    output_storage_options: Mapping[str, Any] | None = None,
    group_name: str | None = None,
    key_prefix: Sequence[str] | None = None,
    retry_policy: dg.RetryPolicy | None = None,
    max_partitions_per_run: int = DEFAULT_PARTITIONS_PER_RUN,
    prompt_name: str | None = None,
    prompt: str | None = None,
    chunking: Any = None,
    id_column: str | None = None,
    carry_columns: Sequence[str] | None = None,
    include_text: bool = False,
    normalize: bool = True,
    truncate_dim: int | None = None,
    output_dtype: str = "float32",
    revision: str | None = None,
    cache_folder: str | None = None,
    trust_remote_code: bool = False,
    reuse: bool = True,
    checkpoint_every_batches: int = 1,
) -> dg.AssetsDefinition:
    """Build a partitioned asset that embeds one corpus file per partition.

    Args:
        corpus: where the files are and how to read them; with ``corpus.shard_bytes`` a file above it is several
            partitions, one per shard (each materialization says which file and shard: ``dagster_gpu/shard``…); with
            ``corpus.group_buckets`` each partition is a bucket of many files (``dagster_gpu/group``, ``corpus/files``,
            ``corpus/files_changed``…; rows keep their files' own ids; a bad file fails its bucket, naming the file).
        output_url: directory or ``s3://bucket/prefix`` for the outputs (see :func:`output_uri_for`).
        name: asset name.
        partitions_def: defaults to ``DynamicPartitionsDefinition(name=f"{name}_files")``.
        model: a local sentence-transformers directory or ``all-MiniLM-L6-v2`` (packaged, offline).
        batch_size: texts per forward pass. max_seq_length: tokens (None = the model's own).
        device: ``auto`` (CUDA when present, else CPU), ``cpu``, ``cuda``, ``cuda:1``…
        dtype: ``float16`` or ``bfloat16`` to run the model in reduced precision on CUDA (opt-in; CPU always
            runs float32); recorded as ``embedding/dtype``.
        read_batch_rows: records per I/O batch (bounds worker memory).
        gpu: the GPU request, written to the op tags gpu_executor reads.
        telemetry_interval_s: NVML sampling period in seconds.
        output_storage_options: fsspec options of the output store (e.g. another S3 endpoint than the
            corpus's); outputs are written and their checks read with these, never with
            ``corpus.storage_options``. None = no options.
        max_partitions_per_run: a backfill (and the sensor and schedule) makes runs of at most this many
            partitions (``BackfillPolicy.multi_run``); each run's step is one work unit that loads the model
            once and embeds its partitions back to back (see :mod:`dagster_gpu.worker.unit`).
        prompt_name / prompt: the model's prompt to apply (sentence-transformers' rule: ``prompt`` beats
            ``prompt_name``, else the model's ``default_prompt_name``; an unknown name fails the unit's partitions).
        chunking: ``TokenChunks(max_tokens=…, overlap=…, boundary=…)`` cuts each record into windows of the model's
            tokens, one output row each; None truncates each record at max_seq_length (counted).
        id_column / carry_columns: override ``corpus.text_format``'s (parquet and JSON Lines corpora): the corpus's
            own id as ``doc_id`` (else ``<partition key>/<record_id>``), columns copied into each row unchanged.
        include_text: keep each row's text (its chunk) in a ``text`` column.
        normalize: L2-normalize the vectors (recorded). truncate_dim: keep the first N dimensions (Matryoshka),
            renormalized when ``normalize``. output_dtype: ``float32`` | ``float16`` (the vector column's type).
        revision / cache_folder / trust_remote_code: a Hugging Face model id at a revision, resolved offline from
            ``cache_folder`` (else HF_HOME / HF_HUB_CACHE); remote code only when opted in.
        reuse: re-embedding a partition under the same fingerprint takes the previous output's vectors of the
            records whose text is unchanged (chunked: the record's every chunk), so only new or changed text
            reaches the device (:mod:`dagster_gpu.embedding.reuse`; ``embedding/reused_rows``); the partition's
            measured GPU-seconds follow the shorter wall time. False embeds every record.
        checkpoint_every_batches: a unit commits the rows of every this many read batches as a checkpoint part
            beside the output (``.<output name>.parts/``, :mod:`dagster_gpu.embedding.checkpoint`); a unit stopped
            mid-file (preempted: SIGTERM or SIGUSR1; or killed) is continued after the last committed part by the
            step's rerun, and the output is the file an uninterrupted run writes (``embedding/resumed_rows``).
            At most this many read batches are embedded again after a SIGKILL, none after a graceful stop.
            0 = no checkpoints.

    The asset's ``code_version`` is :func:`dagster_gpu.embedding.fingerprint.config_fingerprint` of the options
    that change a vector and are known without loading the model, and each materialization carries it (tag
    ``dagster/code_version``): after a change of model, prompt, chunking, dimension or dtype Dagster shows the
    partitions embedded before as stale (their code version differs from the definition's).

    Each partition gets its own materialization. A missing or unreadable file, or a missing model, fails
    its partition(s) with ``dagster.Failure`` (no retry) naming the partition and file; the other partitions
    of the range are still embedded and materialized.
    """
    pdef = partitions_def or dg.DynamicPartitionsDefinition(name=f"{name}_files")
    if id_column is not None or carry_columns is not None:
        fmt = corpus.text_format
        corpus = dataclasses.replace(corpus, text_format=dataclasses.replace(
            fmt, id_column=id_column if id_column is not None else fmt.id_column,
            carry_columns=tuple(carry_columns) if carry_columns is not None else fmt.carry_columns))
    from dagster_gpu.embedding.writer import vector_type

    vector_type(output_dtype)  # an unknown dtype fails at definition, naming the choices
    if truncate_dim is not None and int(truncate_dim) < 1:
        raise ValueError(f"embedding_asset {name!r}: truncate_dim must be >= 1, got {truncate_dim}")
    options = dict(
        model=model, revision=revision, prompt_name=prompt_name, prompt=prompt, normalize=normalize,
        truncate_dim=truncate_dim, output_dtype=output_dtype, max_seq_length=max_seq_length,
        chunking=chunking.describe() if chunking is not None else None,
        columns=output_columns(id_column=corpus.text_format.id_column, carry_columns=corpus.text_format.carry_columns,
                               include_text=include_text))
    code_version = config_fingerprint(**options)
    config = config_fields(**options)
    spec = UnitSpec(
        corpus=corpus,
        output_uri_for=lambda key: output_uri_for(output_url, name, key),
        model=model,
        device=device,
        max_seq_length=max_seq_length,
        batch_size=batch_size,
        read_batch_rows=read_batch_rows,
        telemetry_interval_s=telemetry_interval_s,
        dtype=dtype,
        output_storage_options=dict(output_storage_options or {}),
        prompt_name=prompt_name,
        prompt=prompt,
        chunking=chunking,
        include_text=include_text,
        normalize=normalize,
        truncate_dim=truncate_dim,
        output_dtype=output_dtype,
        revision=revision,
        cache_folder=cache_folder,
        trust_remote_code=trust_remote_code,
        code_version=code_version,
        config=config,
        reuse=reuse,
        checkpoint_every_batches=int(checkpoint_every_batches),
    )

    with beta_parameters_of_ours():
        decorate = dg.asset(
            name=name,
            key_prefix=list(key_prefix) if key_prefix else None,
            partitions_def=pdef,
            op_tags={
                **gpu.to_tags(),
                TAG_CORPUS_URL: corpus.url,
                TAG_ASSET_KEY: "/".join([*(key_prefix or []), name]),
                TAG_PARTITIONS_DEF: pdef.name or "",
                TAG_CHECKPOINT_RECORDS: str(max(0, int(checkpoint_every_batches)) * int(read_batch_rows)),
                **({TAG_SHARD_BYTES: str(int(corpus.shard_bytes))} if corpus.shard_bytes is not None else {}),
                **({TAG_GROUP_BUCKETS: str(int(corpus.group_buckets))} if corpus.group_buckets is not None else {}),
            },
            kinds={"pytorch", "parquet"},
            group_name=group_name,
            retry_policy=retry_policy,
            backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run),
            output_required=False,
            description=f"Sentence embeddings ({model}) of each file of corpus {corpus.url}, one parquet file per partition under {output_url}.",
            metadata={"dagster_gpu/corpus_url": corpus.url, "dagster_gpu/output_url": output_url,
                      CONFIG_METADATA_KEY: dg.MetadataValue.json(config),
                      **({"dagster_gpu/shard_bytes": int(corpus.shard_bytes)} if corpus.shard_bytes is not None else {}),
                      **({"dagster_gpu/group_buckets": int(corpus.group_buckets)} if corpus.group_buckets is not None else {})},
            code_version=code_version,
            check_specs=check_specs(dg.AssetKey([*(key_prefix or []), name]), pdef),
        )

    def _embed(context: dg.AssetExecutionContext):
        yield from run_unit(context, spec)

    return decorate(_embed)
