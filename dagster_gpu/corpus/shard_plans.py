"""Where a large file's shard plan comes from: planned from the file once per source version, then cached.

A plan is a pure function of the file's bytes and the reader settings (:mod:`dagster_gpu.corpus.shards`), so it is
reproducible from the file and its source version; the cache is only a saving, never a source of truth:

- parquet: the footer (one small read: row-group row counts and sizes) -> :func:`plan_row_group_shards`, each row
  group's size scaled so that the sizes add up to the file's bytes (``shard_bytes`` compares with what the listing
  reports, not with the uncompressed sizes of the footer);
- JSON Lines and text: one scan of the whole file -> :func:`plan_byte_shards` (about a second per GB from a local
  disk; a download of the whole file from an object store).

Whoever lists the corpus first for a file version pays the scan (the corpus sensor's tick, or ``dagster-gpu
backfill``'s registration); the plan is then kept in this process and, when a plan directory is known, as one small
JSON file named by a hash of (file URI, source version, ``shard_bytes``, reader settings), which the step workers
read instead of scanning the file again. A worker that cannot reach the directory (a pod without the run worker's
disk) plans the file itself: the same plan, one scan more. The directory is ``CorpusSource.shard_plan_url``, else
``$DAGSTER_HOME/dagster_gpu/shard_plans`` when ``DAGSTER_HOME`` is set, else none (this process only).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import asdict
from typing import Any, Mapping

from dagster_gpu.corpus.plan_dir import PlanDir
from dagster_gpu.corpus.shards import Shard, plan_byte_shards, plan_row_group_shards

#: Plans kept in this process (an LRU of this many file versions).
_MEMO_SIZE = 1024
_memo: "OrderedDict[str, tuple[Shard, ...]]" = OrderedDict()
_lock = threading.Lock()


def default_plan_url() -> str | None:
    """``$DAGSTER_HOME/dagster_gpu/shard_plans`` when ``DAGSTER_HOME`` is set, else None."""
    home = os.environ.get("DAGSTER_HOME")
    return os.path.join(home, "dagster_gpu", "shard_plans") if home else None


def plan_id(uri: str, version: str, shard_bytes: int, kind: str, separator_line: str | None, encoding: str) -> str:
    """The cache key of one plan: 32 hex of the SHA-256 of everything the plan depends on."""
    doc = json.dumps([uri, version, int(shard_bytes), kind, separator_line, encoding])
    return hashlib.sha256(doc.encode()).hexdigest()[:32]


def file_shards(fs, path: str, uri: str, size: int, version: str, shard_bytes: int, *, kind: str,
                separator_line: str | None = None, encoding: str = "utf-8", plan_url: str | None = None,
                plan_storage_options: Mapping[str, Any] | None = None) -> tuple[Shard, ...]:
    """The shards of the file at ``path`` on fsspec filesystem ``fs`` (``uri`` as the listing names it, ``size``
    bytes, source version ``version``) for shards of about ``shard_bytes``; ``kind``: ``parquet``, ``jsonl`` or
    ``text`` (``separator_line``, ``encoding`` as :class:`dagster_gpu.corpus.readers.TextFormat`'s). From this
    process's memory, else the plan directory ``plan_url`` (fsspec with ``plan_storage_options``), else planned
    from the file and stored in both. One shard means: do not cut.

    Raises OSError (the store's error) when the file cannot be read, ValueError from pyarrow for a parquet file
    whose footer is unreadable (the caller lists the file whole: its read then fails naming it)."""
    pid = plan_id(uri, version, shard_bytes, kind, separator_line if kind == "text" else None, encoding)
    with _lock:
        if pid in _memo:
            _memo.move_to_end(pid)
            return _memo[pid]
    shards = _load(plan_url, pid, plan_storage_options)
    if shards is None:
        shards = _plan(fs, path, size, shard_bytes, kind, separator_line, encoding)
        _store(plan_url, pid, shards, plan_storage_options)
    with _lock:
        _memo[pid] = shards
        while len(_memo) > _MEMO_SIZE:
            _memo.popitem(last=False)
    return shards


def forget_plans() -> None:
    """Empty this process's memory of plans (tests; a directory's plans stay)."""
    with _lock:
        _memo.clear()


def _plan(fs, path: str, size: int, shard_bytes: int, kind: str, separator_line: str | None,
          encoding: str) -> tuple[Shard, ...]:
    if kind == "parquet":
        import pyarrow.parquet as pq

        with fs.open(path, "rb") as f:
            md = pq.ParquetFile(f).metadata
        rows = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
        raw = [md.row_group(i).total_byte_size for i in range(md.num_row_groups)]
        total = sum(raw) or 1
        scaled = [b * size // total for b in raw]
        return tuple(plan_row_group_shards(rows, scaled, shard_bytes)) if rows else (Shard(0, 1, "row_groups", 0, 0, 0, 0),)
    with fs.open(path, "rb", block_size=1 << 22) as f:
        return tuple(plan_byte_shards(f, size, shard_bytes, kind=kind, separator_line=separator_line, encoding=encoding))


def _load(plan_url: str | None, pid: str, storage_options) -> tuple[Shard, ...] | None:
    if not plan_url:
        return None
    doc = PlanDir(plan_url, storage_options).read(f"{pid}.json")
    try:
        return tuple(Shard(**s) for s in doc["shards"])
    except (KeyError, TypeError):  # absent or not ours: plan again
        return None


def _store(plan_url: str | None, pid: str, shards: tuple[Shard, ...], storage_options) -> None:
    """Best effort: a plan directory that cannot be written only costs another scan elsewhere."""
    if not plan_url:
        return
    try:
        PlanDir(plan_url, storage_options).write(f"{pid}.json", {"shards": [asdict(s) for s in shards]})
    except Exception as e:  # noqa: BLE001 - see the docstring
        logging.getLogger(__name__).warning("shard plan %s not stored under %s: %s: %s", pid, plan_url, type(e).__name__, e)


__all__ = ["default_plan_url", "file_shards", "forget_plans", "plan_id"]
