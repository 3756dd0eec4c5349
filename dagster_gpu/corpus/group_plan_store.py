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
``DAGSTER_HOME`` is set (beside the shard plans), else none: then every unit lists, as without plans. Old plans
are not deleted (one small file per bucket version; delete files older than the corpus sensor's interval at
will). Writing is best effort: a directory that cannot be written costs the units a listing each.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from dagster_gpu.corpus.group_plans import (Member, PlanSource, plan_doc, plan_members, plan_name, planned_version,
                                            pointer_doc, pointer_name, replaces)
from dagster_gpu.corpus.plan_dir import PlanDir

#: ``info`` calls (stat / HEAD) and plan reads or writes at once on an object store (a local disk: one at a time).
STAT_THREADS = 16
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
                      buckets: Mapping[int, tuple[str, Callable[[], Sequence[Member]]]], listed_at: float) -> None:
    """Store one full listing's buckets, started at ``listed_at`` (seconds since the epoch), in ``plans``;
    ``buckets``: bucket index -> (its group version, a function giving its members, called only when its plan is
    written). Each bucket's plan unless this process already wrote it there, then each bucket's pointer where the
    stored one names another version from a listing that started no later (read, compared, then written:
    :func:`dagster_gpu.corpus.group_plans.replaces`). Best effort: a failure is logged (one warning), never raised."""
    threads = 1 if plans.local else STAT_THREADS
    todo = [(index, version, (plans.url, plan_name(source, index, version)))
            for index, (version, _members) in buckets.items()]
    with _lock:
        new = [t for t in todo if t[2] not in _written]

    def write_plan(t) -> None:
        doc = plan_doc(source, t[0], buckets[t[0]][1]())
        if doc["version"] != t[1]:  # not the members of that version: store nothing under its name
            raise ValueError(f"bucket {t[0]}: members of version {doc['version']}, not {t[1]}")
        plans.write(t[2][1], doc)

    try:
        _each(write_plan, new, threads)
        with _lock:
            if len(_written) + len(new) > _WRITTEN_MAX:
                _written.clear()
            _written.update(t[2] for t in new)
        _each(lambda t: _point(plans, pointer_name(source, t[0]), pointer_doc(source, t[0], t[1], listed_at)),
              todo, threads)
    except Exception as e:  # noqa: BLE001 - see the docstring: the units list instead
        logging.getLogger(__name__).warning("file group plans not stored under %s: %s: %s", plans.url,
                                            type(e).__name__, e)


def _point(plans: PlanDir, name: str, doc: Mapping[str, Any]) -> None:
    """Pointer ``name`` set to ``doc`` when it :func:`replaces` the stored one (a read costs less than a write: a
    small read against a temp file and a rename, a GET against a PUT)."""
    if replaces(plans.read(name), doc):
        plans.write(name, doc)


def load_group_plans(plans: PlanDir, source: PlanSource, indexes: Iterable[int]) -> dict[int, list[Member]]:
    """Bucket index -> its members as the latest stored listing saw them, for each of ``indexes`` whose pointer
    and plan are readable and consistent (:func:`dagster_gpu.corpus.group_plans.plan_members`); the others are
    left out. Never raises for a missing, unreadable or foreign file."""
    wanted = list(dict.fromkeys(int(i) for i in indexes))

    def one(index: int) -> list[Member] | None:
        version = planned_version(source, index, plans.read(pointer_name(source, index)))
        if version is None:
            return None
        return plan_members(source, index, version, plans.read(plan_name(source, index, version)))

    found = _each(one, wanted, 1 if plans.local else STAT_THREADS)
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


__all__ = ["STAT_THREADS", "current_infos", "default_group_plan_url", "forget_group_plans", "load_group_plans",
           "store_group_plans"]
