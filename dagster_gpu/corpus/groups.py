"""File groups: many small corpus files as one partition, by a stable hash bucket (pure).

With ``CorpusSource(group_buckets=N)`` each corpus file lands in bucket ``bucket_of(relative path, N)``: the
SHA-256 of the file's path relative to the corpus root, read as a big-endian integer of its first 8 bytes,
modulo N. A bucket is one partition, keyed :func:`group_key` (``group-0042-of-1024``). Why a hash and not
fixed-size groups in path order: a new file lands in its own bucket and never moves another file (groups by
path order shift every file after an insertion, so one new file would make every later group stale), and a
deleted file changes only its own bucket. The price: buckets hold about ``files / N`` files each, not exactly,
and an empty bucket is no partition.

A bucket's source version (:func:`group_version`) is a digest of its files' (key, source version) pairs, sorted:
it changes exactly when one of its files changes, comes or goes. Per-file truth stays: each file keeps its
own key and source version (:attr:`dagster_gpu.corpus.listing.CorpusFile.members`), its rows keep the file's own
ids, and :func:`file_changes` says which files differ between two materializations of a bucket.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping, Sequence

#: The form of a bucket's partition key: ``group-<index>-of-<count>``, both zero-padded to the same width.
GROUP_KEY_PREFIX = "group-"


@dataclass(frozen=True)
class Group:
    """Bucket ``index`` (0-based) of ``count`` buckets."""

    index: int
    count: int


def validate_buckets(buckets: object) -> int:
    """``buckets`` as an int; raises ValueError unless it is an integer >= 1 (a bool is not one)."""
    if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 1:
        raise ValueError(f"group_buckets must be an integer >= 1, got {buckets!r}")
    return buckets


def bucket_of(relative_name: str, buckets: int) -> int:
    """The bucket (0 … ``buckets`` − 1) of the corpus file at ``relative_name`` (its ``/``-joined path relative to
    the corpus root): the first 8 bytes of its SHA-256 (UTF-8) as a big-endian integer, modulo ``buckets``. The
    same on every host and Python run (never Python's ``hash()``). Raises ValueError for ``buckets`` < 1."""
    validate_buckets(buckets)
    digest = hashlib.sha256(relative_name.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % buckets


def group_key(index: int, buckets: int) -> str:
    """The partition key of bucket ``index`` of ``buckets``: ``group-0042-of-1024`` (numbers zero-padded to at least 4
    digits and to the width of ``buckets``, so keys sort as their numbers do). Raises ValueError for an index
    outside ``0 … buckets − 1``."""
    validate_buckets(buckets)
    if not 0 <= index < buckets:
        raise ValueError(f"bucket index {index} is not in 0..{buckets - 1}")
    width = max(4, len(str(buckets)))
    return f"{GROUP_KEY_PREFIX}{index:0{width}d}-of-{buckets:0{width}d}"


def parse_group_key(key: str) -> Group | None:
    """The :class:`Group` a :func:`group_key` names, else None (any other key)."""
    if not key.startswith(GROUP_KEY_PREFIX):
        return None
    index, sep, count = key[len(GROUP_KEY_PREFIX):].partition("-of-")
    if not sep or not index.isdigit() or not count.isdigit():
        return None
    g = Group(int(index), int(count))
    return g if 0 <= g.index < g.count and group_key(g.index, g.count) == key else None


def group_version(files: Mapping[str, str]) -> str:
    """A bucket's source version from its files' ``{file key: source version}``: ``group:<n>:<32 hex>``, the
    count and the SHA-256 of the sorted pairs. Equal for equal mappings, whatever their order; another version,
    another file or one file less changes it."""
    h = hashlib.sha256()
    for key in sorted(files):
        h.update(f"{key}\0{files[key]}\n".encode("utf-8", "surrogatepass"))
    return f"group:{len(files)}:{h.hexdigest()[:32]}"


@dataclass(frozen=True)
class FileChanges:
    """How a bucket's files differ from the ones its previous output was embedded from (sorted file keys).

    ``first``: there was no previous record (no previous output, or one written before file groups recorded
    their files): every file counts as added."""

    changed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    first: bool = False

    @property
    def count(self) -> int:
        """Files changed, added or removed."""
        return len(self.changed) + len(self.added) + len(self.removed)

    def describe(self, limit: int = 10) -> str:
        """One line for people: ``changed: a, b; added: c; removed: d`` (at most ``limit`` keys each, then
        ``… (+N)``); ``none`` when nothing changed; ``first materialization: N file(s)`` when ``first``."""
        if self.first:
            return f"first materialization: {len(self.added)} file(s)"
        parts = []
        for what, keys in (("changed", self.changed), ("added", self.added), ("removed", self.removed)):
            if keys:
                more = f" … (+{len(keys) - limit})" if len(keys) > limit else ""
                parts.append(f"{what}: {', '.join(keys[:limit])}{more}")
        return "; ".join(parts) or "none"


def file_changes(previous: Mapping[str, str] | None, current: Mapping[str, str]) -> FileChanges:
    """The files of ``current`` ({file key: source version}) changed or added since ``previous``, and those of
    ``previous`` gone from it; ``previous`` None: every file added, ``first`` set."""
    if previous is None:
        return FileChanges(added=tuple(sorted(current)), first=True)
    return FileChanges(
        changed=tuple(sorted(k for k in current if k in previous and previous[k] != current[k])),
        added=tuple(sorted(k for k in current if k not in previous)),
        removed=tuple(sorted(k for k in previous if k not in current)),
    )


def split_into_buckets(relative_names: Sequence[str], buckets: int) -> dict[int, list[str]]:
    """``{bucket: [relative names in it, in the given order]}`` for the non-empty buckets (pure)."""
    out: dict[int, list[str]] = {}
    for name in relative_names:
        out.setdefault(bucket_of(name, buckets), []).append(name)
    return out


__all__ = ["FileChanges", "GROUP_KEY_PREFIX", "Group", "bucket_of", "file_changes", "group_key", "group_version",
           "parse_group_key", "split_into_buckets", "validate_buckets"]
