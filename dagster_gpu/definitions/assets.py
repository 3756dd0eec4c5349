"""The embedding asset factory: one dynamic partition per corpus file, one parquet file per partition."""

import contextlib
import dataclasses
import posixpath
import warnings
from typing import Any, Sequence

import dagster as dg

from dagster_gpu.core.partition_keys import output_name_for
from dagster_gpu.core.request import (
    TAG_ASSET_KEY,
    TAG_CHECKPOINT_RECORDS,
    TAG_CORPUS_URL,
    TAG_GROUP_BUCKETS,
    TAG_PARTITIONS_DEF,
    TAG_SHARD_BYTES,
)
from dagster_gpu.corpus.listing import CorpusSource
from dagster_gpu.definitions.asset_options import (  # noqa: F401 - DEFAULT_PARTITIONS_PER_RUN: its name here too
    DEFAULT_PARTITIONS_PER_RUN,
    ComputeSpec,
    OutputSpec,
    grouped_from_flat,
)
from dagster_gpu.embedding.fingerprint import config_fields, config_fingerprint, output_columns
from dagster_gpu.embedding.spec import EmbeddingSpec
from dagster_gpu.instance.checks import check_specs
from dagster_gpu.worker.unit import UnitSpec, run_unit

#: Definition metadata of an embedding asset: its embedding options (JSON, ``config_fields``), what its
#: code version hashes; ``dagster-gpu stale`` compares each materialization's ``embedding/config`` with it.
CONFIG_METADATA_KEY = "dagster_gpu/config"


def output_uri_for(output_url: str, asset_name: str, partition_key: str) -> str:
    """``<output_url>/<asset_name>/<output name>``: :func:`dagster_gpu.core.partition_keys.output_name_for` (``<key>.parquet``
    for a lower-case key; unique under case folding, no doubled extension). Outputs written under the
    earlier ``<key>.parquet`` name are found by :func:`dagster_gpu.embedding.outputs.locate_output`."""

    return posixpath.join(output_url.rstrip("/"), asset_name, output_name_for(partition_key))


@contextlib.contextmanager
def beta_parameters_of_ours():
    """Silence Dagster's BetaWarning while this library builds an asset with a parameter Dagster 1.13 marks beta
    (``backfill_policy``): the choice is ours, not the code location author's, and the warning was printed on
    every import (each command twice, the daemon's log once per evaluation)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        yield


def embedding_asset(
    name: str = "embeddings",
    *,
    corpus: CorpusSource,
    output: OutputSpec | str | None = None,
    spec: EmbeddingSpec | None = None,
    compute: ComputeSpec | None = None,
    partitions_def: dg.DynamicPartitionsDefinition | None = None,
    group_name: str | None = None,
    key_prefix: Sequence[str] | None = None,
    retry_policy: dg.RetryPolicy | None = None,
    **flat: Any,
) -> dg.AssetsDefinition:
    """Build a partitioned asset that embeds one corpus file per partition.

    Args:
        name: asset name.
        corpus: where the files are and how to read them; with ``corpus.shard_bytes`` a file above it is several
            partitions, one per shard (each materialization says which file and shard: ``dagster_gpu/shard``…); with
            ``corpus.group_buckets`` each partition is a bucket of many files (``dagster_gpu/group``, ``corpus/files``,
            ``corpus/files_changed``…; rows keep their files' own ids; a bad file fails its bucket, naming the file).
        output: where the outputs go (:class:`OutputSpec`; a string is ``OutputSpec(url=that)``).
        spec: what is embedded and written: model, prompt, chunking, vectors, columns (:class:`EmbeddingSpec`;
            None = its defaults: the packaged ``all-MiniLM-L6-v2``, normalized float32 vectors).
        compute: how each work unit runs: device, GPU request, partitions per run, checkpoints
            (:class:`ComputeSpec`; None = its defaults).
        partitions_def: defaults to ``DynamicPartitionsDefinition(name=f"{name}_files")``.
        group_name / key_prefix / retry_policy: Dagster's, as ``dagster.asset`` takes them.
        **flat: the flat keywords of earlier releases (``model=``, ``output_url=``, ``device=``…,
            each a field of one group: :data:`dagster_gpu.definitions.asset_options.FLAT_KEYWORDS`), deprecated:
            one ``DeprecationWarning`` per call names the grouped form. TypeError for any other keyword, or for a
            flat keyword beside the group it belongs to.

    The asset's ``code_version`` is :func:`dagster_gpu.embedding.fingerprint.config_fingerprint` of the options
    that change a vector and are known without loading the model (:meth:`EmbeddingSpec.fingerprint_options`), and
    each materialization carries it (tag ``dagster/code_version``): after a change of model, prompt, chunking,
    dimension or dtype Dagster shows the partitions embedded before as stale (their code version differs from the
    definition's).

    Each partition gets its own materialization. A missing or unreadable file, or a missing model, fails
    its partition(s) with ``dagster.Failure`` (no retry) naming the partition and file; the other partitions
    of the range are still embedded and materialized.
    """
    if flat:
        try:
            groups, message = grouped_from_flat(flat, {"spec": spec, "output": output, "compute": compute})
        except ValueError as e:  # a field that fails its check: name the asset
            raise ValueError(f"embedding_asset {name!r}: {e}") from e
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        spec, output, compute = groups.get("spec", spec), groups.get("output", output), groups.get("compute", compute)
    if output is None:
        raise TypeError(f"embedding_asset {name!r}: output= is required: OutputSpec(url=…) or the output URL")
    output = OutputSpec(url=output) if isinstance(output, str) else output
    spec, compute = spec or EmbeddingSpec(), compute or ComputeSpec()
    output_url = output.url
    pdef = partitions_def or dg.DynamicPartitionsDefinition(name=f"{name}_files")
    if spec.id_column is not None or spec.carry_columns is not None:
        fmt = corpus.text_format
        try:  # TextFormat and CorpusSource refuse columns on what is read as text (format 'text', a '*.txt' pattern)
            corpus = dataclasses.replace(corpus, text_format=dataclasses.replace(
                fmt, id_column=spec.id_column if spec.id_column is not None else fmt.id_column,
                carry_columns=spec.carry_columns if spec.carry_columns is not None else fmt.carry_columns))
        except ValueError as e:
            raise ValueError(f"embedding_asset {name!r}: EmbeddingSpec(id_column={spec.id_column!r}, "
                             f"carry_columns={spec.carry_columns!r}) on corpus {corpus.url} (pattern "
                             f"{corpus.pattern!r}, TextFormat(format={fmt.format!r})): {e}; or leave id_column / "
                             f"carry_columns out") from None
    options = spec.fingerprint_options()
    options["columns"] = output_columns(id_column=corpus.text_format.id_column,
                                        carry_columns=corpus.text_format.carry_columns, include_text=spec.include_text)
    code_version = config_fingerprint(**options)
    config = config_fields(**options)
    unit = UnitSpec(
        corpus=corpus,
        output_uri_for=lambda key: output_uri_for(output_url, name, key),
        embedding=spec,
        device=compute.device,
        read_batch_rows=compute.read_batch_rows,
        telemetry_interval_s=compute.telemetry_interval_s,
        output_storage_options=dict(output.storage_options or {}),
        code_version=code_version,
        config=config,
        reuse=compute.reuse,
        checkpoint_every_batches=int(compute.checkpoint_every_batches),
    )

    with beta_parameters_of_ours():
        decorate = dg.asset(
            name=name,
            key_prefix=list(key_prefix) if key_prefix else None,
            partitions_def=pdef,
            op_tags={
                **compute.gpu.to_tags(),
                TAG_CORPUS_URL: corpus.url,
                TAG_ASSET_KEY: "/".join([*(key_prefix or []), name]),
                TAG_PARTITIONS_DEF: pdef.name or "",
                TAG_CHECKPOINT_RECORDS: str(max(0, int(compute.checkpoint_every_batches)) * int(compute.read_batch_rows)),
                **({TAG_SHARD_BYTES: str(int(corpus.shard_bytes))} if corpus.shard_bytes is not None else {}),
                **({TAG_GROUP_BUCKETS: str(int(corpus.group_buckets))} if corpus.group_buckets is not None else {}),
            },
            kinds={"pytorch", "parquet"},
            group_name=group_name,
            retry_policy=retry_policy,
            backfill_policy=dg.BackfillPolicy.multi_run(compute.max_partitions_per_run),
            output_required=False,
            description=f"Sentence embeddings ({spec.model}) of each file of corpus {corpus.url}, one parquet file per partition under {output_url}.",
            metadata={"dagster_gpu/corpus_url": corpus.url, "dagster_gpu/output_url": output_url,
                      CONFIG_METADATA_KEY: dg.MetadataValue.json(config),
                      **({"dagster_gpu/shard_bytes": int(corpus.shard_bytes)} if corpus.shard_bytes is not None else {}),
                      **({"dagster_gpu/group_buckets": int(corpus.group_buckets)} if corpus.group_buckets is not None else {})},
            code_version=code_version,
            check_specs=check_specs(dg.AssetKey([*(key_prefix or []), name]), pdef),
        )

    def _embed(context: dg.AssetExecutionContext):
        yield from run_unit(context, unit)

    return decorate(_embed)
