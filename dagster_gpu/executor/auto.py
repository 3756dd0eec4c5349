"""``backend: auto`` across several configured backends: gather live state, ask the cost policy.

Each backend reports its live state as a :class:`~dagster_gpu.policy.snapshot.BackendState`
(``Backend.policy_state()``); a backend that cannot be asked is recorded as unreachable with the error,
and the policy skips it. The step's size comes from the corpus files of its partitions (op tag ``dagster-gpu/corpus-url``,
set by ``embedding_asset``), the expected throughput from the asset's earlier materializations, each preemption
pool's rate from the preemptions the instance observed there (:mod:`dagster_gpu.instance.preemption`) and what
a preemption loses from the asset's checkpoint interval (op tag ``dagster-gpu/checkpoint-records``).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Mapping, Sequence

from dagster_gpu.core.request import (
    TAG_ASSET_KEY,
    TAG_CHECKPOINT_RECORDS,
    TAG_CORPUS_URL,
    TAG_GROUP_BUCKETS,
    TAG_SHARD_BYTES,
    GpuRequest,
)
from dagster_gpu.corpus.listing import CorpusSource
from dagster_gpu.instance.history import runtime_model
from dagster_gpu.instance.preemption import with_learned_rates
from dagster_gpu.policy import RuntimeModel, StepSize, choose_placement
from dagster_gpu.policy.placement import Placement
from dagster_gpu.policy.snapshot import KubernetesState, LocalState, SlurmState, Snapshot

STATE_TYPES = {"local": LocalState, "slurm": SlurmState, "kubernetes": KubernetesState}


def step_size(tags: dict, partition_keys: Sequence[str]) -> StepSize:
    """The step's size: one partition's corpus file bytes, or a ranged step's per-partition bytes
    (``StepSize.for_range``: the policy then counts each partition's overhead once the unit has started); a shard's
    bytes for a shard partition (the op tag ``dagster-gpu/shard-bytes`` says the corpus is cut), a bucket's files' bytes
    for a file group (op tag ``dagster-gpu/group-buckets``). One listing of the corpus at most (``CorpusSource.files_for_keys``); StepSize() when the corpus is
    unknown (the policy's fallback applies), None for a partition without a file."""
    url = tags.get(TAG_CORPUS_URL)
    if not url or not partition_keys:
        return StepSize()
    try:
        shard_bytes = int(tags[TAG_SHARD_BYTES]) if tags.get(TAG_SHARD_BYTES) else None
        group_buckets = int(tags[TAG_GROUP_BUCKETS]) if tags.get(TAG_GROUP_BUCKETS) else None
        files = CorpusSource(url=url, shard_bytes=shard_bytes, group_buckets=group_buckets).files_for_keys(
            partition_keys, missing_ok=True)
    except Exception:  # the step itself reports a missing corpus or file with a clear error
        return StepSize()
    sizes = [files[k].size_bytes if k in files else None for k in partition_keys]
    return StepSize(bytes=sizes[0]) if len(sizes) == 1 else StepSize.for_range(sizes)


def gather_snapshot(handler, candidates) -> Snapshot:
    """Ask every candidate backend for its state; failures become unreachable states with the reason."""
    states = {}
    for name in candidates:
        try:
            states[name] = handler.backend(name).policy_state()
        except Exception as e:  # unreachable controller, missing config, ...
            states[name] = STATE_TYPES[name](reachable=False, reason=f"{type(e).__name__}: {e}")
    return Snapshot(rate_card=handler.rate_card, taken_at=time.time(), **states)


def auto_placement(handler, request: GpuRequest, ctx, step_key: str, partition_keys: Sequence[str] = ()) -> Placement:
    """The cost policy's placement of one step (all of its partitions) over the handler's configured backends."""
    tags = dict(ctx.step_tags.get(step_key, {}))
    snapshot = with_learned_rates(ctx.instance, gather_snapshot(handler, handler.candidates))
    asset_key = tags.get(TAG_ASSET_KEY)
    model = runtime_model(ctx.instance, asset_key) if asset_key else RuntimeModel.from_history([])
    model = replace(model, checkpoint_records=checkpoint_records(tags))
    return choose_placement(request, step_size(tags, partition_keys), snapshot, history=model)


def checkpoint_records(tags: Mapping[str, str]) -> float | None:
    """Records between checkpoint parts from the op tag ``dagster-gpu/checkpoint-records`` (``embedding_asset``
    writes it); None when absent, not a number or 0 (no checkpoints: a preemption loses the partition in flight)."""
    try:
        n = float(tags.get(TAG_CHECKPOINT_RECORDS) or 0)
    except ValueError:
        return None
    return n if n > 0 else None
