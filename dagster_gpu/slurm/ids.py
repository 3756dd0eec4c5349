"""Slurm job ids and job array specs (pure, no I/O).

Forms Slurm prints (squeue ``%i``, sacct ``JobID``):

=====================  =============================================================
``123``                a job (or an array job id on its own)
``123_7``              array task 7 of array job 123
``123_[4-9%2]``        the pending tasks 4..9 of array job 123, throttle 2 (compact)
``123_[2,5,7-9]``      the pending tasks 2, 5, 7, 8, 9 of array job 123
``123_[1-13:2%4]``     the pending tasks 1, 3, 5, …, 13 of array job 123, throttle 4 (a stepped range)
``123+0``              component 0 of heterogeneous job 123
``123_7.batch``        a job step (``.batch``, ``.extern``, ``.0``) of a job or task
=====================  =============================================================

:func:`format_array_spec` builds the ``--array`` value (``0-39%4``) from indices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator

_ID = re.compile(
    r"""^(?P<job>\d+)
        (?:_(?:(?P<task>\d+)|\[(?P<ranges>[0-9,\-:]+)(?:%(?P<throttle>\d+))?\]|(?P<star>\*)))?
        (?:\+(?P<het>\d+))?
        (?:\.(?P<step>[A-Za-z0-9_\-]+))?$""",
    re.X,
)


class BadJobId(ValueError):
    """Not a Slurm job id form (the message quotes the text)."""


@dataclass(frozen=True)
class JobId:
    """A parsed Slurm job id.

    Attributes:
        job_id: the leading integer: the job id, or the array job id for array forms, or the
            heterogeneous job leader id for ``123+0``.
        task_id: the array task id of ``123_7``; None otherwise.
        task_ranges: inclusive ``(first, last)`` ranges of ``123_[2,5,7-9]`` (compact pending tasks).
        throttle: ``%N`` of a compact form, else None.
        het_offset: N of ``123+N``, else None.
        step: ``batch``, ``extern``, ``0``… of ``123.batch``, else None.
        raw: the text as given.
    """

    job_id: int
    task_id: int | None = None
    task_ranges: tuple[tuple[int, int], ...] = ()
    throttle: int | None = None
    het_offset: int | None = None
    step: str | None = None
    raw: str = ""

    @property
    def is_array_task(self) -> bool:
        return self.task_id is not None

    @property
    def is_compact(self) -> bool:
        """True for ``123_[…]`` (several pending tasks in one line)."""
        return bool(self.task_ranges)

    def task_ids(self) -> Iterator[int]:
        """The array task ids this id names: ``[task_id]`` or every index of the compact ranges."""
        if self.task_id is not None:
            yield self.task_id
        for a, b in self.task_ranges:
            yield from range(a, b + 1)

    def __str__(self) -> str:
        return self.raw or str(self.job_id)


def parse_job_id(text: str) -> JobId:
    """Parse any form in the module table. Raises :class:`BadJobId`."""
    t = text.strip()
    m = _ID.match(t)
    if not m:
        raise BadJobId(f"not a Slurm job id: {text!r}")
    ranges: tuple[tuple[int, int], ...] = ()
    if m.group("ranges"):
        ranges = parse_ranges(m.group("ranges"))
    return JobId(
        job_id=int(m.group("job")),
        task_id=int(m.group("task")) if m.group("task") else None,
        task_ranges=ranges,
        throttle=int(m.group("throttle")) if m.group("throttle") else None,
        het_offset=int(m.group("het")) if m.group("het") else None,
        step=m.group("step"),
        raw=t,
    )


def parse_ranges(text: str) -> tuple[tuple[int, int], ...]:
    """``2,5,7-9`` -> ``((2, 2), (5, 5), (7, 9))``; a stepped range ``1-13:2`` -> ``((1, 1), (3, 3), …,
    (13, 13))``. Slurm prints the step form for pending tasks whose indices are evenly spaced
    (``xlate_array_task_str()`` in ``src/common/slurm_protocol_defs.c``; SchedMD/slurm's own unit test
    ``testsuite/slurm_unit/common/slurm_protocol_defs/xlate_array_task_str-test.c`` expects ``2-18:2%9``).
    Raises :class:`BadJobId` for an empty or reversed range or a step below 1."""
    out: list[tuple[int, int]] = []
    for part in text.split(","):
        if not part:
            raise BadJobId(f"empty element in task range {text!r}")
        span, colon, step_text = part.partition(":")
        a, sep, b = span.partition("-")
        try:
            lo, hi = int(a), int(b) if sep else int(a)
            step = int(step_text) if colon else 1
        except ValueError:
            raise BadJobId(f"bad task range {part!r} in {text!r}") from None
        if hi < lo:
            raise BadJobId(f"reversed task range {part!r} in {text!r}")
        if step < 1 or (colon and not sep):
            raise BadJobId(f"bad step in task range {part!r} in {text!r}")
        if step == 1:
            out.append((lo, hi))
        else:
            out.extend((i, i) for i in range(lo, hi + 1, step))
    return tuple(out)


def parse_array_task_field(text: str) -> tuple[tuple[tuple[int, int], ...], int | None]:
    """squeue ``%K`` (array task id): ``7`` / ``4-9%2`` / ``2,5,7-9`` / ``1-13:2%4`` / ``N/A`` -> (ranges, throttle).

    ``N/A`` (not an array), and the other words Slurm prints for "no value" (``None``, ``Unknown``,
    ``(null)``, empty), give ``((), None)``. Raises :class:`BadJobId`.
    """
    t = text.strip()
    if t.lower() in ("", "n/a", "none", "unknown", "(null)"):
        return (), None
    body, _, thr = t.partition("%")
    return parse_ranges(body), (int(thr) if thr else None)


def compress_indices(indices: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``0-2,5,7-8`` (sorted, de-duplicated). Raises ValueError on a negative index."""
    xs = sorted(set(indices))
    if not xs:
        raise ValueError("no indices")
    if xs[0] < 0:
        raise ValueError(f"negative array index {xs[0]}")
    parts: list[str] = []
    start = prev = xs[0]
    for x in xs[1:]:
        if x == prev + 1:
            prev = x
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = x
    parts.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(parts)


def format_array_spec(indices: Iterable[int], throttle: int | None = None) -> str:
    """The ``sbatch --array`` value: ``0-39%4`` (throttle None or 0 means unthrottled).

    Raises ValueError for no indices, a negative index or a negative throttle.
    """
    spec = compress_indices(indices)
    if throttle is None or throttle == 0:
        return spec
    if throttle < 0:
        raise ValueError(f"throttle must be >= 0, got {throttle}")
    return f"{spec}%{throttle}"
