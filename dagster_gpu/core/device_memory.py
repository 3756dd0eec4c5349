"""What ``memory_gib: N`` matches (pure): a device sold as N GB, judged on the memory its driver reports.

A user writes the marketed size (``80`` for an "80GB" H100). Drivers publish less: the NVIDIA DRA driver's
``memory`` capacity is NVML's total (``cmd/gpu-kubelet-plugin/deviceinfo.go`` in NVIDIA/k8s-dra-driver-gpu
v25.12.0: ``memoryBytes``) or, for a MIG device, the GPU-instance profile's ``MemorySizeMB`` in MiB
(``partitions.go``), and ``nvidia-smi`` shows the same totals. Recorded totals and their share of the
marketed size:

==============================  ==========  =======
device                          reported    share
==============================  ==========  =======
H100 80GB HBM3                  81559 MiB   0.9956
L4 (24 GB, ECC on)              23034 MiB   0.9373
Tesla T4 (16 GB, ECC on)        15360 MiB   0.9375
A100-80GB MIG 1g.10gb           9728 MiB    0.95
A100-40GB MIG 1g.5gb            4864 MiB    0.95
==============================  ==========  =======

(nvidia-smi on those GPUs; the MIG figures are the profiles' sizes in ``nvidia-smi mig -lgip``, 9.50 and
4.75 GiB.) GDDR parts lose 1/16 to ECC, HBM parts well under 1 %.

Rule: a device of ``M`` MiB satisfies ``memory_gib: N`` when ``M >= N * 1024 * MARKETED_SHARE`` with
:data:`MARKETED_SHARE` = 0.93, i.e. it holds at least 93 % of N GiB. Every device above matches its own
marketed size, and no neighbouring marketed size that differs by more than 7 % matches (a 40 GB A100 does
not satisfy ``48``, an 80 GB part does not satisfy ``94``). Sizes closer than that (94 vs 96 GB,
180 vs 192 GB) are not told apart by memory: name the product (``gpu-product``) for those.
"""

from __future__ import annotations

import math

#: share of the marketed size a device must report (module docstring: lowest recorded share 0.937)
MARKETED_SHARE = 0.93


def min_memory_mib(gib: float) -> int:
    """Smallest reported device memory (MiB, whole) that satisfies ``memory_gib: gib``:
    ``floor(gib * 1024 * MARKETED_SHARE)`` (80 -> 76185, 10 -> 9523). Raises ValueError for a negative or
    non-finite ``gib``."""
    if not isinstance(gib, (int, float)) or not math.isfinite(gib) or gib < 0:
        raise ValueError(f"memory_gib must be finite and >= 0, got {gib!r}")
    return math.floor(gib * 1024 * MARKETED_SHARE)


def memory_fits(device_gib: float, requested_gib: float | None) -> bool:
    """Whether a device reporting ``device_gib`` GiB satisfies ``memory_gib: requested_gib`` (None: any)."""
    if requested_gib is None:
        return True
    return device_gib * 1024 + 1e-6 >= min_memory_mib(requested_gib)
