"""What fraction of a GPU a MIG slice is (pure, no I/O): compute slices of the profile ÷ slices of its parent.

A MIG profile is named as NVML, Slurm's ``AutoDetect=nvml`` and the NVIDIA DRA driver name it:
``<slices>g.<GB>gb`` with an optional ``+me`` (media extensions), e.g. ``1g.10gb``, ``2g.12gb``, ``1g.6gb+me``.
Slices per parent GPU, from the NVIDIA Multi-Instance GPU User Guide, "Supported GPUs" (max number of
instances) and "Supported MIG Profiles"
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html): A100 (40/80 GB),
H100, H20, H200, GH200, B200, GB200: 7; A30: 4 (profiles 1g.6gb, 2g.12gb, 4g.24gb); RTX PRO 6000 Blackwell:
4; RTX PRO 5000 Blackwell: 2. The one rule for the rate card, the cost policy, the Slurm and the Kubernetes
backends.
"""

from __future__ import annotations

import re

#: A MIG profile: ``<slices>g.<GB>gb`` with an optional ``+me``.
MIG_PROFILE = re.compile(r"^(?P<g>\d+)g\.(?P<gb>\d+)gb(?:\+me)?$")

#: Compute slices of a whole GPU, by product name pattern (first match wins; NVIDIA MIG User Guide, see module doc).
PARENT_SLICES: tuple[tuple[re.Pattern, int], ...] = (
    (re.compile(r"\bA30\b", re.I), 4),
    (re.compile(r"RTX PRO 6000", re.I), 4),
    (re.compile(r"RTX PRO 5000", re.I), 2),
    (re.compile(r"\b(A100|H100|H20|H200|GH200|B200|GB200)\b", re.I), 7),
)
#: Profiles only an A30 has (its 24 GB in quarters), for when the parent product is not known.
A30_PROFILES = frozenset({"1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"})


def mig_slices(profile: str, parent_product: str | None = None) -> int:
    """Compute slices of the GPU a MIG ``profile`` is cut from: by the parent product when it names one in
    :data:`PARENT_SLICES`, else 4 for an A30-only profile, else 7 (A100/H100 family)."""
    for pattern, n in PARENT_SLICES:
        if parent_product and pattern.search(parent_product):
            return n
    return 4 if profile in A30_PROFILES else 7


def slice_fraction(profile: str, parent_product: str | None = None) -> float | None:
    """Fraction of the parent GPU a slice of ``profile`` is (``1g.10gb`` -> 1/7, ``1g.6gb`` -> 1/4, ``4g.24gb``
    -> 1, at most 1.0), or None when ``profile`` is not a MIG profile."""
    m = MIG_PROFILE.match(profile)
    return min(1.0, int(m["g"]) / mig_slices(profile, parent_product)) if m else None
