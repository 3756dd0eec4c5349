"""One string for everything that changes an embedding vector (pure: canonical JSON -> sha256).

``fingerprint`` is computed on the worker, once the model is loaded (its Hub commit or files' hash, its
Pooling config); ``config_fingerprint`` from what is known when the definitions load (the model may not be on
the orchestrator), for the asset's ``code_version``. Canonical JSON: keys sorted, no spaces, ASCII only,
floats as Python's repr; the same fields give the same string on any host and Python version.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Collection, Mapping, Sequence


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


#: The output columns of :func:`output_columns` that the output file's schema shows (``id_column`` changes the
#: ``doc_id`` values only, so a file cannot tell it).
SCHEMA_COLUMN_FIELDS = ("carry_columns", "include_text")


def output_columns(*, id_column: str | None = None, carry_columns: Sequence[str] = (),
                   include_text: bool = False) -> dict[str, Any]:
    """The options that shape an output's columns, JSON-able: ``{"id_column": str | None, "carry_columns":
    [names, in order], "include_text": bool}`` (``TextFormat.id_column`` / ``carry_columns``, the asset's
    ``include_text``)."""
    return {"id_column": None if id_column is None else str(id_column),
            "carry_columns": [str(c) for c in carry_columns], "include_text": bool(include_text)}


#: :func:`output_columns` of an asset that keeps neither a corpus id, carried columns nor the text.
DEFAULT_COLUMNS = output_columns()


def columns_of_schema(names: Sequence[str], fixed: Collection[str]) -> dict[str, Any]:
    """The :data:`SCHEMA_COLUMN_FIELDS` of :func:`output_columns` that an output file's column ``names`` show:
    ``carry_columns`` = the names not in ``fixed`` (the writer's own columns, ``text`` included) in the file's
    order, ``include_text`` = whether ``text`` is there."""
    return {"carry_columns": [n for n in names if n not in fixed], "include_text": "text" in names}


def config_fields(*, model: str, revision: str | None = None, prompt_name: str | None = None,
                  prompt: str | None = None, normalize: bool = True, truncate_dim: int | None = None,
                  output_dtype: str = "float32", max_seq_length: int | None = None,
                  chunking: Any = None, columns: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The embedding options as the user gave them (None = the model's default), JSON-able: what
    :func:`config_fingerprint` hashes, recorded on each materialization (``embedding/config``) so that
    ``dagster-gpu stale`` can name the option that changed. ``columns``: :func:`output_columns` (key
    ``columns``, present only when given)."""
    return {
        "v": 1, "model": str(model), "revision": revision, "prompt_name": prompt_name, "prompt": prompt,
        "normalize": bool(normalize), "truncate_dim": None if truncate_dim is None else int(truncate_dim),
        "output_dtype": str(output_dtype), "max_seq_length": None if max_seq_length is None else int(max_seq_length),
        "chunking": _chunking(chunking), **({"columns": dict(columns)} if columns is not None else {})}


def config_fingerprint(**options: Any) -> str:
    """``"cfg1-<16 hex>"`` of :func:`config_fields` (same keyword arguments), for the asset's ``code_version``:
    another model, revision, prompt, output option, chunking or output columns -> another string. Columns equal
    to :data:`DEFAULT_COLUMNS` are left out of the hash, so an asset with the default columns keeps the code
    version it had before columns were hashed (its outputs are not re-embedded for nothing)."""
    fields = config_fields(**options)
    if fields.get("columns") == DEFAULT_COLUMNS:
        del fields["columns"]
    return _digest("cfg1", fields)


def changed_options(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``"name old → new"`` for each option of :func:`config_fields` that differs between ``old`` and ``new``
    (the version key ``v`` left out), in the fields' order; values as JSON with their keys sorted (a mapping
    such as ``chunking`` reads the same on both sides)."""
    keys = [k for k in dict.fromkeys([*new, *old]) if k != "v"]
    return [f"{k} {_json(old.get(k))} → {_json(new.get(k))}" for k in keys if old.get(k) != new.get(k)]


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


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
