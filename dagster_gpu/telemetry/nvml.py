"""NVML sampler: utilization and memory of the step's devices, by UUID, on a background thread.

Devices are those the scheduler gave the step: ``CUDA_VISIBLE_DEVICES`` entries (indices, ``GPU-…`` or
``MIG-…`` UUIDs; Slurm and the NVIDIA DRA driver set it), else every device NVML sees. Utilization is
``nvmlDeviceGetUtilizationRates().gpu`` (percent of the last sample period the GPU was busy), memory
``nvmlDeviceGetMemoryInfo().used`` (bytes -> MiB). Whenever NVML cannot be used the step still runs and
the summary carries ``unavailable_reason``.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Callable

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
    """

    def __init__(self, interval_s: float = 0.5, nvml=None, env: dict | None = None):
        if interval_s < 0.01:
            raise ValueError(f"interval_s must be >= 0.01 s, got {interval_s}")
        self.interval_s = interval_s
        self._env = env
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
    def _open(self) -> None:
        visible = _visible_devices(self._env)
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
            if visible is None:
                handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            else:
                handles = [self._handle_for(entry) for entry in visible]
        except Exception as e:
            self._reason = f"cannot open the step's GPUs {visible}: {type(e).__name__}: {e}"
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
            # depends on utilization, see worker/billing.py).
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
