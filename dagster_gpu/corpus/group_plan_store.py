"""File group plans in a plan directory: stored by whoever lists the corpus, read by the work units.

A work unit given bucket keys (``CorpusSource(group_buckets=N)``) would otherwise list the whole corpus to find
a bucket's files (on S3, a million files are ~1,000 LIST requests, paid again by every unit of a backfill). The
corpus sensor's tick and ``dagster-gpu backfill``'s registration list everything anyway: every full listing
(:meth:`dagster_gpu.corpus.listing.CorpusSource.list_files`) stores each bucket's member list
(:mod:`dagster_gpu.corpus.group_plans`) and its pointer, and a unit reads the pointer and the plan of each of
its buckets, then checks each member with one ``info`` call (a stat, an S3 HEAD; ``STAT_THREADS`` at a time on
an object store) instead of listing.

The rule (see :meth:`dagster_gpu.corpus.listing.CorpusSource.files_for_keys`): a unit embeds the bucket as the
latest listing saw it, provided every member still has the version listed; the bucket's recorded source version
is the group version of exactly those members, so it describes the bytes embedded. A member changed or gone, a
missing or unreadable plan or pointer, or a plan of another version falls back to a full listing (correct, just
slower). A file added to the bucket after the latest listing is not in the plan: it comes with the next listing
(the corpus sensor's next tick sees a new group version, unequal to the recorded one, and requests the bucket
again with the new versions). Every listing sets each bucket's pointer before its runs are requested, unless
the stored pointer comes from a listing that started later (a slower listing of an older state, e.g. a unit's
fallback, finishing after a tick's, never sets a pointer back), so a unit started by a tick reads that tick's
membership or a newer one. The pointers compare listing start times across hosts: clocks are assumed to agree
within the time between two listings.

The directory is ``CorpusSource.group_plan_url``, else ``$DAGSTER_HOME/dagster_gpu/group_plans`` when
``DAGSTER_HOME`` is set (beside the shard plans), else none: then every unit lists, as without plans. Writing is
best effort: a directory that cannot be written costs the units a listing each.

Housekeeping, done by the lister after it stores a listing's plans, without listing the plan directory: a pointer
that moves to another version records the plan it named before in its ``superseded`` list (stamped with the
listing's start), and a later listing that reads the pointer (every listing reads every bucket's pointer anyway)
deletes the superseded plans older than :data:`SUPERSEDED_GRACE_S` and rewrites the pointer without them, so the
cost is one DELETE per plan that stopped being current plus one pointer write per bucket that had any, and
nothing in a listing where no bucket changed. The grace period exists because a unit reads a bucket's pointer
and then its plan: a plan deleted between the two reads would cost that unit a listing of the whole corpus.
A current plan is never deleted (a pointer's own plan is never in its list). Plans of a bucket count or pattern
no longer used, and plans of listings older than this housekeeping, are not pointed to by anything and stay
(delete them at will).

A maximum plan age (``CorpusSource.group_plan_max_age_seconds``): a unit ignores a pointer whose listing started
longer ago than that and lists the corpus (a listing seen that long ago says little about the bucket now: the
corpus sensor may have stopped). So that a bucket that never changes keeps usable plans, a listing rewrites a
pointer of the same version once it is half that age (:func:`~dagster_gpu.corpus.group_plans.next_pointer`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from dagster_gpu.corpus.group_plans import (
    Member,
    PlanSource,
    next_pointer,
    plan_doc,
    plan_members,
    plan_name,
    planned_version,
    pointer_age,
    pointer_name,
    prune,
)
from dagster_gpu.corpus.plan_dir import PlanDir

log = logging.getLogger(__name__)

#: ``info`` calls (stat / HEAD) and plan reads or writes at once on an object store (a local disk: one at a time).
STAT_THREADS = 16
#: Seconds a plan that stopped being current is kept before a listing deletes it: far longer than a unit takes
#: from reading a bucket's pointer to reading the plan it names (one small read), so no unit resolving now loses
#: its plan; short enough that a bucket changing at every tick keeps a handful of files.
SUPERSEDED_GRACE_S = 600.0
#: Plan names this process wrote, per directory (a plan's content never changes: written once); bounded.
_WRITTEN_MAX = 100_000
_written: set[tuple[str, str]] = set()
_lock = threading.Lock()

T = TypeVar("T")
R = TypeVar("R")


def default_group_plan_url() -> str | None:
    """``$DAGSTER_HOME/dagster_gpu/group_plans`` when ``DAGSTER_HOME`` is set, else None."""
    home = os.environ.get("DAGSTER_HOME")
    return os.path.join(home, "dagster_gpu", "group_plans") if home else None


def _each(fn: Callable[[T], R], items: Sequence[T], threads: int) -> list[R]:
    """``fn`` of every item, in order; on a pool of ``threads`` when above 1."""
    if threads <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix="dagster-gpu-group-plan") as pool:
        return list(pool.map(fn, items))


def store_group_plans(plans: PlanDir, source: PlanSource,
                      buckets: Mapping[int, tuple[str, Callable[[], Sequence[Member]]]], listed_at: float, *,
                      refresh_s: float | None = None, grace_s: float | None = None) -> int:
    """Store one full listing's buckets, started at ``listed_at`` (seconds since the epoch), in ``plans``;
    ``buckets``: bucket index -> (its group version, a function giving its members, called only when its plan is
    written). Reads every bucket's pointer, then writes each bucket's plan unless this process already wrote it
    there (always when its pointer moves to it), then each pointer that moves to another version from a listing that
    started no later, or that is ``refresh_s`` seconds or more older than this listing (None: never refreshed;
    :func:`dagster_gpu.corpus.group_plans.next_pointer`). Then deletes each pointer's superseded plans older than
    ``grace_s`` (default :data:`SUPERSEDED_GRACE_S`) and rewrites it without them. Returns how many plans it
    deleted. Best effort: a failure is logged (one warning), never raised."""
    grace = SUPERSEDED_GRACE_S if grace_s is None else float(grace_s)
    threads = 1 if plans.local else STAT_THREADS
    todo = [(index, version, plan_name(source, index, version)) for index, (version, _members) in buckets.items()]

    def write_plan(t) -> None:
        doc = plan_doc(source, t[0], buckets[t[0]][1]())
        if doc["version"] != t[1]:  # not the members of that version: store nothing under its name
            raise ValueError(f"bucket {t[0]}: members of version {doc['version']}, not {t[1]}")
        plans.write(t[2], doc)

    def finish(item) -> list[str]:
        """Bucket ``item``'s pointer written (moved, refreshed or pruned) as needed; the plans it deleted."""
        t, stored, new = item
        doc = new if new is not None else stored
        if planned_version(source, t[0], doc) is None:
            return []
        due, pruned = prune(doc, listed_at, grace)
        for name in due:
            plans.delete(name)
        if new is not None or due:
            plans.write(pointer_name(source, t[0]), pruned)
        return due

    try:
        stored = _each(lambda t: plans.read(pointer_name(source, t[0])), todo, threads)
        decided = [(t, st, next_pointer(source, t[0], t[1], listed_at, st, refresh_s)) for t, st in zip(todo, stored)]
        with _lock:
            new = [t for t, st, nxt in decided
                   if (plans.url, t[2]) not in _written or (nxt is not None and planned_version(source, t[0], st) != t[1])]
        _each(write_plan, new, threads)
        with _lock:
            if len(_written) + len(new) > _WRITTEN_MAX:
                _written.clear()
            _written.update((plans.url, t[2]) for t in new)
        deleted = [n for names in _each(finish, decided, threads) for n in names]
        with _lock:
            _written.difference_update((plans.url, n) for n in deleted)
        return len(deleted)
    except Exception as e:  # noqa: BLE001 - see the docstring: the units list instead
        log.warning("file group plans not stored under %s: %s: %s", plans.url, type(e).__name__, e)
        return 0


def load_group_plans(plans: PlanDir, source: PlanSource, indexes: Iterable[int],
                     max_age_s: float | None = None, now: float | None = None) -> dict[int, list[Member]]:
    """Bucket index -> its members as the latest stored listing saw them, for each of ``indexes`` whose pointer
    and plan are readable and consistent (:func:`dagster_gpu.corpus.group_plans.plan_members`) and whose pointer's
    listing started at most ``max_age_s`` seconds before ``now`` (default: the current time; ``max_age_s`` None:
    any age); the others are left out (the caller lists). Never raises for a missing, unreadable or foreign file."""
    wanted = list(dict.fromkeys(int(i) for i in indexes))
    at = time.time() if now is None else float(now)
    aged: list[int] = []

    def one(index: int) -> list[Member] | None:
        pointer = plans.read(pointer_name(source, index))
        version = planned_version(source, index, pointer)
        if version is None:
            return None
        age = pointer_age(pointer, at)
        if max_age_s is not None and (age is None or age > max_age_s):
            aged.append(index)
            return None
        return plan_members(source, index, version, plans.read(plan_name(source, index, version)))

    found = _each(one, wanted, 1 if plans.local else STAT_THREADS)
    if aged:
        log.info("file group plans of %d bucket(s) under %s are older than the maximum plan age (%g s: "
                 "group_plan_max_age_seconds): those buckets are listed", len(aged), plans.url, max_age_s)
    return {i: m for i, m in zip(wanted, found) if m is not None}


def current_infos(fs, paths: Sequence[str], threads: int) -> dict[str, Mapping[str, Any] | None]:
    """Path -> its fsspec ``info`` now (one call each, ``threads`` at a time; an object store's listing cache
    is dropped for the path first), or None for a path that is gone, not a file, or whose store refused."""

    def one(path: str) -> Mapping[str, Any] | None:
        try:
            fs.invalidate_cache(path)
            info = fs.info(path)
        except Exception:  # noqa: BLE001 - gone, refused, not ours: the caller lists instead
            return None
        return info if info.get("type") == "file" else None

    return dict(zip(paths, _each(one, list(paths), threads)))


def forget_group_plans() -> None:
    """Forget which plans this process wrote (tests; the directory's files stay)."""
    with _lock:
        _written.clear()


__all__ = ["STAT_THREADS", "SUPERSEDED_GRACE_S", "current_infos", "default_group_plan_url", "forget_group_plans", "load_group_plans",
           "store_group_plans"]
