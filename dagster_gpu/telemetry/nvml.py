"""NVML sampler: utilization and memory of the step's devices, by UUID, on a background thread.

Devices are those the scheduler gave the step, in this order of knowledge:

1. ``device_uuids``: the UUIDs of the devices allocated to the step's DRA ResourceClaim (``GPU-…`` or
   ``MIG-…``, from the claim's results and the node's ResourceSlices:
   :func:`dagster_gpu.k8s.claim.allocated_device_uuids`). The NVIDIA DRA driver gives the container
   its device nodes through CDI, sets ``NVIDIA_VISIBLE_DEVICES=void`` and never ``CUDA_VISIBLE_DEVICES``
   (NVIDIA/k8s-dra-driver-gpu v25.12.0), so in a DRA pod the claim is what names them;
2. ``CUDA_VISIBLE_DEVICES`` entries (indices, ``GPU-…`` or ``MIG-…`` UUIDs; Slurm sets it);
3. else every device NVML sees (in a container: the device nodes it was given).

A GPU in MIG mode (``nvmlDeviceGetMigMode`` current = enabled) opened in 1 or 3 stands for its MIG devices
(``nvmlDeviceGetMaxMigDeviceCount``, ``nvmlDeviceGetMigDeviceHandleByIndex``; in a MIG claim's container
NVML shows the parent GPU plus the MIG devices the container may use), which are sampled instead: their
UUIDs, names (``NVIDIA A100-SXM4-80GB MIG 1g.10gb``) and memory. Utilization is
``nvmlDeviceGetUtilizationRates().gpu`` (percent of the last sample period the GPU was busy) where the
device supports it; NVML does not on MIG devices, and then the summary says so in ``unavailable_reason``.
Memory is ``nvmlDeviceGetMemoryInfo().used`` (bytes -> MiB). Whenever NVML cannot be used the step still
runs and the summary carries ``unavailable_reason``.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

from dagster_gpu.telemetry.stats import TelemetrySummary, summarize

MIB = 1024 * 1024


def _visible_devices(env: dict | None = None) -> list[str] | None:
    """Entries of CUDA_VISIBLE_DEVICES, [] when it hides every GPU, None when unset."""
    raw = (env if env is not None else os.environ).get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    entries = [e.strip() for e in raw.split(",") if e.strip()]
    if not entries or entries[0] in ("-1", "none", "NoDevFiles"):
        return []
    return entries


class NvmlSampler:
    """``with NvmlSampler(interval_s) as s: ...`` then ``s.summary()``.

    Args:
        interval_s: seconds between samples (>= 0.01).
        nvml: the ``pynvml`` module (nvidia-ml-py); injectable so tests can exercise failure paths.
        env: the environment read for ``CUDA_VISIBLE_DEVICES`` (default ``os.environ``).
        device_uuids: the allocated devices' UUIDs, or a function returning them (called once, when the
            sampler starts; an error or ``[]`` means unknown): see the module docstring.
    """

    def __init__(self, interval_s: float = 0.5, nvml=None, env: dict | None = None,
                 device_uuids: Sequence[str] | Callable[[], Sequence[str]] | None = None):
        if interval_s < 0.01:
            raise ValueError(f"interval_s must be >= 0.01 s, got {interval_s}")
        self.interval_s = interval_s
        self._env = env
        self._device_uuids = device_uuids
        self._nvml = nvml
        self._handles: list = []
        self._uuids: list[str] = []
        self._product: str | None = None
        self._reason: str | None = None
        self._util: list[float] = []
        self._mem: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._read_util: Callable | None = None

    # -- set-up -----------------------------------------------------------------------------------
    def _allocated(self) -> list[str]:
        uuids = self._device_uuids
        try:
            return [u for u in (uuids() if callable(uuids) else uuids or ()) if u]
        except Exception:  # the claim could not be read: fall back to what the environment and NVML say
            return []

    def _open(self) -> None:
        allocated = self._allocated()
        visible = None if allocated else _visible_devices(self._env)
        if visible == []:
            self._reason = "CPU-only: no GPU allocated to this step (CUDA_VISIBLE_DEVICES is empty)"
            return
        try:
            nvml = self._nvml
            if nvml is None:
                import pynvml as nvml  # nvidia-ml-py
            self._nvml = nvml
            nvml.nvmlInit()
        except ImportError:
            self._reason = "nvidia-ml-py is not installed"
            return
        except Exception as e:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            self._reason = f"no NVIDIA driver: NVML unavailable ({type(e).__name__}: {e})"
            return
        nvml = self._nvml
        try:
            if allocated:
                handles = [h for u in allocated for h in self._mig_devices_or_self(nvml.nvmlDeviceGetHandleByUUID(u))]
            elif visible is None:
                handles = [h for i in range(nvml.nvmlDeviceGetCount())
                           for h in self._mig_devices_or_self(nvml.nvmlDeviceGetHandleByIndex(i))]
            else:
                handles = [self._handle_for(entry) for entry in visible]
        except Exception as e:
            self._reason = f"cannot open the step's GPUs {allocated or visible or 'seen by NVML'}: {type(e).__name__}: {e}"
            return
        if not handles:
            self._reason = "CPU-only: NVML sees no GPU on this host"
            return
        self._handles = handles
        self._uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
        self._product = _text(nvml.nvmlDeviceGetName(handles[0]))
        failed = None
        for h, uuid in zip(handles, self._uuids):
            try:
                nvml.nvmlDeviceGetUtilizationRates(h)
            except Exception as e:
                failed = (h, uuid, e)
                break
        if failed is None:
            self._read_util = nvml.nvmlDeviceGetUtilizationRates
        else:
            # One device without utilization makes the mean meaningless: sample memory only (billing never
            # depends on utilization, see billing/measured.py).
            h, uuid, e = failed
            self._read_util = None
            if self._is_mig(h, uuid):
                self._reason = (
                    f"MIG device {uuid}: nvmlDeviceGetUtilizationRates is not supported on MIG instances "
                    f"({type(e).__name__}: {e}); per-instance busy % needs GPM metrics. Memory is still sampled."
                )
            else:
                self._reason = f"utilization not supported: {type(e).__name__}: {e}"

    def _is_mig(self, handle, uuid: str) -> bool:
        """A MIG instance: its UUID says so (``MIG-…``), or NVML does (``nvmlDeviceIsMigDeviceHandle``)."""
        if uuid.startswith("MIG-"):
            return True
        check = getattr(self._nvml, "nvmlDeviceIsMigDeviceHandle", None)
        try:
            return bool(check(handle)) if check else False
        except Exception:
            return False

    def _mig_devices_or_self(self, handle) -> list:
        """The MIG devices of a GPU in MIG mode that this process can open, else ``[handle]``."""
        nvml = self._nvml
        try:
            current = nvml.nvmlDeviceGetMigMode(handle)[0]
        except Exception:  # NotSupported: no MIG on this GPU (or a MIG handle itself)
            return [handle]
        if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
            return [handle]
        migs = []
        for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                migs.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i))
            except Exception:  # NVMLError_NotFound: no MIG device at this index (or not ours)
                continue
        return migs or [handle]

    def _handle_for(self, entry: str):
        nvml = self._nvml
        if entry.isdigit():
            return nvml.nvmlDeviceGetHandleByIndex(int(entry))
        return nvml.nvmlDeviceGetHandleByUUID(entry)

    # -- sampling ---------------------------------------------------------------------------------
    def sample_once(self) -> None:
        """Take one sample of every device (utilization averaged, memory max)."""
        nvml = self._nvml
        mem = []
        util = []
        for h in self._handles:
            try:
                mem.append(nvml.nvmlDeviceGetMemoryInfo(h).used / MIB)
                if self._read_util:
                    util.append(float(self._read_util(h).gpu))
            except Exception:
                continue
        if mem:
            self._mem.append(max(mem))
        if util:
            self._util.append(sum(util) / len(util))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample_once()

    def __enter__(self) -> "NvmlSampler":
        self._open()
        if self._handles:
            self.sample_once()
            self._thread = threading.Thread(target=self._loop, name="dagster-gpu-nvml", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self.sample_once()
        if self._handles:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass

    def summary(self) -> TelemetrySummary:
        return summarize(self._util, self._mem, self._uuids, self._product, self._reason)


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML reports it: ``uuid``, ``product`` name, ``memory_gib`` (total, GiB)."""

    uuid: str
    product: str
    memory_gib: float


def list_gpus(nvml=None) -> list[GpuInfo]:
    """Every GPU NVML sees on this host ([] without a driver or GPU)."""
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
    except Exception:
        return []
    try:
        out = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            out.append(GpuInfo(_text(nvml.nvmlDeviceGetUUID(h)), _text(nvml.nvmlDeviceGetName(h)), nvml.nvmlDeviceGetMemoryInfo(h).total / 2**30))
        return out
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
