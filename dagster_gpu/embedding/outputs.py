"""Finding a partition's output file, whichever naming rule wrote it (I/O: fsspec).

Outputs are written at :func:`dagster_gpu.definitions.assets.output_uri_for` (name: :func:`dagster_gpu.core.partition_keys.output_name_for`).
Before that rule, every output was ``<key>.parquet``; for a key with upper-case letters or ending in
``.parquet`` the two names differ, and :func:`locate_output` reads the earlier one when the current one
is absent, so outputs written before stay readable until the partition is materialized again. (On a
case-insensitive file system an earlier ``A.txt.parquet`` may hold ``a.txt``'s vectors: the collision
the current rule removes. Re-materialize such partitions; the materialization's ``embedding/output_uri``
metadata always names the file it wrote.)
"""

from __future__ import annotations

import posixpath

import fsspec

from dagster_gpu.core.partition_keys import legacy_output_name_for, output_name_for


def output_uri_candidates(output_url: str, asset_name: str, partition_key: str) -> list[str]:
    """The URIs a partition's output may have, current rule first (one URI when both rules agree).
    Raises PartitionKeyError for an unsafe key."""
    root = posixpath.join(output_url.rstrip("/"), asset_name)
    names = [output_name_for(partition_key), legacy_output_name_for(partition_key)]
    return [posixpath.join(root, n) for n in dict.fromkeys(names)]


def locate_output(output_url: str, asset_name: str, partition_key: str, storage_options: dict | None = None) -> str | None:
    """The URI of the partition's existing output (current name, else the earlier ``<key>.parquet``), or None
    when neither exists. Raises PartitionKeyError for an unsafe key, and fsspec's errors when the store
    cannot be asked."""
    current, *earlier = output_uri_candidates(output_url, asset_name, partition_key)
    fs, path = fsspec.core.url_to_fs(current, **(storage_options or {}))
    fs.invalidate_cache(posixpath.dirname(path))  # object stores' listing caches (s3fs) may predate the write
    if fs.isfile(path):  # unique under case folding: no other key's file answers to this name
        return current
    for uri in earlier:
        fs, path = fsspec.core.url_to_fs(uri, **(storage_options or {}))
        if fs.isfile(path) and _exact_name(fs, path):
            return uri
    return None


def _exact_name(fs, path: str) -> bool:
    """True when the directory lists this exact name (on a case-insensitive store, ``A.txt.parquet`` "exists"
    when only ``a.txt.parquet`` does)."""
    parent, name = posixpath.split(path.rstrip("/"))
    try:
        return name in {posixpath.basename(p.rstrip("/")) for p in fs.ls(parent, detail=False)}
    except FileNotFoundError:
        return False
