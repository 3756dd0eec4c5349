"""A step's GPU request, read from the asset's op tags (pure, no I/O).

Tags (all optional; values are strings because Dagster tags are strings):

==================================  =========================================================
``dagster-gpu/gpu-count``           whole devices wanted (int >= 0, default 1)
``dagster-gpu/gpu-memory-gib``      minimum device memory in GiB (float, default none)
``dagster-gpu/gpu-product``         product name prefix, e.g. ``NVIDIA A100`` (default any)
``dagster-gpu/mig-ok``              ``true`` if a MIG slice is acceptable (default false)
``dagster-gpu/shared-ok``           ``true`` if a shared GPU (Slurm shard, DRA time-slicing) is acceptable
``dagster-gpu/deadline-seconds``    service class: finish within this many seconds of launch;
                                    absent means ``batch`` (no deadline)
``dagster-gpu/backend``             force a backend: ``local``, ``slurm`` or ``kubernetes``
==================================  =========================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

TAG_PREFIX = "dagster-gpu/"
TAG_GPU_COUNT = TAG_PREFIX + "gpu-count"
TAG_GPU_MEMORY_GIB = TAG_PREFIX + "gpu-memory-gib"
TAG_GPU_PRODUCT = TAG_PREFIX + "gpu-product"
TAG_MIG_OK = TAG_PREFIX + "mig-ok"
TAG_SHARED_OK = TAG_PREFIX + "shared-ok"
TAG_DEADLINE_SECONDS = TAG_PREFIX + "deadline-seconds"
TAG_BACKEND = TAG_PREFIX + "backend"

#: Set by ``embedding_asset`` so ``backend: auto`` can size the step and read the asset's history.
TAG_CORPUS_URL = TAG_PREFIX + "corpus-url"
TAG_ASSET_KEY = TAG_PREFIX + "asset-key"
#: the corpus's ``CorpusSource.shard_bytes`` when set: the corpus URL alone would list a cut file whole
TAG_SHARD_BYTES = TAG_PREFIX + "shard-bytes"
#: the corpus's ``CorpusSource.group_buckets`` when set: the corpus URL alone would list each file, not its bucket
TAG_GROUP_BUCKETS = TAG_PREFIX + "group-buckets"
#: the asset's DynamicPartitionsDefinition name: resolves a ranged run's partition keys
TAG_PARTITIONS_DEF = TAG_PREFIX + "partitions-def"
#: records a unit embeds between two committed checkpoint parts (``checkpoint_every_batches × read_batch_rows``;
#: "0": no checkpoints): what a preemption loses, in the policy's estimate
TAG_CHECKPOINT_RECORDS = TAG_PREFIX + "checkpoint-records"

BACKENDS = ("local", "slurm", "kubernetes")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class GpuRequestError(ValueError):
    """A GPU request tag has a value that cannot be used; the message names the tag."""


def _parse_bool(tag: str, value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise GpuRequestError(f"tag {tag!r}: expected true/false, got {value!r}")


def _parse_number(tag: str, value: str, kind: type, minimum: float) -> float | int:
    try:
        n = kind(value.strip())
    except ValueError:
        raise GpuRequestError(f"tag {tag!r}: expected {kind.__name__}, got {value!r}") from None
    if not math.isfinite(n) or n < minimum:
        raise GpuRequestError(f"tag {tag!r}: must be a finite number >= {minimum}, got {value!r}")
    return n


def _number_tag(v: float) -> str:
    """``40`` for 40.0, but never lossy: ``:g`` keeps only 6 significant digits (1209601 -> 1.2096e+06)."""
    short = f"{v:g}"
    return short if float(short) == v else repr(float(v))


@dataclass(frozen=True)
class GpuRequest:
    """What one step needs from a GPU backend.

    Attributes:
        count: whole devices (int >= 0). ``0`` means the step runs on CPU wherever it lands.
        memory_gib: minimum memory per device in GiB, or None for any.
        product: product name prefix (``NVIDIA A100``), or None for any.
        mig_ok: a MIG slice that satisfies ``memory_gib`` is acceptable.
        shared_ok: a shared GPU (Slurm ``shard`` GRES, DRA TimeSlicing/MPS) is acceptable.
        deadline_s: seconds from launch by which the step should finish; None = ``batch``.
        backend: a forced backend name, or None to let the executor/policy decide.
    """

    count: int = 1
    memory_gib: float | None = None
    product: str | None = None
    mig_ok: bool = False
    shared_ok: bool = False
    deadline_s: float | None = None
    backend: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def service_class(self) -> str:
        """``batch`` or ``deadline:<seconds>``."""
        return "batch" if self.deadline_s is None else f"deadline:{self.deadline_s:g}"

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> "GpuRequest":
        """Build a request from op/run tags. Raises GpuRequestError naming the bad tag."""
        kw: dict = {}
        if TAG_GPU_COUNT in tags:
            kw["count"] = int(_parse_number(TAG_GPU_COUNT, tags[TAG_GPU_COUNT], int, 0))
        if TAG_GPU_MEMORY_GIB in tags:
            kw["memory_gib"] = float(_parse_number(TAG_GPU_MEMORY_GIB, tags[TAG_GPU_MEMORY_GIB], float, 0))
        if tags.get(TAG_GPU_PRODUCT, "").strip():
            kw["product"] = tags[TAG_GPU_PRODUCT].strip()
        if TAG_MIG_OK in tags:
            kw["mig_ok"] = _parse_bool(TAG_MIG_OK, tags[TAG_MIG_OK])
        if TAG_SHARED_OK in tags:
            kw["shared_ok"] = _parse_bool(TAG_SHARED_OK, tags[TAG_SHARED_OK])
        if tags.get(TAG_DEADLINE_SECONDS, "").strip():
            kw["deadline_s"] = float(_parse_number(TAG_DEADLINE_SECONDS, tags[TAG_DEADLINE_SECONDS], float, 0))
        if tags.get(TAG_BACKEND, "").strip():
            b = tags[TAG_BACKEND].strip()
            if b not in BACKENDS:
                raise GpuRequestError(f"tag {TAG_BACKEND!r}: expected one of {BACKENDS}, got {b!r}")
            kw["backend"] = b
        return cls(**kw)

    def to_tags(self) -> dict[str, str]:
        """The inverse of :meth:`from_tags` (only non-default fields)."""
        t = {TAG_GPU_COUNT: str(self.count)}
        if self.memory_gib is not None:
            t[TAG_GPU_MEMORY_GIB] = _number_tag(self.memory_gib)
        if self.product:
            t[TAG_GPU_PRODUCT] = self.product
        if self.mig_ok:
            t[TAG_MIG_OK] = "true"
        if self.shared_ok:
            t[TAG_SHARED_OK] = "true"
        if self.deadline_s is not None:
            t[TAG_DEADLINE_SECONDS] = _number_tag(self.deadline_s)
        if self.backend:
            t[TAG_BACKEND] = self.backend
        return t

    def to_json(self) -> dict:
        return {
            "count": self.count,
            "memory_gib": self.memory_gib,
            "product": self.product,
            "mig_ok": self.mig_ok,
            "shared_ok": self.shared_ok,
            "service_class": self.service_class,
        }
