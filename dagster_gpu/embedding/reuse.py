"""Reuse a partition's previous vectors for records whose text did not change.

A re-embedding under the same fingerprint (``dagster_gpu.fingerprint`` in the previous output's parquet key-value
metadata) needs the device only for new or changed text. :func:`load_previous` reads the previous output at the
partition's output URI into a :class:`ReuseMap`: record text hash -> that record's rows (vectors, token counts,
chunk fields), in chunk order. The key is the sha256 of the record's whole text (UTF-8):

- chunked outputs carry it as the ``record_sha256`` column (:data:`dagster_gpu.embedding.writer.RECORD_HASH_COLUMN`):
  a record's whole set of chunks is reused only when the record's text is unchanged (a changed record is
  chunked and embedded again, every chunk of it);
- outputs without chunking key on ``text_sha256`` of rows that hold the whole record: ``chunk_index`` 0,
  ``char_start`` 0 and ``token_count`` below the model's max sequence length (so the text was not truncated and
  ``text_sha256`` is the record's own hash). A row at the max length may have been truncated: it is not reused
  (embedded again; correct, only slower).

A different fingerprint, no previous output, a file that cannot be read or lacks the columns: an empty map
(nothing reused; the reason is in :attr:`ReuseMap.reason`). Vectors come back in the file's dtype, so reused
rows are bit-identical to the previous output. Duplicates share one entry (same text, same rows); order,
insertions and deletions do not matter: lookup is by text, not position.

Memory: the map holds the previous output's vectors and token columns, ``rows × (dim × 4 + ~100)`` bytes
(float32; ``dim × 2`` for float16), e.g. 100,000 rows of 384 dims ≈ 160 MB, plus one dict entry per distinct
record text (~150 bytes). Only the columns named here are read (not ``text`` or carried columns).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Mapping

import fsspec
import numpy as np
import pyarrow.parquet as pq

from dagster_gpu.embedding.writer import (
    CHAR_END_COLUMN,
    CHAR_START_COLUMN,
    CHUNK_COLUMN,
    HASH_COLUMN,
    META_FINGERPRINT,
    RECORD_HASH_COLUMN,
    TOKENS_COLUMN,
    VECTOR_COLUMN,
    vector_type,
)


def text_hash(text: str) -> str:
    """Hex sha256 of ``text`` encoded as UTF-8 (the output's hash columns)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class ReuseMap:
    """Record text hash -> the row numbers (into the arrays below) of that record's rows, in chunk order.

    ``vectors`` [rows, dim] in the previous file's dtype; ``tokens``, ``chunk_index``, ``char_start``,
    ``char_end``: int64 [rows]. ``reason``: why the map is empty ("" when it was loaded)."""

    rows: dict[str, np.ndarray] = field(default_factory=dict)
    vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    chunk_index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    char_start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    char_end: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    reason: str = ""

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, record_hash: str) -> np.ndarray | None:
        """The row numbers of the record whose text hashes to ``record_hash``, else None."""
        return self.rows.get(record_hash)


def load_previous(uri: str, fingerprint: str, *, chunked: bool, max_seq_length: int | None,
                  dim: int, output_dtype: str, storage_options: Mapping[str, Any] | None = None) -> ReuseMap:
    """The reusable rows of the output at ``uri`` when it was written under ``fingerprint`` (see the module doc).

    ``chunked``: this pass chunks (the previous file must then have ``record_sha256``); ``max_seq_length``: the
    model's, for unchunked outputs (None: no unchunked row is reused); ``dim`` / ``output_dtype``: this pass's
    vector shape and type (a file that differs reuses nothing). Never raises for a missing or unreadable file:
    the map is empty and says why."""
    if not fingerprint:
        return ReuseMap(reason="no fingerprint")
    try:
        fs, path = fsspec.core.url_to_fs(uri, **dict(storage_options or {}))
        if not fs.exists(path):
            return ReuseMap(reason="no previous output")
        with fs.open(path, "rb") as f:
            pf = pq.ParquetFile(f)
            kv = pf.schema_arrow.metadata or {}
            previous = kv.get(META_FINGERPRINT.encode(), b"").decode()
            if previous != fingerprint:
                return ReuseMap(reason=f"fingerprint {previous or 'none'} != {fingerprint}")
            names = pf.schema_arrow.names
            key = RECORD_HASH_COLUMN if chunked else HASH_COLUMN
            cols = [key, CHUNK_COLUMN, CHAR_START_COLUMN, CHAR_END_COLUMN, TOKENS_COLUMN, VECTOR_COLUMN]
            missing = [c for c in cols if c not in names]
            if missing:
                return ReuseMap(reason=f"columns {missing} missing")
            vtype = pf.schema_arrow.field(VECTOR_COLUMN).type
            if getattr(vtype, "list_size", None) != dim or vtype.value_type != vector_type(output_dtype):
                return ReuseMap(reason=f"vector type {vtype} != {output_dtype}[{dim}]")
            table = pf.read(columns=cols)
    except Exception as exc:  # unreadable: embed everything
        return ReuseMap(reason=f"previous output unreadable: {type(exc).__name__}: {exc}")
    n = table.num_rows
    flat = table.column(VECTOR_COLUMN).combine_chunks().flatten().to_numpy(zero_copy_only=False)
    vectors = flat.reshape(n, dim)
    keys = table.column(key).to_pylist()
    ci = table.column(CHUNK_COLUMN).to_numpy().astype(np.int64)
    cs = table.column(CHAR_START_COLUMN).to_numpy().astype(np.int64)
    ce = table.column(CHAR_END_COLUMN).to_numpy().astype(np.int64)
    tok = table.column(TOKENS_COLUMN).to_numpy().astype(np.int64)
    groups: dict[str, list[int]] = {}
    if chunked:
        # Rows of one record are consecutive (record order, then chunk order); a duplicate record's rows repeat:
        # keep the first run of each hash (a run restarts where chunk_index returns to 0).
        seen_done: set[str] = set()
        current: str | None = None
        for i, (h, c) in enumerate(zip(keys, ci.tolist())):
            if c == 0:
                if current is not None:
                    seen_done.add(current)
                current = h if h not in seen_done and h not in groups else None
                if current is not None:
                    groups[current] = []
            if current is not None and h == current:
                groups[current].append(i)
        # a record's chunk list must be 0, 1, 2, ... (anything else is not a complete record: drop it)
        groups = {h: r for h, r in groups.items() if ci[r].tolist() == list(range(len(r)))}
    else:
        if max_seq_length is None:
            return ReuseMap(reason="max_seq_length unknown")
        for i, (h, c, s, t) in enumerate(zip(keys, ci.tolist(), cs.tolist(), tok.tolist())):
            if c == 0 and s == 0 and t < max_seq_length and h not in groups:
                groups[h] = [i]
    return ReuseMap(rows={h: np.asarray(r, np.int64) for h, r in groups.items()}, vectors=vectors, tokens=tok,
                    chunk_index=ci, char_start=cs, char_end=ce)


@dataclass
class Planned:
    """One read batch with its reuse plan: ``hashes[i]`` the sha256 of ``batch.texts[i]``, ``hit[i]`` the
    previous rows of that text (None: to embed). ``embed_texts`` is what goes to the encoder."""

    batch: Any
    hashes: list[str]
    hit: list[np.ndarray | None]

    @property
    def embed_texts(self) -> list[str]:
        return [t for t, h in zip(self.batch.texts, self.hit) if h is None]


def plan(batch, previous: ReuseMap) -> Planned:
    """``batch``'s texts hashed and looked up in ``previous``."""
    hashes = [text_hash(t) for t in batch.texts]
    return Planned(batch, hashes, [previous.get(h) for h in hashes])


def merge(planned: Planned, r, previous: ReuseMap):
    """The per-row encoder result of the whole batch (the fields of ``encoder.Encoded``: vectors, tokens,
    truncated_rows, record_index, chunk_index, char_start, char_end, record_tokens, covered_tokens, plus
    ``reused_rows`` and ``reused_tokens``) from ``r``, the ``Encoded`` of ``planned.embed_texts`` only, and the
    reused rows. Rows are in record order, then chunk order: the layout a full embed of the batch gives.
    ``record_tokens`` / ``covered_tokens`` cover the embedded records only."""
    n_new = len(planned.embed_texts)
    rv = np.asarray(r.vectors)
    ri = getattr(r, "record_index", None)
    ri = np.arange(n_new, dtype=np.int64) if ri is None else np.asarray(ri, np.int64)
    m_new = len(rv)

    def field_of(name: str, default) -> np.ndarray:
        v = getattr(r, name, None)
        return np.asarray(default if v is None else v, np.int64)

    r_ci = field_of("chunk_index", np.zeros(m_new))
    r_cs = field_of("char_start", np.zeros(m_new))
    new_texts = planned.embed_texts
    r_ce = field_of("char_end", [len(new_texts[i]) for i in ri.tolist()])
    r_tok = np.asarray(r.tokens, np.int64)
    starts = np.searchsorted(ri, np.arange(n_new), "left")
    ends = np.searchsorted(ri, np.arange(n_new), "right")
    idx: list[np.ndarray] = []
    src: list[np.ndarray] = []
    rec: list[np.ndarray] = []
    j = 0
    for i, h in enumerate(planned.hit):
        if h is None:
            rows = np.arange(starts[j], ends[j], dtype=np.int64)
            j += 1
            idx.append(rows)
            src.append(np.zeros(len(rows), bool))
        else:
            idx.append(h)
            src.append(np.ones(len(h), bool))
        rec.append(np.full(len(idx[-1]), i, np.int64))
    cat = (lambda parts, dt: np.concatenate(parts).astype(dt, copy=False) if parts else np.zeros(0, dt))
    index, reused, record_index = cat(idx, np.int64), cat(src, bool), cat(rec, np.int64)
    m = len(index)
    dim = rv.shape[1] if rv.ndim == 2 and rv.shape[1] else previous.vectors.shape[1]
    dtype = rv.dtype if m_new else previous.vectors.dtype
    vectors = np.empty((m, dim), dtype)
    out = {k: np.empty(m, np.int64) for k in ("tokens", "chunk_index", "char_start", "char_end")}
    new, old = ~reused, reused
    vectors[new] = rv.reshape(m_new, dim)[index[new]] if m_new else vectors[new]
    vectors[old] = previous.vectors[index[old]]
    for k, a, b in (("tokens", r_tok, previous.tokens), ("chunk_index", r_ci, previous.chunk_index),
                    ("char_start", r_cs, previous.char_start), ("char_end", r_ce, previous.char_end)):
        out[k][new] = a[index[new]]
        out[k][old] = b[index[old]]
    return SimpleNamespace(
        vectors=vectors, truncated_rows=int(r.truncated_rows), record_index=record_index,
        record_tokens=getattr(r, "record_tokens", None), covered_tokens=getattr(r, "covered_tokens", None),
        reused_rows=int(old.sum()), reused_tokens=int(out["tokens"][old].sum()), **out,
    )
