"""Pure rules of a relay channel on an object store (``slurm.relay_url``): part names, where a reader's byte
offset falls among the parts, and where a new writer continues the sequence. No I/O here
(:mod:`dagster_gpu.relay.objects` lists, reads and writes the parts).

An object store has no append, so a channel is a prefix of immutable parts, ``<channel>/00000001.jsonl``,
``<channel>/00000002.jsonl``, …: each one atomic PUT of whole records (lines of
:mod:`dagster_gpu.relay.channel`'s format). The channel's bytes are the concatenation of its parts in
sequence order, so a reader's byte offset means what it means in a channel file.

The part names (:mod:`dagster_gpu.core.object_parts`) are shared with an array task's log shipped when nothing is
shared with the compute nodes (``transport: rest`` with ``relay_url``): ``<seq>.log`` parts of raw bytes.
"""

from __future__ import annotations

from typing import Any, Mapping

from dagster_gpu.core.object_parts import (  # noqa: F401  (re-exported: the channel's part names)
    CHANNEL_SUFFIX,
    LOG_SUFFIX,
    PART_DIGITS,
    PART_RE,
    next_sequence,
    part_name,
    part_sequence,
)


def is_object_channel(channel: str) -> bool:
    """Whether ``channel`` names an object-store channel (an fsspec URL such as ``s3://bucket/prefix/run/digest``)
    rather than a channel file (a path)."""
    return "://" in channel


def parts_to_read(sizes: Mapping[int, int], offset: int) -> list[tuple[int, int]]:
    """Which parts hold the channel's bytes from byte ``offset``, as ``(sequence number, first byte within the
    part)`` in order. ``sizes`` maps each listed part's sequence number to its size in bytes.

    The channel is parts 1, 2, … up to the first missing number: a listing that lags behind a PUT must not make
    a reader step over a part it has not seen yet (its later offsets would skip that part's records), so
    nothing after a gap is read until the gap is filled. Parts wholly below ``offset`` are skipped; an offset
    at or beyond the contiguous end gives []. Raises ValueError for a negative offset or size."""
    if offset < 0:
        raise ValueError(f"relay channel offset {offset} is negative")
    out: list[tuple[int, int]] = []
    start, seq = 0, 1
    while seq in sizes:
        size = sizes[seq]
        if size < 0:
            raise ValueError(f"relay channel part {seq} has a negative size {size}")
        end = start + size
        if end > offset:
            out.append((seq, max(0, offset - start)))
        start, seq = end, seq + 1
    return out


#: Storage-option names that hold credentials (compared lower-case; any name containing one of
#: :data:`SECRET_WORDS` is refused too). Credentials come from each side's provider chain instead.
CREDENTIAL_OPTIONS = frozenset({"key", "aws_access_key_id", "access_key", "access_key_id", "account_key", "sas_token",
                                "credentials", "token"})
SECRET_WORDS = ("secret", "password", "token", "credential")


def _credential_paths(value: Any, path: str) -> list[str]:
    if isinstance(value, Mapping):
        out = []
        for k, v in value.items():
            name = str(k).lower()
            if name in CREDENTIAL_OPTIONS or any(w in name for w in SECRET_WORDS):
                out.append(f"{path}.{k}")
            out += _credential_paths(v, f"{path}.{k}")
        return out
    return []


def check_relay_settings(events: str, relay_url: str | None, storage_options: Mapping[str, Any]) -> None:
    """Refuse a ``slurm`` section's relay settings that cannot work or would put a credential in config (and so in
    every manifest): ``relay_url`` without ``events: relay``, a ``relay_url`` that is not a URL, storage options
    without ``relay_url``, or a storage option named like a credential. Raises ValueError naming the setting."""
    where = "gpu_executor config slurm"
    if relay_url is not None:
        if events != "relay":
            raise ValueError(f"{where}.relay_url is set but slurm.events is {events!r}: it needs events: relay")
        if not is_object_channel(relay_url) or not relay_url.split("://", 1)[1].strip("/"):
            raise ValueError(f"{where}.relay_url: {relay_url!r} is not an object-store URL with a bucket "
                             "(e.g. s3://bucket/prefix); a channel file belongs in the spool (leave relay_url unset)")
    elif storage_options:
        raise ValueError(f"{where}.relay_storage_options is set without slurm.relay_url")
    bad = _credential_paths(storage_options, f"{where}.relay_storage_options")
    if bad:
        raise ValueError(f"{', '.join(bad)}: credentials are not taken from config (they would be in every manifest); "
                         "give each side its provider chain (environment, env_files, instance profile)")
