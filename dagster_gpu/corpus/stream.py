"""A corpus root's listing as a stream of entries, so that a listing of a million objects is never held at once.

:func:`iter_entries` yields the same ``(path, fsspec info)`` pairs as ``fs.find(root, detail=True, withdirs=False)``
(``maxdepth`` 1 unless recursive), in pieces:

- **S3** (s3fs): page by page of ``ListObjectsV2`` (1,000 keys a page; ``ListObjectVersions`` on a version-aware
  filesystem), through s3fs's own ``_iterdir``, which fills each entry's info exactly as its ``find`` does
  (``_fill_info``: ``name``, ``size``, ``ETag``, ``LastModified``, ``type``). ``Delimiter`` is ``/`` when not recursive
  (the objects directly under the prefix), none when recursive (every object under it, in one flat listing, as
  s3fs's ``find`` lists).
- **any other store** (a local directory): directory by directory, through ``fs.walk(detail=True)``, which is what
  fsspec's own ``find`` iterates: at most one directory's entries are held.

The stream holds at most ``page_items`` entries (S3) or one directory's (other stores); what the caller keeps of them
is up to it (:meth:`dagster_gpu.corpus.listing.CorpusSource.list_files` with ``members=False`` keeps the buckets only).
"""

from __future__ import annotations

from typing import Any, Iterator

#: Entries fetched per call into s3fs's event loop (ListObjectsV2 returns up to 1,000 keys a page).
PAGE_ITEMS = 1000


def fs_protocol(fs) -> str:
    """An fsspec filesystem's protocol name (its first one when it has several: ``("file", "local")`` -> ``"file"``)."""
    return fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]


def iter_entries(fs, root: str, recursive: bool, page_items: int = PAGE_ITEMS) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(path, info)`` of every file under ``root`` (a path without protocol), directly under it unless
    ``recursive``, in the store's order. Raises what the store raises (the caller names the corpus)."""
    protocol = fs_protocol(fs)
    if protocol in ("s3", "s3a") and hasattr(fs, "_iterdir"):
        yield from _s3_entries(fs, root, recursive, page_items)
        return
    for _dir, _dirs, files in fs.walk(root, maxdepth=None if recursive else 1, detail=True):
        for info in files.values():
            yield info["name"], info


def iter_entries_after(fs, root: str, recursive: bool, start_after: str,
                       page_items: int = PAGE_ITEMS) -> Iterator[tuple[str, dict[str, Any]]]:
    """Like :func:`iter_entries` on S3 (s3fs), but only the objects whose key sorts after ``start_after`` (an S3 key,
    without the bucket): ``ListObjectsV2`` with ``StartAfter``, which s3fs's ``_iterdir`` does not pass, through its
    ``_list_pages`` (each page one ``_call_s3``, retried as s3fs retries), each entry's info filled as ``_iterdir``
    fills it. Keys sort by their UTF-8 bytes (S3's order). Raises ValueError for another store or a version-aware
    filesystem (``ListObjectVersions`` has no ``StartAfter``), else what the store raises."""
    protocol = fs_protocol(fs)
    if protocol not in ("s3", "s3a") or not hasattr(fs, "_list_pages") or getattr(fs, "version_aware", False):
        raise ValueError(f"listing after a key needs a plain (not version-aware) s3fs filesystem, got {protocol!r}")
    yield from _s3_entries(fs, root, recursive, page_items, start_after)


async def _objects_after(fs, bucket: str, prefix: str, delimiter: str, start_after: str):
    """The objects of ``ListObjectsV2`` pages from ``StartAfter=start_after``, as ``_iterdir`` yields files."""
    async for page in fs._list_pages("list_objects_v2", Bucket=bucket, Prefix=prefix, Delimiter=delimiter,
                                     StartAfter=start_after, **fs.req_kw):
        for c in page.get("Contents", []):
            c["type"] = "file"
            fs._fill_info(c, bucket)
            yield c


def _s3_entries(fs, root: str, recursive: bool, page_items: int,
                start_after: str | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """The objects under ``root`` from s3fs's ``_iterdir`` (from :func:`_objects_after` with ``start_after``),
    ``page_items`` per trip into its event loop."""
    from fsspec.asyn import sync

    bucket, key, _version = fs.split_path(root)
    prefix = key.strip("/") + "/" if key.strip("/") else ""
    delimiter = "" if recursive else "/"
    pages = (fs._iterdir(bucket, delimiter=delimiter, prefix=prefix) if start_after is None
             else _objects_after(fs, bucket, prefix, delimiter, start_after))

    async def take() -> tuple[list[dict], bool]:
        out: list[dict] = []
        while len(out) < page_items:
            try:
                out.append(await pages.__anext__())
            except StopAsyncIteration:
                return out, True
        return out, False

    try:
        done = False
        while not done:
            batch, done = sync(fs.loop, take)
            for info in batch:
                if info.get("type") == "file":
                    yield info["name"], info
    finally:
        sync(fs.loop, pages.aclose)
