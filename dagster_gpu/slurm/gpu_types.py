"""Typed GPU requests on Slurm: which GRES type or node feature a step asks for, and what fraction of a GPU a
MIG GRES is (pure, no I/O).

A site with more than one kind of GPU in a slurm partition names its kinds in gres.conf
(``Name=gpu Type=a100 File=…``, MIG slices with ``AutoDetect=nvml`` as ``gpu:1g.10gb``) or as node
features (``Features=h100`` in slurm.conf). The Slurm backend's ``gpu_types`` setting maps each product to
that name; :func:`select_gpu_type` picks the entry a request (``gpu-product`` prefix, ``gpu-memory-gib``,
``mig-ok``) fits, and :func:`sbatch_gres` turns it into ``--gres=gpu:<type>:<n>`` and/or
``--constraint=<feature>``, so the step lands on, and is billed as, the GPU it asked for.

MIG: a GRES type that is a MIG profile (``1g.10gb``, ``2g.12gb``, ``1g.6gb+me``) is billed as its fraction of
the parent GPU: compute slices of the profile ÷ slices of the parent (:mod:`dagster_gpu.billing.mig`, the rule
the rate card and the Kubernetes backend use too, with its slices per parent from the NVIDIA MIG User Guide:
A100/H100 family 7, A30 4).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from dagster_gpu.billing.mig import A30_PROFILES, MIG_PROFILE, PARENT_SLICES, mig_slices, slice_fraction  # noqa: F401


class GpuTypeError(ValueError):
    """A request no configured GPU type fits, or a type entry that cannot be used; the message says which."""


def mig_profile(gres_type: str | None) -> str | None:
    """``1g.10gb`` -> ``1g.10gb``; ``a100`` / None -> None."""
    return gres_type if gres_type and MIG_PROFILE.match(gres_type) else None


def mig_fraction(profile: str, parent_product: str | None = None) -> float:
    """Fraction of the parent GPU a slice of ``profile`` is: ``1g.10gb`` of an A100 -> 1/7, ``2g.12gb`` of an
    A30 -> 2/4, ``4g.24gb`` -> 1. Raises GpuTypeError for a name that is not a MIG profile."""
    fraction = slice_fraction(profile, parent_product)
    if fraction is None:
        raise GpuTypeError(f"not a MIG profile: {profile!r} (expected e.g. '1g.10gb')")
    return fraction


@dataclass(frozen=True)
class GpuType:
    """One kind of GPU of the slurm partition (an item of the ``gpu_types`` setting).

    Attributes:
        product: the (parent) GPU's product name, as NVML reports it and the rate card prices it.
        gres: the gres.conf ``Type`` (``a100``; a MIG profile ``1g.10gb`` for slices), or None: untyped.
        constraint: a node feature for ``--constraint`` (``h100``), or None.
        memory_gib: memory of one device in GiB (of the slice, for MIG).
    """

    product: str
    gres: str | None = None
    constraint: str | None = None
    memory_gib: float | None = None

    @property
    def mig_profile(self) -> str | None:
        return mig_profile(self.gres)

    @property
    def fraction(self) -> float:
        """Fraction of a GPU one device of this type is (1.0 unless a MIG slice)."""
        return mig_fraction(self.mig_profile, self.product) if self.mig_profile else 1.0

    @property
    def device(self) -> str:
        """The rate-card device type: the product, or ``mig-<profile>``."""
        return f"mig-{self.mig_profile}" if self.mig_profile else self.product


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


def check_gpu_types(types: Sequence[GpuType]) -> None:
    """Raise GpuTypeError for an entry whose GRES type or feature is not a plain Slurm name (it becomes an
    sbatch argv item) or whose memory is negative."""
    for t in types:
        for what, v in (("gres", t.gres), ("constraint", t.constraint)):
            if v is not None and not _NAME.match(v):
                raise GpuTypeError(f"slurm.gpu_types entry for {t.product!r}: {what} {v!r} is not a Slurm name")
        if t.memory_gib is not None and t.memory_gib < 0:
            raise GpuTypeError(f"slurm.gpu_types entry for {t.product!r}: memory_gib must be >= 0")


def select_gpu_type(types: Sequence[GpuType], product: str | None, memory_gib: float | None,
                    mig_ok: bool = False) -> GpuType | None:
    """The type a request fits: product names starting with ``product`` (case ignored), at least
    ``memory_gib`` per device, MIG slices only when ``mig_ok``; the smallest fitting memory wins (then the
    first listed). None for an untyped request (no product, no memory) or when no types are configured.
    Raises GpuTypeError when the request is typed and nothing fits (the message lists the types)."""
    if not types or (product is None and memory_gib is None):
        return None
    fits = [
        t for t in types
        if (product is None or t.product.lower().startswith(product.lower()))
        and (memory_gib is None or (t.memory_gib is not None and t.memory_gib >= memory_gib))
        and (mig_ok or t.mig_profile is None)
    ]  # fmt: skip
    if not fits:
        known = ", ".join(f"{t.product} ({t.gres or 'untyped'}, {t.memory_gib} GiB)" for t in types)
        raise GpuTypeError(
            f"no slurm.gpu_types entry fits gpu-product={product!r} gpu-memory-gib={memory_gib} mig-ok={mig_ok}; "
            f"configured: {known}"
        )
    return min(fits, key=lambda t: (t.memory_gib if t.memory_gib is not None else float("inf")))


def sbatch_gres(t: GpuType | None, count: int) -> list[str]:
    """sbatch options for ``count`` devices of type ``t``: ``["--gres=gpu:a100:2"]``,
    ``["--gres=gpu:1", "--constraint=h100"]``; untyped ``["--gres=gpu:<count>"]`` when ``t`` is None."""
    if t is None:
        return [f"--gres=gpu:{count}"]
    opts = [f"--gres=gpu:{t.gres}:{count}" if t.gres else f"--gres=gpu:{count}"]
    if t.constraint:
        opts.append(f"--constraint={t.constraint}")
    return opts


def from_settings(items: Sequence[Mapping | GpuType]) -> tuple[GpuType, ...]:
    """``gpu_types`` setting items (mappings or GpuType) as checked GpuTypes. Raises GpuTypeError."""
    out = []
    for it in items:
        if isinstance(it, GpuType):
            out.append(it)
            continue
        unknown = set(it) - {"product", "gres", "constraint", "memory_gib"}
        if unknown or "product" not in it:
            raise GpuTypeError(f"slurm.gpu_types item {dict(it)!r}: needs product, may have gres, constraint, memory_gib")
        mem = it.get("memory_gib")
        out.append(GpuType(str(it["product"]), it.get("gres"), it.get("constraint"), float(mem) if mem is not None else None))
    check_gpu_types(out)
    return tuple(out)
