"""``embedding_asset``'s grouped arguments besides the corpus and the :class:`EmbeddingSpec`: where the outputs go
(:class:`OutputSpec`) and how each work unit runs (:class:`ComputeSpec`); and the flat keywords of earlier
releases mapped onto the three groups (:func:`grouped_from_flat`), deprecated.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from dagster_gpu.core.request import GpuRequest
from dagster_gpu.embedding.spec import EmbeddingSpec

#: A backfill's (and the sensor's and schedule's) runs embed at most this many partitions each, by default.
DEFAULT_PARTITIONS_PER_RUN = 50


@dataclass(frozen=True)
class OutputSpec:
    """Where an embedding asset writes: ``<url>/<asset name>/<output name>`` per partition
    (:func:`dagster_gpu.definitions.assets.output_uri_for`); ``url`` a directory or ``s3://bucket/prefix``.
    ``storage_options``: fsspec options of the output store (e.g. another S3 endpoint than the corpus's); outputs
    are written and their checks read with these, never with the corpus's. None = no options.

    Raises ValueError for an empty ``url``."""

    url: str
    storage_options: Mapping[str, Any] | None = None

    def __post_init__(self):
        if not str(self.url or "").strip():
            raise ValueError("OutputSpec.url is empty: give the output directory or s3://bucket/prefix")


@dataclass(frozen=True)
class ComputeSpec:
    """How an embedding asset's work units run.

    Attributes:
        device: ``auto`` (CUDA when present, else CPU), ``cpu``, ``cuda``, ``cuda:1``…
        gpu: the GPU request, written to the op tags gpu_executor reads.
        max_partitions_per_run: a backfill (and the sensor and schedule) makes runs of at most this many
            partitions (``BackfillPolicy.multi_run``); each run's step is one work unit that loads the model once
            and embeds its partitions back to back (:mod:`dagster_gpu.worker.unit`).
        read_batch_rows: records per I/O batch (bounds worker memory).
        telemetry_interval_s: NVML sampling period, seconds.
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
    """

    device: str = "auto"
    gpu: GpuRequest = field(default_factory=GpuRequest)
    max_partitions_per_run: int = DEFAULT_PARTITIONS_PER_RUN
    read_batch_rows: int = 4096
    telemetry_interval_s: float = 0.5
    reuse: bool = True
    checkpoint_every_batches: int = 1


#: The flat keywords of earlier releases: keyword -> (group argument, field of its class).
FLAT_KEYWORDS: dict[str, tuple[str, str]] = {
    **{f.name: ("spec", f.name) for f in dataclasses.fields(EmbeddingSpec)},
    "output_url": ("output", "url"),
    "output_storage_options": ("output", "storage_options"),
    **{f.name: ("compute", f.name) for f in dataclasses.fields(ComputeSpec)},
}
_GROUP_CLASS = {"spec": EmbeddingSpec, "output": OutputSpec, "compute": ComputeSpec}


def grouped_from_flat(flat: Mapping[str, Any], given: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The groups ``{"spec": EmbeddingSpec, "output": OutputSpec, "compute": ComputeSpec}`` that the flat keywords
    ``flat`` build (a group none of them names is absent), and the deprecation message naming the grouped form.

    ``given``: the groups passed in the grouped form (None when not passed). Raises TypeError naming a keyword that
    is not a flat keyword of ``embedding_asset``, or one whose group was also passed grouped."""
    unknown = sorted(k for k in flat if k not in FLAT_KEYWORDS)
    if unknown:
        raise TypeError(f"embedding_asset() got unexpected keyword argument(s) {unknown}")
    fields: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        group, name = FLAT_KEYWORDS[key]
        if given.get(group) is not None:
            raise TypeError(f"embedding_asset(): {key}= and {group}= both given; pass {name} in "
                            f"{group}={_GROUP_CLASS[group].__name__}(…) only")
        fields.setdefault(group, {})[name] = value
    groups = {g: _GROUP_CLASS[g](**kw) for g, kw in fields.items()}
    old = ", ".join(f"{k}=…" for k in flat)
    new = ", ".join(f"{g}={_GROUP_CLASS[g].__name__}({', '.join(f'{n}=…' for n in kw)})" for g, kw in fields.items())
    return groups, f"embedding_asset({old}) is deprecated: pass {new}"
