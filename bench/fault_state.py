"""The fault benchmark's per-run override file: how bench/fault_inject.py changes the Kubernetes settings of
one run while the code location (bench/faults_pipeline.py) stays loaded.

The code location reads its settings once, when it loads; a fault that needs a different setting for one
run (an image the registry does not have) cannot go through them. Instead the injector writes
``FAULTS_STATE``, a small JSON file::

    {"runs": {"<run id>": {"kubernetes": {"image": "registry.invalid/dagster-gpu:does-not-exist"}}}}

and the pipeline's step handler re-reads it at every step launch and merges the entry of its run over the
executor's ``kubernetes`` section (:func:`kubernetes_overrides`). Only the keys in :data:`ALLOWED_KEYS`
may be overridden, so the file cannot turn off a security setting. Writes are atomic (temp file, rename),
so a reader sees the old or the new file, never half of one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

#: The ``kubernetes`` settings a fault may override for one run.
ALLOWED_KEYS = frozenset({"image", "sharing_strategy", "priority_class_name", "cpu_request", "max_preemptions",
                          "queue_name"})


def read_state(path: str | Path | None) -> dict[str, Any]:
    """The file's JSON object; ``{"runs": {}}`` when ``path`` is None/empty or the file does not exist.

    Raises:
        ValueError: the file is not a JSON object with a ``runs`` object (the message names the file).
    """
    if not path or not Path(path).exists():
        return {"runs": {}}
    text = Path(path).read_text()
    try:
        data = json.loads(text or "{}")
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.setdefault("runs", {}), dict):
        raise ValueError(f"{path}: expected an object with a 'runs' object, got {text[:80]!r}")
    return data


def kubernetes_overrides(state: Mapping[str, Any], run_id: str) -> dict[str, Any]:
    """The ``kubernetes`` settings ``state`` overrides for ``run_id`` ({} when none).

    Raises:
        ValueError: the entry sets a key outside :data:`ALLOWED_KEYS`, or is not an object.
    """
    entry = (state.get("runs") or {}).get(run_id) or {}
    if not isinstance(entry, Mapping):
        raise ValueError(f"fault state for run {run_id}: the entry must be an object, got {entry!r}")
    k8s = entry.get("kubernetes") or {}
    if not isinstance(k8s, Mapping):
        raise ValueError(f"fault state for run {run_id}: 'kubernetes' must be an object, got {k8s!r}")
    bad = set(k8s) - ALLOWED_KEYS
    if bad:
        raise ValueError(f"fault state for run {run_id}: cannot override {sorted(bad)} (allowed: {sorted(ALLOWED_KEYS)})")
    return dict(k8s)


def merged_kubernetes(section: Mapping[str, Any], state: Mapping[str, Any], run_id: str) -> dict[str, Any]:
    """``section`` (the executor config's ``kubernetes`` dict) with ``run_id``'s overrides on top."""
    return {**dict(section), **kubernetes_overrides(state, run_id)}


def _write(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def set_run_override(path: str | Path, run_id: str, kubernetes: Mapping[str, Any]) -> None:
    """Add (or replace) ``run_id``'s ``kubernetes`` overrides in the file at ``path``.

    Raises:
        ValueError: a key outside :data:`ALLOWED_KEYS`.
    """
    kubernetes_overrides({"runs": {run_id: {"kubernetes": dict(kubernetes)}}}, run_id)  # validates
    state = read_state(path)
    state["runs"][run_id] = {"kubernetes": dict(kubernetes)}
    _write(Path(path), state)


def clear_run_override(path: str | Path, run_id: str) -> bool:
    """Remove ``run_id``'s entry (the fault is over); True when there was one."""
    state = read_state(path)
    if state["runs"].pop(run_id, None) is None:
        return False
    _write(Path(path), state)
    return True
