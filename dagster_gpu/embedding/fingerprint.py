"""One string for everything that changes an embedding vector (pure: canonical JSON -> sha256).

``fingerprint`` is computed on the worker, once the model is loaded (its Hub commit or files' hash, its
Pooling config); ``config_fingerprint`` from what is known when the definitions load (the model may not be on
the orchestrator), for the asset's ``code_version``. Canonical JSON: keys sorted, no spaces, ASCII only,
floats as Python's repr; the same fields give the same string on any host and Python version.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping


def _canonical(fields: dict[str, Any]) -> str:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _chunking(chunking: Any) -> dict | None:
    if chunking is None:
        return None
    describe = getattr(chunking, "describe", None)
    return dict(describe() if describe is not None else chunking)


def _digest(prefix: str, fields: dict[str, Any]) -> str:
    return f"{prefix}-" + hashlib.sha256(_canonical(fields).encode("ascii")).hexdigest()[:16]


def fingerprint(*, model_revision: str, model: str, prompt: str, pooling: dict, normalize: bool,
                truncate_dim: int | None, output_dtype: str, max_seq_length: int, chunking: dict | None) -> str:
    """``"fp1-<16 hex>"``: the first 16 hex digits of sha256 over the canonical JSON of the fields.

    ``model_revision``: the Hub commit or ``sha256:<16 hex>`` of the model files (``model.LoadedModel.revision``);
    ``prompt``: the resolved prompt text; ``pooling``: ``pooling_description(st)``; ``chunking``:
    ``TokenChunks.describe()`` (or the TokenChunks itself) or None. Raises TypeError/ValueError for fields
    that are not JSON (e.g. NaN).
    """
    return _digest("fp1", {
        "v": 1, "model_revision": str(model_revision), "model": str(model), "prompt": str(prompt),
        "pooling": dict(pooling), "normalize": bool(normalize),
        "truncate_dim": None if truncate_dim is None else int(truncate_dim), "output_dtype": str(output_dtype),
        "max_seq_length": int(max_seq_length), "chunking": _chunking(chunking)})


def config_fields(*, model: str, revision: str | None = None, prompt_name: str | None = None,
                  prompt: str | None = None, normalize: bool = True, truncate_dim: int | None = None,
                  output_dtype: str = "float32", max_seq_length: int | None = None,
                  chunking: Any = None) -> dict[str, Any]:
    """The embedding options as the user gave them (None = the model's default), JSON-able: what
    :func:`config_fingerprint` hashes, recorded on each materialization (``embedding/config``) so that
    ``dagster-gpu stale`` can name the option that changed."""
    return {
        "v": 1, "model": str(model), "revision": revision, "prompt_name": prompt_name, "prompt": prompt,
        "normalize": bool(normalize), "truncate_dim": None if truncate_dim is None else int(truncate_dim),
        "output_dtype": str(output_dtype), "max_seq_length": None if max_seq_length is None else int(max_seq_length),
        "chunking": _chunking(chunking)}


def config_fingerprint(**options: Any) -> str:
    """``"cfg1-<16 hex>"`` of :func:`config_fields` (same keyword arguments), for the asset's ``code_version``:
    another model, revision, prompt, output option or chunking -> another string."""
    return _digest("cfg1", config_fields(**options))


def changed_options(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``"name old → new"`` for each option of :func:`config_fields` that differs between ``old`` and ``new``
    (the version key ``v`` left out), in the fields' order; values as JSON."""
    import json

    keys = [k for k in dict.fromkeys([*new, *old]) if k != "v"]
    return [f"{k} {json.dumps(old.get(k))} → {json.dumps(new.get(k))}" for k in keys if old.get(k) != new.get(k)]


def pooling_description(st) -> dict:
    """The model's Pooling config as a JSON-able dict (sentence-transformers' ``Pooling.get_config_dict()``:
    ``pooling_mode``, ``include_prompt``, ``embedding_dimension`` in 6.x), keys sorted, plus ``normalize_module``
    (True when the model ends in a ``Normalize`` module); ``{}`` entries when the model has no Pooling."""
    out: dict[str, Any] = {}
    for module in st:
        name = type(module).__name__
        if name == "Pooling" and not out:
            cfg = module.get_config_dict()
            out = {k: cfg[k] for k in sorted(cfg) if isinstance(cfg[k], (str, int, float, bool, type(None)))}
        elif name == "Normalize":
            out["normalize_module"] = True
    return out
