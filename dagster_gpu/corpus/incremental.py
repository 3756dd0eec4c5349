"""Incremental listing of a file-grouped corpus: local directories whose mtime did not change are not read again,
S3 keys before the last one seen are not listed again.

With ``CorpusSource(group_buckets=N, full_listing_interval_seconds=S)`` on a local directory, a listing without
members (what the corpus sensor's tick lists) keeps a **snapshot** of what it saw in one SQLite file on the lister's
disk (:func:`state_path`: ``$DAGSTER_HOME/dagster_gpu/listing_state/<PlanSource digest>.sqlite``):

- ``dirs``: each directory read (path relative to the root, ``""`` for the root; its parent; its ``st_mtime_ns``
  taken right before it was read, or -1 when it must be read again);
- ``files``: each corpus file (key, uri, relative name, size in bytes, mtime in seconds, source version, its
  directory, its bucket);
- ``buckets``: each non-empty bucket (index, group version, file count, bytes, latest mtime);
- ``meta``: the format, the corpus (:class:`~dagster_gpu.corpus.group_plans.PlanSource` fields), when the
  last full listing started (seconds since the epoch) and, in key order mode, the greatest key listed.

:func:`grouped_listing` makes a **full** listing (every directory read, the snapshot rebuilt into a new file that
replaces the old one) when there is no snapshot, when it is unreadable, corrupt or of another corpus or format, or
when the last full listing started ``S`` seconds ago or more. Otherwise an **incremental** one: it stats every
directory of the snapshot; a directory whose ``st_mtime_ns`` equals the snapshot's keeps its files and its known
subdirectories, unread; a changed or new directory is stat'ed first, then read (``os.scandir`` through fsspec's
``ls``), so that an entry added while it is read moves the mtime again and is seen next time; its entries are
diffed with the snapshot (new, gone and changed files; new subdirectories read in turn, gone ones dropped with
everything under them). Only the buckets holding a file of the diff are assembled again (their members from the
snapshot with the diff applied), and the snapshot changes in one transaction. Memory: the directories' rows and the
buckets' rows, one changed directory's entries and one touched bucket's members; files are never all loaded.

What this relies on (POSIX, ``<sys/stat.h>`` and the ``open``/``link``/``unlink``/``rename``/``mkdir``/``rmdir``
pages of The Open Group Base Specifications Issue 7, "Upon successful completion, ... shall mark for update the
last data modification and last file status change timestamps of the parent directory"): creating, removing or
renaming an entry in a directory updates that directory's mtime (Linux's inode(7): the last modification
timestamp of a directory "is changed by the creation or deletion of files in that directory"); **writing to a file
does not** (``write`` marks
only the file's own timestamps). So:

- a file written to a temporary name and renamed over its final name (atomic writers, most tools, ``rsync``,
  ``cp`` to a new name), a new file, a deleted file, a new or removed subdirectory: seen at the next tick;
- a file **rewritten in place** (the same directory entry: ``>>`` append, ``open(..., "r+")``, ``truncate``) and a
  file behind a symbolic link that changes: seen at the next full listing, at most ``S`` seconds later.

Plans: an incremental listing stores the plans of the buckets it assembles only; the others keep the plans stored
when they last changed (refreshed by the full listings, hence ``S`` at most half of ``group_plan_max_age_seconds``).
A plan directory that is emptied or changed between full listings costs the units a listing each, until the next one.

**Key order mode** (an S3 prefix with ``CorpusSource.append_only_keys``, where there are no directory mtimes): the
snapshot also keeps the greatest key listed (``meta.last_key``), and an incremental listing lists only the keys
after it (``ListObjectsV2`` ``StartAfter``, :func:`dagster_gpu.corpus.stream.iter_entries_after`) and adds them. It
holds for corpora whose new keys sort after every key already there (date-prefixed drops); a new key that sorts
earlier, an object overwritten in place or deleted is seen at the next full listing, at most ``S`` seconds later.

A directory's mtime is only as fine as the kernel's timestamp clock (a few ms on Linux, coarser on some network
file systems), so an entry added in the same tick as the stat before a read could keep the mtime the read saw. A
directory whose mtime is less than :data:`RACY_S` seconds before its read began is therefore recorded as "read
again next time" (mtime -1), as git treats racily clean index entries.
"""

from __future__ import annotations

import json
import os
import posixpath
import sqlite3
import stat
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

#: The snapshot's format (any other is rebuilt by a full listing).
FORMAT = 1
#: A directory modified less than this many seconds before its read began is read again at the next listing.
RACY_S = 2.0
#: Buckets assembled and handed to ``on_buckets`` at once by a full listing.
BUCKETS_PER_BATCH = 64

#: One corpus file as a row: (key, uri, relative name, size in bytes, mtime in seconds, source version), the
#: positional fields of :class:`dagster_gpu.corpus.listing.CorpusFile`.
FileRow = tuple
#: One bucket's summary as a row: (index, group version, file count, size in bytes, latest mtime in seconds).
BucketRow = tuple

_SCHEMA = """
CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE dirs (path TEXT PRIMARY KEY, parent TEXT, mtime_ns INTEGER NOT NULL);
CREATE TABLE files (rel TEXT PRIMARY KEY, key TEXT NOT NULL, uri TEXT NOT NULL, size INTEGER NOT NULL,
                    mtime REAL NOT NULL, version TEXT NOT NULL, dir TEXT NOT NULL, bucket INTEGER NOT NULL);
CREATE TABLE buckets (bucket INTEGER PRIMARY KEY, version TEXT NOT NULL, file_count INTEGER NOT NULL,
                      size INTEGER NOT NULL, mtime REAL NOT NULL);
"""
_INDEXES = """
CREATE INDEX dirs_parent ON dirs (parent);
CREATE INDEX files_dir ON files (dir);
CREATE INDEX files_bucket ON files (bucket, key);
"""

#: The clock (seconds since the epoch); tests replace it.
_clock = time.time


@dataclass(frozen=True)
class ListingReport:
    """What one listing of a file-grouped corpus did.

    ``kind``: ``"full"`` or ``"incremental"``; ``why``: why a full listing ran (``"no snapshot"``, ``"last full
    listing 3700 s ago"``, ...; "" for an incremental one); ``seconds``: its wall time; ``dirs_checked``: directories
    stat'ed without being read; ``dirs_read``: directories read; ``files``: corpus files listed; ``added``,
    ``changed``, ``removed``: files of the diff (incremental only); ``buckets``: non-empty buckets;
    ``buckets_assembled``: buckets assembled (and their plans stored) by this listing; ``after_key``: in key order
    mode (S3), the key an incremental listing listed after (None otherwise)."""

    kind: str
    why: str = ""
    seconds: float = 0.0
    dirs_checked: int = 0
    dirs_read: int = 0
    files: int = 0
    added: int = 0
    changed: int = 0
    removed: int = 0
    buckets: int = 0
    buckets_assembled: int = 0
    after_key: str | None = None

    def describe(self) -> str:
        """One line for the tick log, e.g. ``incremental listing in 0.21 s: 300 directories checked, 1 read; 2
        file(s) added, 0 changed, 0 removed; 2 of 1024 bucket(s) assembled; 300000 file(s)``."""
        if self.kind == "incremental" and self.after_key is not None:
            return (f"incremental listing in {self.seconds:.2f} s: keys after {self.after_key!r}; {self.added} file(s) "
                    f"added, {self.changed} changed; {self.buckets_assembled} of {self.buckets} bucket(s) assembled; "
                    f"{self.files} file(s)")
        if self.kind == "incremental":
            return (f"incremental listing in {self.seconds:.2f} s: {self.dirs_checked} directories checked, "
                    f"{self.dirs_read} read; {self.added} file(s) added, {self.changed} changed, {self.removed} removed; "
                    f"{self.buckets_assembled} of {self.buckets} bucket(s) assembled; {self.files} file(s)")
        dirs = f"{self.dirs_read} directories read, " if self.dirs_read else ""
        return f"full listing in {self.seconds:.2f} s ({self.why}): {dirs}{self.files} file(s) in {self.buckets} bucket(s)"


def state_path(source_digest: str) -> tuple[str | None, str]:
    """(``$DAGSTER_HOME/dagster_gpu/listing_state/<source_digest>.sqlite``, "") with its directory created, or (None,
    why) when ``DAGSTER_HOME`` is unset or the directory cannot be created or written (every listing is then full)."""
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        return None, "no snapshot without DAGSTER_HOME"
    where = os.path.join(home, "dagster_gpu", "listing_state")
    try:
        os.makedirs(where, exist_ok=True)
    except OSError as e:
        return None, f"snapshot directory {where} cannot be created: {type(e).__name__}: {e}"
    if not os.access(where, os.W_OK | os.X_OK):
        return None, f"snapshot directory {where} cannot be written"
    return os.path.join(where, f"{source_digest}.sqlite"), ""


def grouped_listing(fs, root: str, *, recursive: bool, source: Sequence[Any], path: str, interval_s: float,
                    entry_row: Callable[[str, Mapping[str, Any]], FileRow | None], bucket_of: Callable[[str], int],
                    on_buckets: Callable[[Mapping[int, list[FileRow]]], Mapping[int, tuple]],
                    entries_after: Callable[[str | None], Iterable[tuple[str, str, Mapping[str, Any]]]] | None = None,
                    ) -> tuple[list[BucketRow], ListingReport]:
    """The non-empty buckets of the corpus under local directory ``root`` (sorted by index), full or incremental
    (see the module doc), with the snapshot at ``path`` (its directory created if missing).

    ``source``: the corpus's identity (JSON-serializable; a snapshot of another is rebuilt); ``interval_s``: seconds
    between full listings; ``entry_row(path, fsspec info)``: the corpus file of a directory entry, or None;
    ``bucket_of(relative name)``: its bucket; ``on_buckets({index: [FileRow, ...]})``: called with each bucket
    assembled (all of them in a full listing, in batches; the touched ones in an incremental one), members sorted
    by key, before the snapshot is committed: it stores their plans and returns each one's ``(group version, file
    count, size in bytes, latest mtime)``. ``entries_after``: for a store without directory mtimes whose keys only
    grow in order (S3), the **key order** mode: ``entries_after(None)`` gives every entry, ``entries_after(k)`` those
    whose key sorts after ``k``, each as ``(key, path, info)``; an incremental listing then lists only the keys after
    the last one seen (a new key that sorts earlier, an overwritten or deleted object: seen at the next full
    listing). Raises what reading the corpus or ``on_buckets`` raises (the snapshot is then left as it was); a
    snapshot that cannot be read or written is rebuilt, never raised."""
    t0 = time.perf_counter()
    started = _clock()
    why = _full_due(path, source, started, interval_s)
    if why is None:
        try:
            if entries_after is not None:
                rows, report = _incremental_after(path, entries_after, entry_row, bucket_of, on_buckets)
            else:
                rows, report = _incremental(fs, root, recursive, path, entry_row, bucket_of, on_buckets)
            return rows, _timed(report, t0)
        except sqlite3.Error as e:
            why = f"snapshot unusable: {type(e).__name__}: {e}"
    if entries_after is not None:
        fill = partial(_fill_keys, entries=entries_after(None), entry_row=entry_row, bucket_of=bucket_of)
    else:
        fill = partial(_fill_dirs, fs=fs, root=root, recursive=recursive, entry_row=entry_row, bucket_of=bucket_of)
    rows, report = _full(source, path, started, why, fill, on_buckets)
    return rows, _timed(report, t0)


def _timed(report: ListingReport, t0: float) -> ListingReport:
    from dataclasses import replace

    return replace(report, seconds=round(time.perf_counter() - t0, 3))


def _full_due(path: str, source: Sequence[Any], now: float, interval_s: float) -> str | None:
    """Why a full listing is due (a line), or None when the snapshot at ``path`` allows an incremental one."""
    if not os.path.exists(path):
        return "no snapshot"
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            meta = dict(con.execute("SELECT k, v FROM meta").fetchall())
        finally:
            con.close()
    except sqlite3.Error as e:
        return f"snapshot unreadable: {type(e).__name__}: {e}"
    if meta.get("format") != str(FORMAT) or meta.get("source") != json.dumps(list(source)):
        return "snapshot of another corpus or format"
    try:
        age = now - float(meta["full_started_at"])
    except (KeyError, ValueError):
        return "snapshot without its full listing's time"
    if not 0 <= age < interval_s:
        return f"last full listing {age:.0f} s ago (interval {interval_s:g} s)"
    return None


# -- reading directories ------------------------------------------------------------------------------------------
def _rel(root: str, path: str) -> str:
    rel = posixpath.relpath(path, root)
    return "" if rel == "." else rel


def _parent(rel: str) -> str:
    return posixpath.dirname(rel)


def _mtime_ns(full: str) -> int | None:
    """The directory's ``st_mtime_ns``, or None when it is gone or no directory."""
    try:
        st = os.stat(full)
    except OSError:
        return None
    return st.st_mtime_ns if stat.S_ISDIR(st.st_mode) else None


def _read_dir(fs, root: str, rel: str, recursive: bool, entry_row) -> tuple[int, list[FileRow], list[str]]:
    """Directory ``rel`` read: (its mtime_ns to record, its corpus files, its subdirectories to follow). The mtime is
    taken before the read, -1 when racy (:data:`RACY_S`) or unreadable (read again next time, as ``fs.walk`` omits a
    directory it cannot read). Subdirectories named ``.*`` or ``_*`` are not followed (no file under them is listed)."""
    full = posixpath.join(root, rel) if rel else root
    began_ns = time.time_ns()  # the file system's clock, not the interval's (:data:`_clock`)
    mtime_ns = _mtime_ns(full)
    if mtime_ns is None:
        return -1, [], []
    try:
        entries = fs.ls(full, detail=True)
    except OSError:
        return -1, [], []
    files, dirs = [], []
    for info in entries:
        if info.get("type") == "directory":
            name = posixpath.basename(info["name"])
            if recursive and not name.startswith((".", "_")):
                dirs.append(_rel(root, info["name"]))
        else:
            row = entry_row(info["name"], info)
            if row is not None:
                files.append(tuple(row))
    if mtime_ns >= began_ns - int(RACY_S * 1e9):
        mtime_ns = -1
    return mtime_ns, files, dirs


# -- full listing -------------------------------------------------------------------------------------------------
def _full(source, path, started, why, fill, on_buckets):
    """A new snapshot filled by ``fill(con) -> (directories read, meta rows)``, every bucket assembled from it; it
    replaces the one at ``path`` once every bucket is handed over."""
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    con = sqlite3.connect(tmp, isolation_level=None)
    try:
        con.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;" + _SCHEMA)
        con.execute("BEGIN")
        dirs_read, meta = fill(con)
        for statement in filter(str.strip, _INDEXES.split(";")):
            con.execute(statement)
        rows = _assemble(con, _all_buckets(con), on_buckets)
        con.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                        [("format", str(FORMAT)), ("source", json.dumps(list(source))), ("full_started_at", repr(started)),
                         *meta])
        con.execute("COMMIT")
        con.execute("PRAGMA journal_mode=DELETE")
        con.close()
        os.replace(tmp, path)
    except BaseException:
        con.close()
        _unlink(tmp)
        raise
    return rows, ListingReport("full", why, dirs_read=dirs_read, files=sum(r[2] for r in rows), buckets=len(rows),
                               buckets_assembled=len(rows))


def _fill_dirs(con, *, fs, root, recursive, entry_row, bucket_of) -> tuple[int, list]:
    """Every directory under ``root`` read into the snapshot (directory mode); (directories read, no meta)."""
    dirs_read, todo = 0, [""]
    while todo:
        rel = todo.pop()
        mtime_ns, files, subdirs = _read_dir(fs, root, rel, recursive, entry_row)
        dirs_read += 1
        con.execute("INSERT INTO dirs VALUES (?, ?, ?)", (rel, None if rel == "" else _parent(rel), mtime_ns))
        _insert_files(con, files, rel, bucket_of)
        todo += subdirs
    return dirs_read, []


def _fill_keys(con, *, entries, entry_row, bucket_of) -> tuple[int, list]:
    """Every entry of ``entries`` (``(key, path, info)``) into the snapshot (key order mode); (0, the last key)."""
    last = _insert_entries(con, entries, entry_row, bucket_of, None, set(), {"added": 0, "changed": 0})
    return 0, [("last_key", last or "")]


def _insert_entries(con, entries, entry_row, bucket_of, last: str | None, touched: set[int],
                    counts: dict[str, int], chunk: int = 1000) -> str | None:
    """``entries`` (``(key, path, info)``) inserted or replaced in the ``files`` table (directory ``""``), ``chunk``
    at a time; their buckets ``touched``, ``counts`` of added and changed; returns the greatest key, ``last`` at least."""
    rows: list[FileRow] = []

    def flush() -> None:
        known = {r for (r,) in con.execute(
            f"SELECT rel FROM files WHERE rel IN ({','.join('?' * len(rows))})", [f[2] for f in rows])}
        for f in rows:
            counts["changed" if f[2] in known else "added"] += 1
            touched.add(bucket_of(f[2]))
        _insert_files(con, rows, "", bucket_of)
        rows.clear()

    for key, p, info in entries:
        last = key if last is None or key > last else last
        row = entry_row(p, info)
        if row is not None:
            rows.append(tuple(row))
            if len(rows) >= chunk:
                flush()
    if rows:
        flush()
    return last


def _unlink(p: str) -> None:
    try:
        os.unlink(p)
    except OSError:
        pass


def _insert_files(con, files: Iterable[FileRow], rel_dir: str, bucket_of) -> None:
    con.executemany("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [(f[2], f[0], f[1], int(f[3]), float(f[4]), f[5], rel_dir, bucket_of(f[2])) for f in files])


def _all_buckets(con) -> Iterator[tuple[int, list[FileRow]]]:
    """Every bucket's members from the ``files`` table, a bucket at a time, by index, members by key."""
    cur = con.execute("SELECT bucket, key, uri, rel, size, mtime, version FROM files ORDER BY bucket, key")
    index, members = None, []
    for b, *row in cur:
        if b != index and members:
            yield index, members
            members = []
        index = b
        members.append(tuple(row))
    if members:
        yield index, members


def _members_of(con, indexes: Iterable[int]) -> Iterator[tuple[int, list[FileRow]]]:
    """Buckets ``indexes``' members from the ``files`` table (sorted by key), an empty bucket with []."""
    for b in sorted(indexes):
        yield b, [tuple(r) for r in con.execute(
            "SELECT key, uri, rel, size, mtime, version FROM files WHERE bucket = ? ORDER BY key", (b,))]


def _assemble(con, buckets: Iterable[tuple[int, list[FileRow]]], on_buckets) -> list[BucketRow]:
    """Each of ``buckets`` handed to ``on_buckets`` in batches of :data:`BUCKETS_PER_BATCH` and its summary written to
    the ``buckets`` table (an empty bucket deleted from it); the non-empty buckets' rows."""
    out: list[BucketRow] = []
    batch: dict[int, list[FileRow]] = {}

    def flush() -> None:
        summaries = on_buckets(dict(batch))
        rows = [(b, *summaries[b]) for b in sorted(batch)]
        con.executemany("INSERT OR REPLACE INTO buckets VALUES (?, ?, ?, ?, ?)", rows)
        out.extend(rows)
        batch.clear()

    for index, members in buckets:
        if not members:
            con.execute("DELETE FROM buckets WHERE bucket = ?", (index,))
            continue
        batch[index] = members
        if len(batch) >= BUCKETS_PER_BATCH:
            flush()
    if batch:
        flush()
    return out


# -- incremental listing ------------------------------------------------------------------------------------------
def _incremental(fs, root, recursive, path, entry_row, bucket_of, on_buckets):
    """The snapshot brought up to date, directory by directory (see the module doc), in one transaction."""
    with _transaction(path) as con:
        known = dict(con.execute("SELECT path, mtime_ns FROM dirs").fetchall())
        todo, gone, checked = [], [], 0
        for rel, mtime_ns in known.items():
            now_ns = _mtime_ns(posixpath.join(root, rel) if rel else root)
            if now_ns is None:
                if rel == "":
                    raise FileNotFoundError(root)
                gone.append(rel)
            elif now_ns == mtime_ns:
                checked += 1
            else:
                todo.append(rel)
        touched: set[int] = set()
        counts = {"added": 0, "changed": 0, "removed": 0}
        for rel in gone:
            _drop_tree(con, rel, touched, counts)
        read = 0
        while todo:
            rel = todo.pop()
            mtime_ns, files, subdirs = _read_dir(fs, root, rel, recursive, entry_row)
            read += 1
            con.execute("INSERT OR REPLACE INTO dirs VALUES (?, ?, ?)", (rel, None if rel == "" else _parent(rel), mtime_ns))
            _diff_files(con, rel, files, bucket_of, touched, counts)
            had = {r for (r,) in con.execute("SELECT path FROM dirs WHERE parent = ?", (rel,))}
            for sub in had - set(subdirs):
                _drop_tree(con, sub, touched, counts)
            todo += [s for s in subdirs if s not in had]
        rows = _settle(con, touched, on_buckets)
    return rows, ListingReport("incremental", dirs_checked=checked, dirs_read=read, files=sum(r[2] for r in rows),
                               buckets=len(rows), buckets_assembled=len(touched), **counts)


def _incremental_after(path, entries_after, entry_row, bucket_of, on_buckets):
    """The snapshot brought up to date with the keys after the last one seen (key order mode), in one transaction."""
    with _transaction(path) as con:
        row = con.execute("SELECT v FROM meta WHERE k = 'last_key'").fetchone()
        if row is None:
            raise sqlite3.DatabaseError("snapshot without its last key")
        after, touched, counts = row[0], set(), {"added": 0, "changed": 0}
        last = _insert_entries(con, entries_after(after), entry_row, bucket_of, after, touched, counts)
        con.execute("UPDATE meta SET v = ? WHERE k = 'last_key'", (last or "",))
        rows = _settle(con, touched, on_buckets)
    return rows, ListingReport("incremental", after_key=after, files=sum(r[2] for r in rows), buckets=len(rows),
                               buckets_assembled=len(touched), **counts)


@contextmanager
def _transaction(path: str) -> Iterator[sqlite3.Connection]:
    """The snapshot at ``path`` in a write transaction (``BEGIN IMMEDIATE``: one lister at a time brings a snapshot up
    to date; waits up to 60 s), committed when the block ends, rolled back when it raises."""
    con = sqlite3.connect(path, isolation_level=None, timeout=60)
    try:
        con.execute("BEGIN IMMEDIATE")
        try:
            yield con
            con.execute("COMMIT")
        except BaseException:
            try:
                con.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise
    finally:
        con.close()


def _settle(con, touched: set[int], on_buckets) -> list[BucketRow]:
    """The ``touched`` buckets assembled again (:func:`_assemble`); then every non-empty bucket's row, by index."""
    _assemble(con, _members_of(con, touched), on_buckets)
    return [tuple(r) for r in con.execute("SELECT bucket, version, file_count, size, mtime FROM buckets ORDER BY bucket")]


def _drop_tree(con, rel: str, touched: set[int], counts: dict[str, int]) -> None:
    """Directory ``rel`` and everything under it out of the snapshot; the buckets of its files ``touched``."""
    under = (rel, rel + "/", rel + "0")  # "0" follows "/": the paths starting with "rel/"
    where = "(dir = ? OR (dir >= ? AND dir < ?))"
    for b, n in con.execute(f"SELECT bucket, COUNT(*) FROM files WHERE {where} GROUP BY bucket", under):
        touched.add(b)
        counts["removed"] += n
    con.execute(f"DELETE FROM files WHERE {where}", under)
    con.execute("DELETE FROM dirs WHERE path = ? OR (path >= ? AND path < ?)", under)


def _diff_files(con, rel_dir: str, files: list[FileRow], bucket_of, touched: set[int], counts: dict[str, int]) -> None:
    """Directory ``rel_dir``'s files in the snapshot replaced by ``files`` (as read now); the buckets of the files
    added, changed or removed ``touched``."""
    before = {r[0]: (r[1], r[2], r[3], r[4]) for r in con.execute(
        "SELECT rel, version, size, mtime, bucket FROM files WHERE dir = ?", (rel_dir,))}
    now = {f[2]: f for f in files}
    for rel, (version, size, mtime, bucket) in before.items():
        if rel not in now:
            touched.add(bucket)
            counts["removed"] += 1
    con.executemany("DELETE FROM files WHERE rel = ?", [(rel,) for rel in before if rel not in now])
    new = []
    for rel, f in now.items():
        old = before.get(rel)
        if old is not None and (old[0], int(old[1]), float(old[2])) == (f[5], int(f[3]), float(f[4])):
            continue
        counts["added" if old is None else "changed"] += 1
        touched.add(bucket_of(rel))
        new.append(f)
    _insert_files(con, new, rel_dir, bucket_of)


__all__ = ["FORMAT", "RACY_S", "ListingReport", "grouped_listing", "state_path"]
