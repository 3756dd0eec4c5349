"""Partition keys derived from corpus file names (pure).

A key is safe everywhere it travels: Dagster partition keys, file paths, shell words, Slurm job
names and Kubernetes label values (``[A-Za-z0-9._-]``, at most 63 characters, alphanumeric at both
ends; Kubernetes "Labels and Selectors", syntax and character set).

Derivation, stable across runs and hosts:
  1. the file's path relative to the corpus root, ``/`` joined as ``__``;
  2. every run of characters outside ``[A-Za-z0-9._-]`` becomes ``_``; leading/trailing
     non-alphanumerics are stripped;
  3. if step 2 changed anything, step 1 cannot be undone (the name itself holds ``__``), or the
     result is longer than 63 characters, the result is cut to 54
     characters and ``-`` plus the first 8 hex digits of the SHA-256 of the original name is appended,
     so two different names never share a key.
A name with nothing left after step 2 (``$(…)``, ``日本語``) becomes ``file-<hash8>``.
"""

from __future__ import annotations

import hashlib
import re

MAX_KEY_LENGTH = 63
_HASH_LEN = 8
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")
_VALID = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


class PartitionKeyError(ValueError):
    """A string is not a valid dagster-gpu partition key; the message quotes it."""


def _digest(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_LEN]


def partition_key_for(relative_name: str) -> str:
    """The partition key of a corpus file, given its path relative to the corpus root.

    >>> partition_key_for("computers")
    'computers'
    >>> partition_key_for("my file.txt")
    'my_file.txt-bd031735'
    """
    parts = relative_name.split("/")
    joined = "__".join(parts)
    cleaned = _EDGE.sub("", _UNSAFE.sub("_", joined))
    # Kept as is only when the ``__`` join can be undone (``a/b`` -> ``a__b``); a name that itself holds
    # ``__`` or a ``_`` next to a ``/`` (``a__b``, ``a_/b``) is hashed, so it never shares ``a/b``'s key.
    if cleaned == joined and len(cleaned) <= MAX_KEY_LENGTH and joined.split("__") == parts:
        return cleaned
    if not cleaned:
        return f"file-{_digest(relative_name)}"
    head = _EDGE.sub("", cleaned[: MAX_KEY_LENGTH - _HASH_LEN - 1])
    return f"{head}-{_digest(relative_name)}" if head else f"file-{_digest(relative_name)}"


def validate_partition_key(key: str) -> str:
    """Return ``key`` if it is safe (see module doc), else raise PartitionKeyError."""
    if not isinstance(key, str) or not _VALID.match(key):
        raise PartitionKeyError(
            f"partition key {key!r} is not safe: expected 1-63 characters of [A-Za-z0-9._-], alphanumeric at both ends"
        )
    return key
