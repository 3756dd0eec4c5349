"""A file group's plan: the member list of one bucket as one listing saw it (pure: names and documents).

A plan lets a work unit resolve a bucket key without listing the whole corpus (:mod:`dagster_gpu.corpus.
group_plan_store` keeps them in a plan directory). It names the bucket's files (key, path, relative name, size in
bytes, mtime in seconds since the epoch, source version) and the bucket's source version
(:func:`dagster_gpu.corpus.groups.group_version` of those files). Like a shard plan it is only a saving, never a
source of truth: the unit checks every member's version before using it.

Two kinds of file, both small JSON:

- the plan, named by :func:`plan_name`: a hash of (corpus URL, pattern, recursive, bucket count, bucket index,
  group version); written once per bucket version, never rewritten with other content;
- the bucket's pointer, named by :func:`pointer_name` (no version in the name): ``{"version", "plan", "listed_at",
  "superseded"}`` of the latest listing of the bucket, rewritten by a listing that finds another version, or the
  same one when the stored pointer is older than the refresh interval (:func:`next_pointer`). ``superseded`` lists
  ``[plan name, seconds since the epoch]`` of the plans this pointer named before and when they stopped being
  current, for the lister to delete once they are past their grace period (:func:`prune`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from dagster_gpu.corpus.groups import group_version

#: The plan document's format (a reader ignores any other).
FORMAT = 1
#: What a plan's file name looks like (:func:`plan_name`): the only names a pointer's ``superseded`` may make deleted.
PLAN_NAME = re.compile(r"[0-9a-f]{32}\.json")


@dataclass(frozen=True)
class PlanSource:
    """What a bucket's membership depends on besides the files: the corpus ``url``, its ``pattern`` and
    ``recursive`` settings and the bucket count ``buckets``."""

    url: str
    pattern: str
    recursive: bool
    buckets: int

    @property
    def fields(self) -> list[Any]:
        return [self.url.rstrip("/"), self.pattern, bool(self.recursive), int(self.buckets)]

    @property
    def digest(self) -> str:
        """24 hex of the SHA-256 of the fields: the pointers' name prefix."""
        return hashlib.sha256(json.dumps(self.fields).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Member:
    """One file of a bucket as the listing saw it: partition ``key``, ``path`` on the corpus's filesystem (no
    protocol), ``relative_name`` (to the corpus root), ``size_bytes``, ``mtime`` (seconds since the epoch) and
    source ``version``."""

    key: str
    path: str
    relative_name: str
    size_bytes: int
    mtime: float
    version: str


def plan_name(source: PlanSource, index: int, version: str) -> str:
    """The file name of bucket ``index``'s plan at group version ``version``: ``<32 hex>.json``."""
    doc = json.dumps([*source.fields, int(index), version])
    return hashlib.sha256(doc.encode("utf-8", "surrogatepass")).hexdigest()[:32] + ".json"


def pointer_name(source: PlanSource, index: int) -> str:
    """The file name of bucket ``index``'s pointer: ``latest-<24 hex>-<index>.json``."""
    return f"latest-{source.digest}-{int(index)}.json"


def plan_doc(source: PlanSource, index: int, members: Sequence[Member]) -> dict[str, Any]:
    """The plan document of bucket ``index`` holding ``members`` (its ``version`` computed from theirs)."""
    version = group_version({m.key: m.version for m in members})
    return {"format": FORMAT, "source": source.fields, "index": int(index), "version": version,
            "members": [[m.key, m.path, m.relative_name, int(m.size_bytes), float(m.mtime), m.version]
                        for m in members]}


def pointer_doc(source: PlanSource, index: int, version: str, listed_at: float,
                superseded: Sequence[tuple[str, float]] = ()) -> dict[str, Any]:
    """The pointer document naming bucket ``index``'s plan at ``version``, from a listing that started at
    ``listed_at`` (seconds since the epoch); ``superseded``: (plan name, when it stopped being current) of earlier
    plans still to delete (left out when empty)."""
    doc = {"version": version, "plan": plan_name(source, index, version), "listed_at": float(listed_at)}
    if superseded:
        doc["superseded"] = [[n, float(t)] for n, t in superseded]
    return doc


def superseded_plans(pointer: Any) -> list[tuple[str, float]]:
    """(plan name, when it stopped being current) of each well-formed ``superseded`` entry of a pointer document
    (names that are not plan names, and the plan the pointer names itself, are left out)."""
    if not isinstance(pointer, Mapping) or not isinstance(pointer.get("superseded"), list):
        return []
    out = []
    for e in pointer["superseded"]:
        if (isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and PLAN_NAME.fullmatch(e[0])
                and isinstance(e[1], (int, float)) and e[0] != pointer.get("plan")):
            out.append((e[0], float(e[1])))
    return out


def next_pointer(source: PlanSource, index: int, version: str, listed_at: float, stored: Any,
                 refresh_s: float | None = None) -> dict[str, Any] | None:
    """The pointer a listing started at ``listed_at`` that saw bucket ``index`` at ``version`` writes over
    ``stored`` (the pointer document read, None if nothing readable), or None to leave it: a new one when
    :func:`replaces` says so (the stored plan then joins ``superseded``, stamped ``listed_at``); the same version
    again when the stored pointer's listing started ``refresh_s`` seconds or more before this one (so that its
    ``listed_at`` says how recently a listing saw the bucket, for a unit's maximum plan age; None: never)."""
    new = pointer_doc(source, index, version, listed_at)
    if replaces(stored, new):
        old = [] if not isinstance(stored, Mapping) else superseded_plans(stored)
        gone = stored.get("plan") if isinstance(stored, Mapping) else None
        if isinstance(gone, str) and PLAN_NAME.fullmatch(gone) and gone != new["plan"]:
            old.append((gone, float(listed_at)))
        return pointer_doc(source, index, version, listed_at, [e for e in old if e[0] != new["plan"]])
    if (refresh_s is not None and isinstance(stored, Mapping) and stored.get("version") == version
            and isinstance(stored.get("listed_at"), (int, float))
            and float(listed_at) - float(stored["listed_at"]) >= refresh_s):
        return pointer_doc(source, index, version, listed_at, superseded_plans(stored))
    return None


def prune(pointer: Mapping[str, Any], now: float, grace_s: float) -> tuple[list[str], dict[str, Any]]:
    """(plan names to delete, the pointer without them): the ``superseded`` plans that stopped being current
    ``grace_s`` seconds or more before ``now`` (seconds since the epoch). Never the plan the pointer names."""
    keep, due = [], []
    for name, at in superseded_plans(pointer):
        (due if now - at >= grace_s else keep).append((name, at))
    doc = {k: v for k, v in pointer.items() if k != "superseded"}
    if keep:
        doc["superseded"] = [[n, t] for n, t in keep]
    return [n for n, _ in due], doc


def pointer_age(pointer: Any, now: float) -> float | None:
    """Seconds from the start of the listing that wrote (or last refreshed) a pointer document to ``now``, or
    None when it has no ``listed_at``."""
    if not isinstance(pointer, Mapping) or not isinstance(pointer.get("listed_at"), (int, float)):
        return None
    return float(now) - float(pointer["listed_at"])


def replaces(stored: Any, new: Mapping[str, Any]) -> bool:
    """Whether pointer document ``new`` should be written over ``stored`` (what the directory holds, None if
    nothing readable): when it names another version and its listing did not start before the stored one's (a
    slower listing of an older state, finishing later, never sets a pointer back)."""
    if not isinstance(stored, Mapping) or not isinstance(stored.get("listed_at"), (int, float)):
        return True
    return stored.get("version") != new["version"] and float(stored["listed_at"]) <= float(new["listed_at"])


def planned_version(source: PlanSource, index: int, pointer: Any) -> str | None:
    """The group version a pointer document names, None unless it is one :func:`pointer_doc` wrote for this
    source and bucket (its plan name must be the one of its version)."""
    if not isinstance(pointer, Mapping) or not isinstance(pointer.get("version"), str):
        return None
    version = pointer["version"]
    return version if pointer.get("plan") == plan_name(source, index, version) else None


def plan_members(source: PlanSource, index: int, version: str, doc: Any) -> list[Member] | None:
    """The members of plan document ``doc``, or None unless it is a plan of exactly this source, bucket and
    group ``version`` whose members hash to that version (a plan of another version is never used)."""
    try:
        if (doc["format"] != FORMAT or doc["source"] != source.fields or doc["index"] != int(index)
                or doc["version"] != version):
            return None
        members = [Member(str(k), str(p), str(r), int(s), float(t), str(v)) for k, p, r, s, t, v in doc["members"]]
    except (KeyError, TypeError, ValueError):
        return None
    if not members or group_version({m.key: m.version for m in members}) != version:
        return None
    return members


__all__ = ["FORMAT", "PLAN_NAME", "Member", "PlanSource", "next_pointer", "plan_doc", "plan_members", "plan_name",
           "planned_version", "pointer_age", "pointer_doc", "pointer_name", "prune", "replaces", "superseded_plans"]
