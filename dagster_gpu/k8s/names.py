"""Names, labels and annotations of a step's Kubernetes objects (pure).

Every name and label value is valid (a DNS label / label value: at most 63 characters) and distinct for
distinct inputs whatever they hold: a value that had to change gets a hash of the original, and a name built
from several values (a run's partition keys) hashes their unambiguous tuple, not a joined string.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Sequence

from dagster_gpu.contracts import StepLaunch

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "dagster-gpu"
LABEL_RUN_ID = "dagster/run-id"
LABEL_STEP_KEY = "dagster-gpu/step-key"
LABEL_PARTITION = "dagster-gpu/partition"
LABEL_ATTEMPT = "dagster-gpu/attempt"
#: On a worker launched again after its scheduler preempted the earlier one(s): how many there were.
LABEL_PREEMPTIONS = "dagster-gpu/preemptions"
#: The rate-card device type the placement chose (the cost policy counts our Pending pods per pool by it).
ANNOTATION_PLACEMENT_DEVICE = "dagster-gpu/placement-device"
ANNOTATION_STEP_KEY = "dagster-gpu/step-key"
ANNOTATION_PARTITION_KEY = "dagster-gpu/partition-key"
ANNOTATION_DEVICE_REQUEST = "dagster-gpu/device-request"
ENV_POD = "DAGSTER_GPU_K8S_POD"
ENV_NAMESPACE = "DAGSTER_GPU_K8S_NAMESPACE"

_LABEL_OK = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _h(s: str, n: int = 8) -> str:
    return hashlib.sha256(s.encode()).hexdigest()[:n]


def sanitize_label_value(value: str) -> str:
    """A valid label value (<= 63 chars of ``[A-Za-z0-9-_.]``, alphanumeric at both ends) for ``value``.

    A value that is already valid is returned unchanged; any other gets its invalid characters replaced
    by ``-``, is truncated, and ends in ``-<8 hex of sha256(value)>`` so two different keys never collide.
    """
    if len(value) <= 63 and _LABEL_OK.match(value):
        return value
    body = re.sub(r"[^A-Za-z0-9_.-]", "-", value)[:54].strip("-_.")
    return f"{body}-{_h(value)}" if body else _h(value, 16)


def object_name(run_id: str, step_key: str, attempt: int, preemptions: int = 0) -> str:
    """Deterministic pod (and template) name for one attempt of one step of one run.

    ``dagster-gpu-<16 hex of sha256(run_id/step_key)>-<attempt>``, then ``-p<preemptions>`` for a worker
    launched again after its scheduler preempted the earlier one(s): at most 58 characters, a valid DNS
    label, stable across orchestrator restarts (a resumed run finds the same pod), distinct per retry and per
    relaunch after a preemption.
    """
    base = f"dagster-gpu-{_h(f'{run_id}/{step_key}', 16)}-{int(attempt)}"
    return f"{base}-p{int(preemptions)}" if preemptions else base


def step_labels(launch: StepLaunch) -> dict[str, str]:
    """Labels on the pod, its template and the generated ResourceClaim: run id, step key, attempt and the
    partition keys the step covers (:func:`partition_label`; no partition label for an unpartitioned run)."""
    labels = {
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_RUN_ID: sanitize_label_value(launch.run_id),
        LABEL_STEP_KEY: sanitize_label_value(launch.step_key),
        LABEL_ATTEMPT: str(int(launch.attempt)),
    }
    if launch.preemptions:
        labels[LABEL_PREEMPTIONS] = str(int(launch.preemptions))
    if launch.partition_keys:
        labels[LABEL_PARTITION] = partition_label(launch.partition_keys)
    return labels


def run_selector(run_id: str) -> str:
    """Label selector for every object of one run (pods, templates, claims)."""
    return f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_RUN_ID}={sanitize_label_value(run_id)}"


def partition_label(partition_keys: Sequence[str]) -> str:
    """One label value for the partition keys a step covers: :func:`sanitize_label_value` of a single key;
    for several, ``<first>..<last>-<12 hex>`` (each end cut to 20 characters) where the hash is of the JSON
    list of every key, so ``("a-b", "c")`` and ``("a", "b-c")`` differ, as do keys that differ only after
    character 20. Always a valid label value (<= 63 characters). Raises ValueError for no keys."""
    keys = list(partition_keys)
    if not keys:
        raise ValueError("partition_label needs at least one partition key")
    if len(keys) == 1:
        return sanitize_label_value(keys[0])
    digest = _h(json.dumps(keys, ensure_ascii=False, separators=(",", ":")), 12)

    def end(k: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]", "-", k)[:20].strip("-_.")

    body = f"{end(keys[0])}..{end(keys[-1])}".strip("-_.")
    return f"{body}-{digest}" if body else digest
