"""GRES text and node GPU capacity (pure, no I/O).

What Slurm prints for GRES, as read here:

- ``sinfo -N -O NodeList,StateLong,Gres,GresUsed`` (the per-node source used for GPUs in use: it counts every
  job however it asked: ``--gres``, ``--gpus``/``--gpus-per-task`` (tres-per-job), multi-node jobs):
  ``Gres`` ``gpu:4,shard:8`` / ``gpu:a100:4(S:0-1)``; ``GresUsed`` ``gpu:3,shard:(null):0(IDX:N/A)`` (22.05,
  recorded in ``tests/data/slurm/sinfo_gres_used_busy.txt``) or ``gpu:a100:2(IDX:0,2)`` /
  ``gpu:(null):2(IDX:0-1)`` / ``shard:(null):2(1/4,1/4)`` (SchedMD/slurm slurm-24-11-5-1
  ``src/interfaces/gres.c`` ``_node_gres_used``: ``"%s:%s:%"PRIu64"(%s%s)"`` with the type name, ``(null)``
  when untyped). Parenthesised parts (sockets, indices, per-device shares) may hold commas.
- squeue ``%b`` (tres-per-node): ``gres:gpu:1`` before 23.11, ``gres/gpu:1`` / ``gres/gpu:a100:1`` since
  (SchedMD/slurm slurm-23-11-0-1 ``src/interfaces/gres.c`` ``gres_prepend_tres_type``).
- Node states (``StateLong``, SchedMD/slurm slurm-24-11-5-1 ``src/common/slurm_protocol_defs.c``
  ``node_state_string``): a node takes new jobs only when its base state is idle, mixed, allocated,
  completing or planned and it has no ``*`` (not responding) flag; ``~``/``#``/``%`` (powered down / powering
  up / down) are power-save flags of a node Slurm resumes for a job, so they count. down, drained, draining,
  fail, failing, future, inval, maint, reboot, reserved, unknown do not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PARENS = re.compile(r"\([^()]*\)")
_NULL_TYPE = re.compile(r":\(null\)(?=:)")


@dataclass(frozen=True)
class GresItem:
    """One GRES of a list: ``gpu:a100:2`` -> name ``gpu``, type ``a100``, count 2 (type None when untyped)."""

    name: str
    type: str | None
    count: int


def parse_gres(text: str) -> list[GresItem]:
    """``gpu:a100:2(S:0-1),shard:8`` -> [GresItem("gpu", "a100", 2), GresItem("shard", None, 8)].

    Accepts sinfo ``Gres``/``GresUsed`` and squeue ``%b`` forms (``gres:``/``gres/`` prefixes, ``(null)``
    types, parenthesised socket/index parts). ``(null)``, ``N/A`` and empty give []. An item without a
    numeric count (``gpu``) counts 1, as Slurm reads ``--gres=gpu``."""
    t = _NULL_TYPE.sub("", (text or "").strip())
    t = _PARENS.sub("", t)
    out: list[GresItem] = []
    for item in t.split(","):
        item = item.strip()
        if not item or item.lower() in ("(null)", "n/a", "none"):
            continue
        for prefix in ("gres:", "gres/"):
            if item.startswith(prefix):
                item = item[len(prefix):]
        parts = item.split(":")
        name = parts[0]
        if len(parts) == 1:
            out.append(GresItem(name, None, 1))
            continue
        last = parts[-1]
        if last.isdigit():
            gtype = ":".join(parts[1:-1]) or None
            out.append(GresItem(name, gtype, int(last)))
        else:  # gpu:a100 (type, no count)
            out.append(GresItem(name, ":".join(parts[1:]), 1))
    return out


def gpu_count(text: str, gres_type: str | None = None) -> int:
    """GPUs in a GRES text: ``gpu:4,shard:8`` -> 4; ``gres/gpu:a100:1`` -> 1; ``gpu:a100:2(S:0-1)`` -> 2;
    ``(null)`` -> 0. With ``gres_type``, only GPUs of that type."""
    return sum(g.count for g in parse_gres(text) if g.name == "gpu" and (gres_type is None or g.type == gres_type))


#: Base node states (lower case) of a node that takes new jobs.
USABLE_NODE_STATES = frozenset({"idle", "mixed", "allocated", "completing", "planned"})


def node_usable(state: str) -> bool:
    """True when a node in this ``StateLong`` (``idle``, ``mixed-``, ``idle~``, ``drained*``…) takes new jobs."""
    s = state.strip().lower()
    if "*" in s:
        return False
    parts = [p.rstrip("~#%$@^!-") for p in s.split("+")]  # StateComplete-style "idle+drain" too
    return parts[0] in USABLE_NODE_STATES and not any(p in _UNUSABLE_FLAGS for p in parts[1:])


_UNUSABLE_FLAGS = frozenset({"drain", "draining", "drained", "fail", "failing", "maint", "not_responding", "inval",
                             "down", "reserved", "reboot_requested", "reboot_issued"})


#: The ``sinfo -N -O`` format :func:`parse_sinfo_nodes` reads (``:`` with no width: never cut; ``|`` suffix).
SINFO_NODE_FORMAT = "NodeList:|,StateLong:|,Gres:|,GresUsed:"


@dataclass(frozen=True)
class NodeGres:
    """One node of ``sinfo -N -O SINFO_NODE_FORMAT``: name, state, configured and used GRES."""

    name: str
    state: str
    gres: tuple[GresItem, ...]
    used: tuple[GresItem, ...]

    @property
    def usable(self) -> bool:
        return node_usable(self.state)

    def gpus(self, gres_type: str | None = None) -> int:
        return sum(g.count for g in self.gres if g.name == "gpu" and (gres_type is None or g.type == gres_type))

    def gpus_used(self, gres_type: str | None = None) -> int:
        return sum(g.count for g in self.used if g.name == "gpu" and (gres_type is None or g.type == gres_type))

    def gpu_types(self) -> set[str | None]:
        return {g.type for g in self.gres if g.name == "gpu"}


def parse_sinfo_nodes(text: str) -> list[NodeGres]:
    """Parse ``sinfo -N --noheader -O SINFO_NODE_FORMAT``; a node listed once per slurm partition is kept
    once. Raises ValueError for a line without four ``|``-separated fields."""
    seen: dict[str, NodeGres] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split("|")
        if len(f) != 4:
            raise ValueError(f"sinfo: expected NodeList|StateLong|Gres|GresUsed, got {line!r}")
        name = f[0].strip()
        if name and name not in seen:
            seen[name] = NodeGres(name, f[1].strip(), tuple(parse_gres(f[2])), tuple(parse_gres(f[3])))
    return list(seen.values())


@dataclass(frozen=True)
class GpuCapacity:
    """GPUs of a slurm partition (of one GRES type when asked), from :func:`parse_sinfo_nodes`.

    Attributes:
        total: GPUs on every node listed, usable or not.
        usable: GPUs on nodes that take new jobs (:func:`node_usable`).
        used: GPUs allocated to jobs on those usable nodes.
        used_all: GPUs allocated on every node (a draining node still runs its jobs).
    """

    total: int
    usable: int
    used: int
    used_all: int

    @property
    def free(self) -> int:
        """GPUs a new job could get now: usable minus used (>= 0)."""
        return max(0, self.usable - self.used)


def gpu_capacity(nodes: list[NodeGres], gres_type: str | None = None) -> GpuCapacity:
    """Sum :class:`GpuCapacity` over ``nodes`` (GPUs of ``gres_type`` only, when given)."""
    usable = [n for n in nodes if n.usable]
    return GpuCapacity(
        total=sum(n.gpus(gres_type) for n in nodes),
        usable=sum(n.gpus(gres_type) for n in usable),
        used=sum(min(n.gpus_used(gres_type), n.gpus(gres_type)) for n in usable),
        used_all=sum(n.gpus_used(gres_type) for n in nodes),
    )


def pending_for_type(pending_gres: list[str], gres_type: str | None) -> int:
    """How many of the pending jobs' tres-per-node texts (squeue ``%b``) may take GPUs of ``gres_type``:
    those asking that type or no type (``gres/gpu:1``, ``N/A``: a ``--gpus`` job); all of them for None."""
    if gres_type is None:
        return len(pending_gres)
    return sum(1 for g in pending_gres if {i.type for i in parse_gres(g) if i.name == "gpu"} <= {gres_type, None})
