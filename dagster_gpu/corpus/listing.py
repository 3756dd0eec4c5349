"""List corpus files under a URL (local directory or ``s3://bucket/prefix``) through fsspec."""

from __future__ import annotations

import fnmatch
import posixpath
import time
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Mapping, Sequence

import fsspec
from fsspec.core import strip_protocol

from dagster_gpu.core.partition_keys import partition_key_for
from dagster_gpu.corpus.bucket_spill import by_bucket
from dagster_gpu.corpus.group_plan_store import (
    STAT_THREADS,
    current_infos,
    default_group_plan_url,
    load_group_plans,
    store_group_plans,
)
from dagster_gpu.corpus.group_plans import Member, PlanSource
from dagster_gpu.corpus.groups import Group, bucket_of, group_key, group_version, parse_group_key, validate_buckets
from dagster_gpu.corpus.incremental import ListingReport, grouped_listing, state_path
from dagster_gpu.corpus.plan_dir import PlanDir
from dagster_gpu.corpus.readers import TextFormat
from dagster_gpu.corpus.shard_plans import default_plan_url, file_shards
from dagster_gpu.corpus.shards import Shard, could_be_shard_key, shard_key, shardable
from dagster_gpu.corpus.stream import fs_protocol, iter_entries, iter_entries_after

#: Our own temporary outputs, editor droppings and marker files (``_SUCCESS``) are never corpus files: a
#: name starting with ``.`` or ``_`` (a file's or any directory's on its path) is not listed.
_IGNORED_PREFIXES = (".", "_")
#: ``CorpusSource.shard_bytes``'s default: a file above 4 MiB is cut into shards of about 4 MiB. A shard is then
#: about 7.5 minutes of one CPU unit at the CPU rate the runtime model states without history (46.3 texts/s of
#: 200 bytes: 9.26 kB/s, ``FALLBACK_CPU_TEXTS_PER_SECOND`` and ``FALLBACK_BYTES_PER_ROW`` in
#: dagster_gpu/policy/runtime.py), so one file holds a CPU unit for minutes, not an hour; and about 10 s of a GPU
#: at its stated 2000 texts/s, against the 1.03 s a partition's own overhead costs (``per_partition_s`` in
#: dagster_gpu/data/unit_startup.json): under a tenth more on a GPU.
DEFAULT_SHARD_BYTES = 4 * 1024 * 1024
#: ``CorpusSource.shard_bytes`` = this (the default): :data:`DEFAULT_SHARD_BYTES`, or None with ``group_buckets``.
SHARD_BYTES_DEFAULT = "default"


@dataclass(frozen=True)
class CorpusFile:
    """One corpus file = one partition, one shard of a large file = one partition (``shard`` set), or one bucket of
    many files = one partition (``group`` set, the files in ``members``).

    Attributes:
        key: partition key (see dagster_gpu.core.partition_keys).
        uri: full URL (``file:///…`` paths are given as plain absolute paths, ``s3://…`` otherwise).
        relative_name: path relative to the corpus root.
        size_bytes: size in bytes.
        mtime: last modification, seconds since the epoch (0.0 when the store does not say).
        version: the file's source version as the listing reports it (:func:`source_version`): changes
            whenever the file is rewritten; "" when not known.
        shard: for a shard of a file above ``CorpusSource.shard_bytes``, which records of the file it holds
            (:class:`dagster_gpu.corpus.shards.Shard`); ``size_bytes`` is then the shard's share of the file (its
            byte range, or its row groups' share); None for a whole file.
        file_key: for a shard, the whole file's own key (its rows' ``doc_id`` values are made from it); "" otherwise.
        file_bytes: for a shard, the whole file's size in bytes; 0 otherwise.
        group: for a bucket of ``CorpusSource.group_buckets``, which bucket (:class:`dagster_gpu.corpus.groups.Group`);
            None otherwise. A bucket's ``uri`` is the corpus root, ``relative_name`` its key, ``size_bytes`` the sum
            of its files', ``mtime`` the latest of theirs and ``version`` :func:`dagster_gpu.corpus.groups.group_version`
            of their versions.
        members: for a bucket, its files (each a whole-file CorpusFile with its own key and source version), sorted
            by key; () otherwise, and () for a bucket of a listing that keeps no members
            (``list_files(members=False)``).
        file_count: for a bucket, how many files it holds (``len(members)`` when they are kept); 0 otherwise.
    """

    key: str
    uri: str
    relative_name: str
    size_bytes: int
    mtime: float = 0.0
    version: str = ""
    shard: Shard | None = None
    file_key: str = ""
    file_bytes: int = 0
    group: Group | None = None
    members: tuple["CorpusFile", ...] = ()
    file_count: int = 0

    @property
    def doc_key(self) -> str:
        """The key ids are made from: the whole file's key (a shard's ``file_key``, else ``key``)."""
        return self.file_key or self.key

    @property
    def member_versions(self) -> dict[str, str]:
        """A bucket's ``{file key: source version}`` ({} for a file or a shard)."""
        return {m.key: m.version for m in self.members}


class CorpusNotFound(FileNotFoundError):
    """The corpus URL does not exist, or a partition key has no file; the message names both."""


class CorpusUnreadable(OSError):
    """The corpus store answered a listing with an error (credentials, permissions, an unreachable
    endpoint); the message names the corpus URL and the store's error, which is chained."""


@dataclass(frozen=True)
class CorpusSource:
    """Where a corpus lives and how to read it.

    Attributes:
        url: local directory or ``s3://bucket/prefix``.
        pattern: shell glob on file names (``*``, ``*.parquet``).
        recursive: include files in sub-directories (their keys join path parts with ``__``).
        text_format: how records are read (see :class:`TextFormat`).
        storage_options: passed to fsspec (e.g. ``{"client_kwargs": {"endpoint_url": …}}`` for S3);
            never put secrets here, use the provider's credential chain.
        shard_bytes: a file larger than this many bytes is listed as several partitions, one per shard of
            about this size (parquet: ranges of whole row groups; JSON Lines and text: byte ranges cut just
            after a record, :mod:`dagster_gpu.corpus.shards`), keyed by
            :func:`dagster_gpu.corpus.shards.shard_key` from the file's key and source version, so that
            different work units embed one file side by side. A compressed text file, a parquet file of one
            row group and a file that cannot be cut are listed whole. ``"default"`` (the default):
            :data:`DEFAULT_SHARD_BYTES` (4 MiB, the source of the number is there), or None with
            ``group_buckets``; None: every file is one partition.
        shard_plan_url: where shard plans are cached (a directory or an fsspec URL, read and written with
            ``storage_options``), see :mod:`dagster_gpu.corpus.shard_plans`; None = ``$DAGSTER_HOME/dagster_gpu/
            shard_plans`` when ``DAGSTER_HOME`` is set, else this process only.
        group_buckets: file groups: every file goes to one of this many buckets by a stable hash of its path
            (:mod:`dagster_gpu.corpus.groups`) and each non-empty bucket is one partition, keyed
            ``group-0042-of-1024``, for corpora of many small files (one JSON document per file). A new file never
            moves another; a bucket is stale when one of its files changed, came or went. Changing the number
            re-keys every file. None (default): every file is one partition.
        group_plan_url: with ``group_buckets``, where each bucket's member list is kept by whoever lists the whole
            corpus, so that a work unit resolves its bucket keys with one ``info`` call per member instead of a
            listing (a directory or an fsspec URL, read and written with ``storage_options``; see
            :mod:`dagster_gpu.corpus.group_plan_store`); None = ``$DAGSTER_HOME/dagster_gpu/group_plans`` when
            ``DAGSTER_HOME`` is set, else no plans (every unit lists). Put it where the units can read it (an
            ``s3://`` prefix for pods without the run worker's disk). Plans no longer current are deleted by the
            listings after a grace period.
        group_plan_max_age_seconds: a unit ignores a bucket's plan when the listing that last saw the bucket started
            longer ago than this and lists the corpus instead (default 86400: a day; None: any age). Listings
            refresh an unchanged bucket's pointer at half this age, so while the corpus sensor runs, plans stay
            usable.
        full_listing_interval_seconds: with ``group_buckets`` on a local directory, make the listings without members
            (the corpus sensor's tick, ``list_files(members=False)``) incremental (:mod:`dagster_gpu.corpus.incremental`):
            a snapshot of the last listing is kept under ``$DAGSTER_HOME/dagster_gpu/listing_state/``, and a listing
            reads again only the directories whose mtime changed since, unless the last full listing started this
            many seconds ago or more (then it lists everything). The guarantee: a file created, deleted or renamed
            into place (atomic writers, ``mv``, most tools) is seen by the next listing, exactly as a full listing
            sees it; a file **rewritten in place** (``>>`` append, ``truncate``: its directory's mtime does not move)
            is seen by the first full listing after it, at most this many seconds later. None (default): every
            listing is full. Without ``DAGSTER_HOME``, or with a snapshot that cannot be read, listings are full.
            At most half of ``group_plan_max_age_seconds`` (an incremental listing stores plans only for the buckets
            that changed; the full listings keep the others' plans within their maximum age). On S3 only with
            ``append_only_keys``.
        append_only_keys: with ``full_listing_interval_seconds`` on S3: the corpus's keys only grow in order (every
            new object's key sorts after every key already there, e.g. date-prefixed drops), so an incremental
            listing lists only the keys after the last one seen (``ListObjectsV2`` ``StartAfter``). The guarantee: a
            new object whose key sorts after every earlier one is seen by the next listing; a new key that sorts
            earlier, an object overwritten or deleted, is seen by the first full listing after it, at most
            ``full_listing_interval_seconds`` later. A version-aware filesystem is always listed in full.

    Raises:
        ValueError: ``pattern`` ends in a suffix read as text (``*.txt``) while ``text_format`` has
            ``id_column`` / ``carry_columns``; ``shard_bytes`` below 1, ``group_buckets`` not an integer >= 1, or both set (a bucket of whole
            files and a file cut into shards are opposite mappings: choose one per corpus),
            ``group_plan_max_age_seconds`` not above 0, ``full_listing_interval_seconds`` set without
            ``group_buckets``, on a corpus that is neither a local directory nor S3 with ``append_only_keys``, not
            above 0 or above half of ``group_plan_max_age_seconds``; ``append_only_keys`` without both S3 and
            ``full_listing_interval_seconds``.
    """

    url: str
    pattern: str = "*"
    recursive: bool = False
    text_format: TextFormat = field(default_factory=TextFormat)
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    shard_bytes: int | str | None = SHARD_BYTES_DEFAULT
    shard_plan_url: str | None = None
    group_buckets: int | None = None
    group_plan_url: str | None = None
    group_plan_max_age_seconds: float | None = 86400.0
    full_listing_interval_seconds: float | None = None
    append_only_keys: bool = False

    def __post_init__(self) -> None:
        name = self.pattern.rsplit("/", 1)[-1]
        suffix = name.rsplit(".", 1)[-1] if "." in name else None
        if suffix is not None and not set("*?[") & set(suffix) and self.text_format.columnless([name]):
            raise ValueError(f"CorpusSource({self.url!r}): pattern {self.pattern!r} matches text files (by their suffix), "
                             f"which have no columns: id_column / carry_columns need parquet or JSON Lines files "
                             f"(a pattern such as '*.jsonl', or TextFormat(format='jsonl'))")
        if self.group_plan_max_age_seconds is not None and not float(self.group_plan_max_age_seconds) > 0:
            raise ValueError(f"CorpusSource({self.url!r}).group_plan_max_age_seconds must be > 0 (or None), "
                             f"got {self.group_plan_max_age_seconds}")
        if isinstance(self.shard_bytes, str):
            if self.shard_bytes != SHARD_BYTES_DEFAULT:
                raise ValueError(f"CorpusSource({self.url!r}).shard_bytes must be an integer >= 1, None (no shards) "
                                 f"or {SHARD_BYTES_DEFAULT!r}, got {self.shard_bytes!r}")
            object.__setattr__(self, "shard_bytes", None if self.group_buckets is not None else DEFAULT_SHARD_BYTES)
        if self.shard_bytes is not None and int(self.shard_bytes) < 1:
            raise ValueError(f"CorpusSource({self.url!r}).shard_bytes must be >= 1 (or None), got {self.shard_bytes}")
        if self.group_buckets is not None:
            try:
                validate_buckets(self.group_buckets)
            except ValueError as e:
                raise ValueError(f"CorpusSource({self.url!r}): {e}") from None
            if self.shard_bytes is not None:
                raise ValueError(
                    f"CorpusSource({self.url!r}): group_buckets and shard_bytes cannot both be set: file groups put many "
                    "small files in one partition, shards cut one large file into several; choose one per corpus "
                    "(two CorpusSources with patterns that split the files work)")
        if self.full_listing_interval_seconds is not None:
            self._check_full_listing_interval()
        if self.append_only_keys and (self.full_listing_interval_seconds is None or fsspec.utils.infer_storage_options(
                self.url).get("protocol") not in ("s3", "s3a")):
            raise ValueError(f"CorpusSource({self.url!r}).append_only_keys applies to an S3 corpus with "
                             "full_listing_interval_seconds set")

    def _check_full_listing_interval(self) -> None:
        """Raises ValueError naming the corpus unless ``full_listing_interval_seconds`` can be used (see the class)."""
        s, age = self.full_listing_interval_seconds, self.group_plan_max_age_seconds
        what = f"CorpusSource({self.url!r}).full_listing_interval_seconds={s!r}"
        if self.group_buckets is None:
            raise ValueError(f"{what} needs group_buckets: only a file-grouped corpus is listed incrementally")
        protocol = fsspec.utils.infer_storage_options(self.url).get("protocol")
        if protocol in ("s3", "s3a") and not self.append_only_keys:
            raise ValueError(f"{what}: an S3 corpus is listed incrementally only with append_only_keys=True (its new "
                             "keys sort after every key already there)")
        if protocol not in ("file", "local", "s3", "s3a"):
            raise ValueError(f"{what}: only a local directory (by its directories' mtimes) or an S3 prefix with "
                             "append_only_keys=True is listed incrementally")
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not float(s) > 0:
            raise ValueError(f"{what} must be a number of seconds > 0 (or None)")
        if age is not None and float(s) > float(age) / 2:
            raise ValueError(f"{what} must be at most half of group_plan_max_age_seconds ({float(age):g}): the full "
                             "listings keep the plans of unchanged buckets younger than their maximum age")

    def filesystem(self):
        """(fsspec filesystem, root path without protocol)."""
        fs, root = fsspec.core.url_to_fs(self.url, **dict(self.storage_options))
        return fs, root.rstrip("/")

    def list_files(self, members: bool = True) -> list[CorpusFile]:
        """All corpus files, sorted by key; a file above ``shard_bytes`` as its shards (see :meth:`shards_of`); with
        ``group_buckets``, the non-empty buckets instead (see :meth:`groups_of`), each bucket's member list then
        stored in the group plan directory (``group_plan_url``) for the work units. With ``group_buckets`` and
        ``members=False``, the listing streams (:mod:`dagster_gpu.corpus.bucket_spill`: memory for the buckets, not
        for every file) and the buckets come without their ``members`` (``file_count`` says how many; the plans
        hold them); with ``full_listing_interval_seconds`` too, it is incremental when it can be (:meth:`list_buckets`,
        which also says what the listing did). Raises CorpusNotFound if the URL does not exist, CorpusUnreadable when
        the store answers with an error."""
        if self.group_buckets is not None and not members:
            return self.list_buckets()[0]
        started = time.time()
        files = self._list(None)
        if self.group_buckets is None:
            return files
        groups = self.groups_of(files)
        self._store_group_plans(groups, started)
        return groups

    def list_buckets(self):
        """``list_files(members=False)`` of a file-grouped corpus, with what the listing did: ``(buckets sorted by key,
        without members, each with its file_count; a`` :class:`dagster_gpu.corpus.incremental.ListingReport` ``)``.
        Incremental when ``full_listing_interval_seconds`` allows (see the class), else the streamed full listing
        (:meth:`_stream_groups`). Raises ValueError without ``group_buckets``, CorpusNotFound if the URL does not
        exist, CorpusUnreadable when the store answers with an error."""

        if self.group_buckets is None:
            raise ValueError(f"CorpusSource({self.url!r}) has no group_buckets")
        started, t0 = time.time(), time.perf_counter()
        path, why = ((None, "full_listing_interval_seconds not set") if self.full_listing_interval_seconds is None
                     else state_path(self._identity().digest))
        if path is not None and self.append_only_keys and getattr(self.filesystem()[0], "version_aware", False):
            path, why = None, "a version-aware S3 filesystem is listed in full"
        if path is not None:
            try:
                return self._incremental_groups(path, started)
            except UnicodeEncodeError as e:  # a file name that is not UTF-8 (a surrogate escape) cannot go to SQLite
                why = f"no snapshot: a file name is not UTF-8 ({e.reason})"
        groups = self._stream_groups(started)
        return groups, ListingReport("full", why, seconds=round(time.perf_counter() - t0, 3),
                                     files=sum(g.file_count for g in groups), buckets=len(groups),
                                     buckets_assembled=len(groups))

    def _identity(self):
        """This corpus's :class:`dagster_gpu.corpus.group_plans.PlanSource` (what its buckets' membership depends on)."""

        return PlanSource(self.url, self.pattern, self.recursive, int(self.group_buckets))

    def _incremental_groups(self, path: str, started: float):
        """:meth:`list_buckets` through the snapshot at ``path`` (:func:`dagster_gpu.corpus.incremental.grouped_listing`).
        Raises UnicodeEncodeError for a file name SQLite cannot store (not UTF-8: the caller lists without a snapshot)."""

        n = int(self.group_buckets)

        def on_buckets(grouped):
            groups = self._assembled(grouped, started)
            return {g.group.index: (g.version, g.file_count, g.size_bytes, g.mtime) for g in groups}

        try:
            fs, root = self.filesystem()
            if not fs.exists(root):
                raise CorpusNotFound(f"corpus {self.url!r} does not exist")
            entry = lambda p, info: (None if (f := self.entry_file(fs, root, p, info)) is None  # noqa: E731
                                     else (f.key, f.uri, f.relative_name, f.size_bytes, f.mtime, f.version))
            rows, report = grouped_listing(fs, root, recursive=self.recursive, source=self._identity().fields, path=path,
                                           interval_s=float(self.full_listing_interval_seconds), entry_row=entry,
                                           bucket_of=lambda rel: bucket_of(rel, n), on_buckets=on_buckets,
                                           entries_after=partial(_s3_entries_after, fs, root, self.recursive)
                                           if self.append_only_keys else None)
        except (CorpusNotFound, UnicodeEncodeError):
            raise
        except Exception as e:  # noqa: BLE001 - as in _list
            raise _unreadable(f"corpus {self.url!r} cannot be listed", e) from e
        return [self._summary(i, version, count, size, mtime) for i, version, count, size, mtime in rows], report

    def _assembled(self, grouped: Mapping[int, Sequence[Sequence[Any]]], started: float) -> list[CorpusFile]:
        """``{bucket: [file row, ...]}`` (rows: CorpusFile's first six fields; one file per key, the later row kept) as
        buckets with their members, their plans stored as those of a listing started at ``started``."""
        groups = [self._bucket(b, list({r[0]: CorpusFile(*r) for r in rs}.values())) for b, rs in grouped.items()]
        self._store_group_plans(groups, started)
        return groups

    def _stream_groups(self, started: float) -> list[CorpusFile]:
        """:meth:`list_files` of a file-grouped corpus without members, in bounded memory: the entries stream
        (:func:`dagster_gpu.corpus.stream.iter_entries`), the files spill to disk by bucket
        (:func:`dagster_gpu.corpus.bucket_spill.by_bucket`), and each spill file's buckets are assembled (one file per
        key, the later entry kept, as :meth:`_list` keeps it), their plans stored, then kept without members."""

        n = int(self.group_buckets)
        out: list[CorpusFile] = []
        try:
            fs, root = self.filesystem()
            if not fs.exists(root):
                raise CorpusNotFound(f"corpus {self.url!r} does not exist")
            files = (f for path, info in iter_entries(fs, root, self.recursive)
                     if (f := self.entry_file(fs, root, path, info)) is not None)
            rows = ((bucket_of(f.relative_name, n), [f.key, f.uri, f.relative_name, f.size_bytes, f.mtime, f.version])
                    for f in files)
            for grouped in by_bucket(rows, n):
                out += [replace(g, members=()) for g in self._assembled(grouped, started)]
        except CorpusNotFound:
            raise
        except Exception as e:  # noqa: BLE001 - as in _list
            raise _unreadable(f"corpus {self.url!r} cannot be listed", e) from e
        return sorted(out, key=lambda g: g.key)

    def groups_of(self, files: Sequence[CorpusFile]) -> list[CorpusFile]:
        """``files`` (whole files) as the non-empty buckets of ``group_buckets``, sorted by key, each with its files
        as ``members`` (sorted by key). Stores no plan (``files`` may be part of the corpus only: :meth:`list_files`
        stores them). Raises ValueError when ``group_buckets`` is not set."""
        if self.group_buckets is None:
            raise ValueError(f"CorpusSource({self.url!r}) has no group_buckets")
        n = int(self.group_buckets)
        buckets: dict[int, list[CorpusFile]] = {}
        for f in files:
            buckets.setdefault(bucket_of(f.relative_name, n), []).append(f)
        return [self._bucket(i, buckets[i]) for i in sorted(buckets)]

    def _bucket(self, index: int, files: Sequence[CorpusFile]) -> CorpusFile:
        """Bucket ``index`` holding ``files`` (at least one) as one CorpusFile (see :attr:`CorpusFile.group`)."""
        members = tuple(sorted(files, key=lambda f: f.key))
        return replace(self._summary(index, group_version({m.key: m.version for m in members}), len(members),
                                     sum(m.size_bytes for m in members), max(m.mtime for m in members)), members=members)

    def _summary(self, index: int, version: str, file_count: int, size_bytes: int, mtime: float) -> CorpusFile:
        """Bucket ``index`` as one CorpusFile without members (see :attr:`CorpusFile.group`)."""
        n = int(self.group_buckets)
        key = group_key(index, n)
        return CorpusFile(key=key, uri=self.url.rstrip("/") or self.url, relative_name=key, size_bytes=int(size_bytes),
                          mtime=float(mtime), version=version, group=Group(index, n), file_count=int(file_count))

    def _plan_source(self):
        """(plan directory, its PlanSource) of this corpus's file group plans, or None without a directory."""

        url = self.group_plan_url or default_group_plan_url()
        if not url:
            return None
        return PlanDir(url, self.storage_options), self._identity()

    def _store_group_plans(self, groups: Sequence[CorpusFile], listed_at: float) -> None:
        """Each of ``groups`` (the buckets of a full listing started at ``listed_at``, seconds since the epoch) as its
        stored plan (best effort)."""

        where = self._plan_source()
        if where is None:
            return
        age = self.group_plan_max_age_seconds
        store_group_plans(*where, {g.group.index: (g.version, partial(_members, g)) for g in groups}, listed_at,
                          refresh_s=None if age is None else float(age) / 2)

    def _groups_from_plans(self, indexes: Sequence[int]) -> dict[int, CorpusFile]:
        """Bucket index -> the bucket from its stored plan, for each of ``indexes`` whose plan is readable and
        whose every member still has the version listed (one ``info`` call per member); the others are left
        out (the caller lists them). Never raises for the plans or the members' stores."""

        where = self._plan_source()
        if where is None or not indexes:
            return {}
        age = self.group_plan_max_age_seconds
        planned = load_group_plans(*where, indexes, max_age_s=None if age is None else float(age))
        if not planned:
            return {}
        try:
            fs, _root = self.filesystem()
        except Exception:  # noqa: BLE001 - the listing names the store's error
            return {}
        protocol = fs_protocol(fs)
        infos = current_infos(fs, [m.path for ms in planned.values() for m in ms],
                              1 if protocol in ("file", "local") else STAT_THREADS)
        return {index: self._bucket(index, [CorpusFile(key=m.key, uri=_uri(fs, m.path), relative_name=m.relative_name,
                                                       size_bytes=m.size_bytes, mtime=m.mtime, version=m.version)
                                            for m in members])
                for index, members in planned.items()
                if all(_unchanged(m.version, infos.get(m.path)) for m in members)}

    def _list(self, wanted: set[str] | None) -> list[CorpusFile]:
        """The listing; with ``wanted``, a large file is planned only when one of those keys can be its shard's
        (the others are left out of the result: a worker resolving its keys plans only its own files)."""
        try:
            fs, root = self.filesystem()
            if not fs.exists(root):
                raise CorpusNotFound(f"corpus {self.url!r} does not exist")
            entries = fs.find(root, maxdepth=None if self.recursive else 1, detail=True, withdirs=False)
        except CorpusNotFound:
            raise
        except Exception as e:  # noqa: BLE001 - botocore/aiohttp errors are not OSErrors: name the corpus for all
            raise _unreadable(f"corpus {self.url!r} cannot be listed", e) from e
        out: dict[str, CorpusFile] = {}
        for path, info in entries.items():
            f = self.entry_file(fs, root, path, info)
            if f is not None:
                out[f.key] = f
        listed: dict[str, CorpusFile] = {}
        for k in sorted(out):
            f = out[k]
            if (self._cut(f) and wanted is not None and f.key not in wanted
                    and not any(could_be_shard_key(w, f.key, f.version) for w in wanted)):
                continue
            for s in self.shards_of(f, fs):
                listed[s.key] = s
        return [listed[k] for k in sorted(listed)]

    def entry_file(self, fs, root: str, path: str, info: Mapping[str, Any]) -> CorpusFile | None:
        """The corpus file behind one listing entry (``path`` and its fsspec ``info``, under ``root``), or None when
        it is not one: not a file (a symbolic link counts as the file it points to; a broken one is none), under a
        name starting with ``.`` or ``_`` (:data:`_IGNORED_PREFIXES`), or not matching ``pattern``."""
        if info.get("type") != "file" and info.get("islink"):
            info = _followed(fs, path)
        if info.get("type") != "file":
            return None
        rel = posixpath.relpath(path, root)
        if any(part.startswith(_IGNORED_PREFIXES) for part in rel.split("/")):
            return None
        if not fnmatch.fnmatchcase(posixpath.basename(rel), self.pattern):
            return None
        key = partition_key_for(rel)
        return _file(fs, path, key, rel, info)

    def _cut(self, f: CorpusFile) -> bool:
        """Whether ``f`` is above ``shard_bytes`` and of a kind that can be cut (its plan may still be one shard)."""
        return (self.shard_bytes is not None and f.size_bytes > int(self.shard_bytes) and f.version != ""
                and shardable(f.uri, self.text_format.resolved(f.uri), self.text_format.encoding))

    def shards_of(self, f: CorpusFile, fs=None) -> list[CorpusFile]:
        """``f`` as its partitions: ``[f]`` when it is not above ``shard_bytes`` (or cannot be cut, or its plan is
        one shard), else one CorpusFile per shard (:mod:`dagster_gpu.corpus.shard_plans`: the plan of this source
        version, read or made once). Raises CorpusUnreadable naming the file when it cannot be read to plan."""
        if not self._cut(f):
            return [f]

        if fs is None:
            fs, _root = self.filesystem()
        kind = self.text_format.resolved(f.uri)
        try:
            shards = file_shards(fs, strip_protocol(f.uri), f.uri, f.size_bytes, f.version, int(self.shard_bytes),
                                 kind=kind, separator_line=self.text_format.record_separator_line,
                                 encoding=self.text_format.encoding,
                                 plan_url=self.shard_plan_url or default_plan_url(),
                                 plan_storage_options=self.storage_options)
        except FileNotFoundError:
            return []  # gone since the listing: as if not listed
        except Exception as e:  # noqa: BLE001 - a parquet footer pyarrow cannot read: listed whole, its read names the error
            if kind == "parquet" and not isinstance(e, OSError):
                return [f]
            raise _unreadable(f"partition {f.key!r}: file {f.uri!r} cannot be read to plan its shards", e) from e
        if len(shards) < 2:
            return [f]
        return [CorpusFile(key=shard_key(f.key, f.version, s), uri=f.uri, relative_name=f.relative_name,
                           size_bytes=(s.end - s.start) if s.unit == "bytes" else _share(shards, s, f.size_bytes),
                           mtime=f.mtime, version=f.version, shard=s, file_key=f.key, file_bytes=f.size_bytes)
                for s in shards]

    def file_for_key(self, key: str) -> CorpusFile:
        """The file behind partition ``key``. Raises CorpusNotFound naming the key and the corpus."""
        return self.files_for_keys([key])[key]

    def files_for_keys(
        self, keys: Sequence[str], *, max_direct_lookups: int = 32, missing_ok: bool = False
    ) -> dict[str, CorpusFile]:
        """The files behind partition ``keys`` (key -> CorpusFile), without listing the corpus per key.

        A key that was not rewritten from its file name (see :func:`dagster_gpu.core.partition_keys.partition_key_for`)
        names its file directly: up to ``max_direct_lookups`` such keys are resolved with one ``info`` call
        each. Any other key (a rewritten or recursive name, a missing file), or a longer list, costs one
        listing of the corpus for the whole call, never one per key. Raises CorpusNotFound naming every key
        without a file, and the corpus (with ``missing_ok``, such keys are left out of the result instead),
        CorpusUnreadable when the store answers with an error.
        """
        wanted = list(dict.fromkeys(keys))
        if self.group_buckets is not None:
            return self._groups_for_keys(wanted, missing_ok)
        found: dict[str, CorpusFile] = {}
        if len(wanted) <= max_direct_lookups:
            fs, root = self.filesystem()
            for key in wanted:
                f = self._direct(fs, root, key)
                if f is not None:
                    found[key] = f
        missing = [k for k in wanted if k not in found]
        if missing:
            listed = {f.key: f for f in self._list(set(missing))}
            for k in missing:
                if k in listed:
                    found[k] = listed[k]
            gone = [k for k in missing if k not in found]
            if gone and not missing_ok:
                raise CorpusNotFound(
                    f"partition(s) {', '.join(repr(k) for k in gone)}: no file in corpus {self.url!r} has this key "
                    "(deleted or renamed?)"
                )
        return {k: found[k] for k in wanted if k in found}

    def _groups_for_keys(self, wanted: list[str], missing_ok: bool) -> dict[str, CorpusFile]:
        """:meth:`files_for_keys` of bucket keys: each bucket from its stored plan when every member still has the
        version listed (:meth:`_groups_from_plans`), the others from one listing, grouped."""
        n = int(self.group_buckets)
        groups = {k: g for k in wanted if (g := parse_group_key(k)) is not None and g.count == n}
        planned = self._groups_from_plans(sorted({g.index for g in groups.values()}))
        found = {k: planned[g.index] for k, g in groups.items() if g.index in planned}
        if len(found) < len(wanted):
            listed = {g.key: g for g in self.list_files()}
            found.update({k: listed[k] for k in wanted if k not in found and k in listed})
        gone = [k for k in wanted if k not in found]
        if gone and not missing_ok:
            why = ", ".join(repr(k) + ("" if k in groups else f" (not a key of group_buckets={n})") for k in gone)
            raise CorpusNotFound(f"partition(s) {why}: no file in corpus {self.url!r} falls in this bucket "
                                 "(its files deleted or renamed?)")
        return {k: found[k] for k in wanted if k in found}

    def _direct(self, fs, root: str, key: str) -> CorpusFile | None:
        """The file named exactly ``key`` under the root, when ``key`` is its own file's key; else None."""
        if partition_key_for(key) != key or key.startswith(_IGNORED_PREFIXES) or not fnmatch.fnmatchcase(key, self.pattern):
            return None
        path = posixpath.join(root, key)
        try:
            info = fs.info(path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except Exception as e:  # noqa: BLE001 - as in list_files
            raise _unreadable(f"corpus {self.url!r} cannot be read", e) from e
        if info.get("type") != "file":
            return None
        f = _file(fs, path, key, key, info)
        return None if self._cut(f) else f  # a file cut into shards is no partition of its own

    def current_version(self, file: CorpusFile) -> str:
        """``file``'s source version now (one ``info`` call: a stat, an S3 HEAD), read right before the file
        is read so that the version recorded is never newer than the bytes read. A bucket (``group`` set): its
        resolved version, no call (its files were listed, or each checked against the stored plan by an ``info``
        call, by the caller right before: see :func:`dagster_gpu.partitions.source_versions.version_at_read`).
        Raises CorpusNotFound naming the partition and the file when it is gone, CorpusUnreadable when the store refuses."""
        if file.group is not None:
            return file.version
        fs, _root = self.filesystem()
        path = strip_protocol(file.uri)
        try:
            fs.invalidate_cache(path)  # an object store's listing cache (s3fs) would answer with the listed version
            return source_version(fs.info(path))
        except FileNotFoundError as e:
            raise CorpusNotFound(f"partition {file.key!r}: file {file.uri!r} is gone") from e
        except Exception as e:  # noqa: BLE001 - as in list_files
            raise _unreadable(f"partition {file.key!r}: file {file.uri!r} cannot be read", e) from e


def _s3_entries_after(fs, root: str, recursive: bool, after: str | None):
    """``(S3 key, path, info)`` of the objects under ``root``, all of them (``after`` None) or those whose key sorts
    after ``after`` (:mod:`dagster_gpu.corpus.stream`)."""

    entries = iter_entries(fs, root, recursive) if after is None else iter_entries_after(fs, root, recursive, after)
    return ((p.split("/", 1)[1], p, info) for p, info in entries)


def _share(shards, s: Shard, file_bytes: int) -> int:
    """A row-group shard's bytes: the file's bytes shared by records (the plan's sizes are scaled to the file)."""
    total = sum(x.records or 0 for x in shards) or 1
    return int(file_bytes * (s.records or 0) // total)


def source_version(info: Mapping[str, Any]) -> str:
    """A file's version from its fsspec ``info``/listing entry (pure).

    ``versionid:<id>`` when the store reports an object version (S3 ``VersionId``, listed by a
    ``version_aware`` s3fs on a versioned bucket; GCS ``generation``), else ``etag:<etag>`` (S3 ``ETag`` without
    its quotes: the MD5 of a single-part upload, so rewriting identical bytes keeps it; GCS/Azure ``etag``),
    else ``size:<bytes>,mtime:<seconds>`` (a local or other file system's stat). Two versions of one file are
    equal exactly when these strings are.
    """
    for key, prefix in (("VersionId", "versionid"), ("generation", "versionid"), ("ETag", "etag"), ("etag", "etag")):
        v = info.get(key)
        if v not in (None, "", "null"):
            return f"{prefix}:{str(v).strip(chr(34))}"
    return f"size:{int(info.get('size') or 0)},mtime:{_mtime(info)!r}"


def _unchanged(listed: str, info: Mapping[str, Any] | None) -> bool:
    """Whether a file listed at source version ``listed`` still has it by its ``info`` now (None: gone). An S3 HEAD
    names a ``VersionId`` that a listing does not: a listed ``etag:`` version is then compared with the ETag."""
    if info is None:
        return False
    if source_version(info) == listed:
        return True
    etag = info.get("ETag") or info.get("etag")
    return listed.startswith("etag:") and etag not in (None, "") and f"etag:{str(etag).strip(chr(34))}" == listed


def _file(fs, path: str, key: str, rel: str, info: Mapping[str, Any]) -> CorpusFile:
    return CorpusFile(key=key, uri=_uri(fs, path), relative_name=rel, size_bytes=int(info.get("size") or 0),
                      mtime=_mtime(info), version=source_version(info))


def _unreadable(what: str, e: Exception) -> CorpusUnreadable:
    """``what``, then the store's error type and first line."""
    first = (str(e).strip().splitlines() or [""])[0]
    return CorpusUnreadable(f"{what}: {type(e).__name__}: {first}")


def _followed(fs, path: str) -> dict:
    """``fs.info`` of what a symbolic link points to (fsspec's listing reports the link itself as ``other``;
    Debian's fortunes ``*.u8`` files are links); ``{}`` for a broken link."""
    try:
        return fs.info(path)
    except OSError:
        return {}


def _members(group: CorpusFile) -> list:
    """A bucket's files as its plan's members (:class:`dagster_gpu.corpus.group_plans.Member`)."""

    return [Member(m.key, _path_of(m.uri), m.relative_name, m.size_bytes, m.mtime, m.version) for m in group.members]


def _path_of(uri: str) -> str:
    """The filesystem path of a URI :func:`_uri` made (the inverse, without fsspec's lookup of the protocol)."""
    return uri.split("://", 1)[1] if "://" in uri else uri


def _uri(fs, path: str) -> str:
    """A plain path for local files, ``<protocol>://path`` otherwise."""
    protocol = fs_protocol(fs)
    return path if protocol in ("file", "local") else f"{protocol}://{path}"


def _mtime(info: Mapping[str, Any]) -> float:
    for k in ("mtime", "LastModified", "last_modified", "created"):
        v = info.get(k)
        if v is None:
            continue
        if hasattr(v, "timestamp"):
            return float(v.timestamp())
        try:
            return float(v)
        except (TypeError, ValueError):
            continue
    return 0.0
