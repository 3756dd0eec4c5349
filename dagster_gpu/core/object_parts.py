"""Pure names of the parts an object-store prefix is written as: a relay channel's (``00000001.jsonl``, …) and a
shipped array task log's (``00000001.log``, …): each part one immutable PUT, the bytes their concatenation in
sequence order. Stdlib only: the array task runner carries this file in the job script text
(:mod:`dagster_gpu.slurm.object_runner`); :mod:`dagster_gpu.relay.parts` holds the reader's rules on top.
"""

from __future__ import annotations

import re
from typing import Iterable

#: Digits of a part's sequence number: 99,999,999 parts per channel (a step writes tens to thousands).
PART_DIGITS = 8
#: A part's file name: the zero-padded sequence number (from 1) and ``.jsonl``.
PART_RE = re.compile(rf"^(\d{{{PART_DIGITS}}})\.jsonl$")
#: The suffix of a channel's parts and of a shipped task log's parts.
CHANNEL_SUFFIX, LOG_SUFFIX = ".jsonl", ".log"


def part_name(seq: int, suffix: str = CHANNEL_SUFFIX) -> str:
    """The file name of part ``seq`` (1-based), e.g. ``00000007.jsonl`` (``suffix`` :data:`LOG_SUFFIX`:
    ``00000007.log``). Raises ValueError outside 1..10**PART_DIGITS - 1."""
    if not 1 <= seq < 10**PART_DIGITS:
        raise ValueError(f"relay channel part number {seq} is not in 1..{10**PART_DIGITS - 1}")
    return f"{seq:0{PART_DIGITS}d}{suffix}"


def part_sequence(name: str, suffix: str = CHANNEL_SUFFIX) -> int | None:
    """The sequence number of a part with ``suffix`` from its name or path (its last component), None for
    anything else (a temporary object, a foreign file)."""
    last = name.rstrip("/").rsplit("/", 1)[-1]
    if not last.endswith(suffix):
        return None
    m = PART_RE.match(last[: len(last) - len(suffix)] + CHANNEL_SUFFIX)
    return int(m.group(1)) if m and int(m.group(1)) >= 1 else None


def next_sequence(names: Iterable[str], suffix: str = CHANNEL_SUFFIX) -> int:
    """The sequence number a writer opening the channel gives its first part: one after the highest part among
    ``names`` (an earlier attempt's, for a requeued array task re-using the channel), 1 for none."""
    return max((s for s in (part_sequence(n, suffix) for n in names) if s is not None), default=0) + 1
