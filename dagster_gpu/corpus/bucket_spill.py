"""Rows grouped by bucket through spill files on disk, so that grouping a million rows never holds them at once.

A full listing of a file-grouped corpus (``CorpusSource(group_buckets=N)``, ``list_files(members=False)``) needs each
bucket's files together (for its group version and its plan) but not every bucket's at the same time. Holding every
file costs about 1.25 KB each (``bench/sensor_scale.py``: 365 MiB at 300,000 files). :func:`by_bucket` writes each
``(bucket, row)`` as one JSON line to one of ``shards`` spill files in a temporary directory, chosen by the bucket
(``bucket % shards``, so a bucket's rows are all in one file), then reads the files back one at a time and yields
each one's rows grouped by bucket.

Memory: one spill file's rows (``rows / shards``: 64 shards, ~16,000 rows of a million). Disk: the rows' JSON (about
150 bytes per corpus file), removed when the iteration ends, completes or not.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Iterable, Iterator

#: Spill files (at most one per bucket).
SPILL_SHARDS = 64


def by_bucket(rows: Iterable[tuple[int, list[Any]]], buckets: int,
              shards: int = SPILL_SHARDS) -> Iterator[dict[int, list[list[Any]]]]:
    """``rows`` (``(bucket, JSON-serializable list)``, bucket in ``0 … buckets − 1``) grouped by bucket: one dict
    ``{bucket: [row, …]}`` per spill file (``min(shards, buckets)`` of them), each bucket in exactly one dict, its
    rows in their order. ``rows`` is read to its end before the first dict. Raises what reading ``rows`` raises; the
    spill directory is removed either way."""
    shards = max(1, min(int(shards), int(buckets)))
    with tempfile.TemporaryDirectory(prefix="dagster-gpu-spill-") as tmp:
        paths = [os.path.join(tmp, f"{i:03d}.jsonl") for i in range(shards)]
        spills = [open(p, "w", encoding="utf-8", errors="surrogatepass") for p in paths]
        try:
            for bucket, row in rows:
                spills[bucket % shards].write(json.dumps([bucket, row]) + "\n")
        finally:
            for fh in spills:
                fh.close()
        for p in paths:
            grouped: dict[int, list[list[Any]]] = {}
            with open(p, encoding="utf-8", errors="surrogatepass") as fh:
                for line in fh:
                    bucket, row = json.loads(line)
                    grouped.setdefault(bucket, []).append(row)
            os.unlink(p)
            yield grouped
