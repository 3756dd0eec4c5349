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


# ------------------------------------------------------------------------------------- output names
#: The extension of every output file.
OUTPUT_SUFFIX = ".parquet"
_MARK = "~"  # never in a key ([A-Za-z0-9._-]), so a marked name never equals another key's plain name
_OUTPUT_NAME = re.compile(r"^(?P<base>[A-Za-z0-9._-]+)(?P<p>~p)?(?:~c(?P<mask>[0-9a-f]+))?\.parquet$")


def output_name_for(partition_key: str) -> str:
    """The file name of a partition's output: unique under case folding, with no doubled extension.

    Rule (a partition key is ``[A-Za-z0-9._-]``, see module doc; ``~`` never occurs in one):

    1. a key ending in ``.parquet`` (any case) loses that suffix and gets the mark ``~p`` instead, so its
       output is not ``x.parquet.parquet``;
    2. a key with upper-case letters gets ``~c<hex>``, the bit mask of their positions in the key (bit i =
       character i), so ``A.txt`` and ``a.txt`` differ on a case-insensitive file system or object store;
    3. ``.parquet`` is appended.

    Keys with neither (all lower case, not ending in ``.parquet``: the usual ones) keep the name they always
    had, ``<key>.parquet``. The map is one-to-one even after case folding: the marks are unambiguous and the
    mask restores the exact case (:func:`partition_key_of_output` inverts it).

    >>> output_name_for("computers")
    'computers.parquet'
    >>> output_name_for("A.txt"), output_name_for("a.txt")
    ('A.txt~c1.parquet', 'a.txt.parquet')
    >>> output_name_for("long.parquet")
    'long~p.parquet'

    Raises PartitionKeyError for a key that is not safe (:func:`validate_partition_key`).
    """
    key = validate_partition_key(partition_key)
    base, parquet = key, ""
    if key.lower().endswith(OUTPUT_SUFFIX) and len(key) > len(OUTPUT_SUFFIX):
        base, parquet = key[: -len(OUTPUT_SUFFIX)], f"{_MARK}p"
    mask = sum(1 << i for i, c in enumerate(key) if c.isupper())
    case = f"{_MARK}c{mask:x}" if mask else ""
    return f"{base}{parquet}{case}{OUTPUT_SUFFIX}"


def partition_key_of_output(name: str) -> str:
    """The partition key whose output file is called ``name`` (the inverse of :func:`output_name_for`).
    Raises PartitionKeyError when ``name`` is not such a name."""
    m = _OUTPUT_NAME.match(name)
    if not m:
        raise PartitionKeyError(f"{name!r} is not a dagster-gpu output file name")
    key = m["base"] + (OUTPUT_SUFFIX if m["p"] else "")
    if m["mask"] is not None:
        mask = int(m["mask"], 16)
        key = "".join(c.upper() if mask >> i & 1 else c.lower() for i, c in enumerate(key))
        if mask >> len(key) or output_name_for(key) != name:
            raise PartitionKeyError(f"{name!r}: its case mask does not match its key")
    elif m["p"] is None and any(c.isupper() for c in key):
        raise PartitionKeyError(f"{name!r}: upper-case letters without a case mask")
    return validate_partition_key(key)


def legacy_output_name_for(partition_key: str) -> str:
    """The name outputs had before :func:`output_name_for` (``<key>.parquet``), still read when the new name
    is absent. It equals the new name for keys that are all lower case and do not end in ``.parquet``."""
    return f"{validate_partition_key(partition_key)}{OUTPUT_SUFFIX}"
