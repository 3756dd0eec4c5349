"""The devices a unit was given, and the replicas that spread its model batches over them.

A unit whose request has N GPUs (Slurm ``--gres=gpu:2``, a pod whose ResourceClaim holds 2 devices, a local
worker with ``CUDA_VISIBLE_DEVICES=0,1``) is billed for N; the encoder embeds on all N:

* :func:`unit_devices` says which: an explicit list as given; ``auto`` / ``cuda`` every device torch sees
  (``cuda:0`` … ``cuda:{n-1}``: torch numbers the visible devices from 0 whatever ``CUDA_VISIBLE_DEVICES``
  names), else ``cpu``; ``cuda:K`` or ``cpu`` that one device.
* :func:`visible_devices` reads ``CUDA_VISIBLE_DEVICES`` by torch's own rules (``_parse_visible_devices`` in
  ``torch/cuda/__init__.py``, torch v2.15.0), which :func:`device_labels` uses to tie each torch device to the
  scheduler's entry (an index, a ``GPU-…`` or ``MIG-…`` UUID) in the materialization's metadata.
* :class:`DeviceReplicas` runs one thread per device replica (each holding its own model copy:
  :func:`replicate`) on one shared FIFO of model batches: batches are handed out in order to whichever replica
  is free, and each job's results come back in the order its batches were given, so vectors and row order are
  exactly one device's (the batches themselves, their padding and their rows, do not change).

Why threads and not sentence-transformers' own pool. ``SentenceTransformer.start_multi_process_pool`` /
``encode(..., device=[...])`` (sentence-transformers 6.2, ``sentence_transformers/base/model.py``
``start_multi_process_pool`` / ``_multi_process``) starts one *spawned process* per device and sends each
raw *texts* through a multiprocessing queue; each process tokenizes on its own thread, runs
``_inference`` and pickles the vectors back. That would bypass what the encoder does on the host (token-count
order, the tokenizer threads and lookahead, prompt-aware fast tokenization, chunk windows and their layout),
copy every vector through a pipe, and move the caller's model to the CPU (``self.to("cpu")``). The encoder
already has tokenized, padded model batches in pinned memory; a thread per replica only launches the model
(torch releases the GIL while kernels run) and copies its batch's vectors to the host on its own CUDA stream,
so a read batch's model batches run on all devices at once and the rest of the encoder is unchanged. With one
device no replica thread exists and the encoder's single-device path is the same as before.
"""

from __future__ import annotations

import copy
import os
import queue
import re
import threading
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Generic, Mapping, Sequence, TypeVar

R = TypeVar("R")
T = TypeVar("T")
U = TypeVar("U")

_DEVICE = re.compile(r"^(?P<type>[a-z]+)(?::(?P<index>\d+))?$")


def visible_devices(value: str | None) -> list[str] | None:
    """Entries of a ``CUDA_VISIBLE_DEVICES`` value as CUDA sees them; None when unset (every device).

    Torch's rules (``torch/cuda/__init__.py`` ``_parse_visible_devices``, v2.15.0), the CUDA runtime's: a list
    starting with ``GPU-`` (or ``MIG-``) is read up to the first entry without that prefix; otherwise each
    entry is read like ``strtoul`` (``"1gpu2"`` is 1) and the list ends at the first entry that is not a
    number or is negative; a repeated entry hides every device. So ``""``, ``"-1"``, ``"void"`` and Slurm's
    ``"NoDevFiles"`` give ``[]`` (no device). Entries come back as strings (``"0"``, ``"GPU-…"``).
    """
    if value is None:
        return None
    if value.startswith(("GPU-", "MIG-")):
        prefix = value[:4]
        out: list[str] = []
        for elem in value.split(","):
            if elem in out:
                return []
            if not elem.startswith(prefix):
                break
            out.append(elem)
        return out
    ids: list[int] = []
    for elem in value.split(","):
        m = re.match(r"^[+-]?\d+", elem.strip())
        x = int(m.group(0)) if m else -1
        if x in ids:
            return []
        if x < 0:
            break
        ids.append(x)
    return [str(i) for i in ids]


def normalize_device(device: str, current_cuda: int = 0) -> str:
    """``"cuda"`` -> ``"cuda:<current_cuda>"``; ``"cuda:1"``, ``"cpu"`` as given (lower case, stripped).

    Raises ValueError for a string that is not ``type`` or ``type:index``.
    """
    d = str(device).strip().lower()
    m = _DEVICE.match(d)
    if not m:
        raise ValueError(f"device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'")
    if m.group("type") == "cuda" and m.group("index") is None:
        return f"cuda:{current_cuda}"
    return d


def unit_devices(requested: str | Sequence[str] = "auto", *, cuda_count: int | None = None) -> list[str]:
    """The devices a unit embeds on.

    ``requested``: a list (each :func:`normalize_device`'d, in order; a device may repeat: two replicas on one
    GPU), ``"auto"`` / ``"cuda"`` (every CUDA device torch sees, ``cuda:0`` … ; ``auto`` falls back to
    ``["cpu"]`` when there is none, ``cuda`` to ``["cuda:0"]``, which fails where the model is loaded), or one
    device (``"cuda:1"``, ``"cpu"``). ``cuda_count``: the CUDA devices visible (None = ask torch).

    Raises ValueError for an empty list or a malformed device string.
    """
    if not isinstance(requested, str):
        devices = [normalize_device(d) for d in requested]
        if not devices:
            raise ValueError("devices: an empty list (give at least one device, e.g. ['cuda:0'])")
        return devices
    r = requested.strip().lower()
    if r not in ("auto", "cuda"):
        return [normalize_device(r)]
    n = cuda_device_count() if cuda_count is None else int(cuda_count)
    if n >= 1:
        return [f"cuda:{i}" for i in range(n)]
    return ["cpu"] if r == "auto" else ["cuda:0"]


def cuda_device_count() -> int:
    """CUDA devices torch can use in this process (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_labels(devices: Sequence[str], names: Sequence[str | None] | None = None,
                  env: Mapping[str, str] | None = None) -> list[str]:
    """One label per device for ``embedding/device_names``: ``cuda:0 NVIDIA H200 (GPU-5c1…)`` — the product
    name (``names``; None = ask torch) and, when ``CUDA_VISIBLE_DEVICES`` names it, the scheduler's entry
    for that device; ``cpu`` for the CPU."""
    env = os.environ if env is None else env
    visible = visible_devices(env.get("CUDA_VISIBLE_DEVICES"))
    out = []
    for i, d in enumerate(devices):
        m = _DEVICE.match(d)
        if not m or m.group("type") != "cuda":
            out.append(d)
            continue
        idx = int(m.group("index") or 0)
        name = names[i] if names is not None else _cuda_name(idx)
        label = f"{d} {name}" if name else d
        if visible and idx < len(visible):
            label += f" ({visible[idx]})"
        out.append(label)
    return out


def _cuda_name(index: int) -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(index)
    except Exception:  # noqa: BLE001 - a label only
        return None


def replicate(model, device: str):
    """A copy of the torch module ``model`` whose parameters and buffers are on ``device`` (copied there one
    tensor at a time, never doubling ``model``'s device memory); on ``model``'s own device the copy shares its
    tensors (inference only reads them). Tied weights stay tied. Everything else is ``copy.deepcopy``'d."""
    import torch

    memo: dict[int, Any] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in memo:
            continue
        moved = t.detach().to(device)
        memo[id(t)] = torch.nn.Parameter(moved, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) \
            else moved
    return copy.deepcopy(model, memo)


class _Job(Generic[U]):
    """The results of one ``DeviceReplicas.map`` call, filled by the replica threads."""

    def __init__(self, n: int):
        self._slots: list[Any] = [None] * n
        self._errors: dict[int, BaseException] = {}
        self._left = n
        self._lock = threading.Lock()
        self._done = threading.Event()
        if n == 0:
            self._done.set()

    def _put(self, j: int, value: Any = None, error: BaseException | None = None) -> None:
        with self._lock:
            if error is not None:
                self._errors[j] = error
            else:
                self._slots[j] = value
            self._left -= 1
            if self._left == 0:
                self._done.set()

    def wait(self, timeout: float | None = None) -> list[U]:
        """The results in the order of the items given to ``map``; re-raises the first failed item's error
        (by item order). Raises TimeoutError after ``timeout`` seconds."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"device replicas: {self._left} batch(es) still running after {timeout} s")
        if self._errors:
            raise self._errors[min(self._errors)]
        return list(self._slots)


class DeviceReplicas(Generic[R, T, U]):
    """One thread per replica, serving one FIFO of items: ``map(items)`` queues them in order, each goes to
    the first free replica, which runs ``run(replica, item)``; ``_Job.wait()`` gives the results in item order.

    Args:
        replicas: one per device (e.g. ``(model, device, stream)``).
        run: the work of one item on one replica (called on that replica's thread).
        setup: a context entered once on each replica's thread around all its work (e.g. inference mode, the
            replica's CUDA stream); None = none.
        names: a name per replica (thread names, ``items_done`` keys); default ``replica-<i>``.

    ``items_done[i]``: items replica i ran so far. ``close()`` stops the threads after their current item;
    items still queued fail with RuntimeError.
    """

    def __init__(self, replicas: Sequence[R], run: Callable[[R, T], U], *,
                 setup: Callable[[R], ContextManager] | None = None, names: Sequence[str] | None = None):
        if not replicas:
            raise ValueError("DeviceReplicas needs at least one replica")
        self.replicas = list(replicas)
        self.names = list(names) if names is not None else [f"replica-{i}" for i in range(len(self.replicas))]
        self.items_done = [0] * len(self.replicas)
        self._run = run
        self._setup = setup
        self._q: queue.Queue = queue.Queue()
        self._closed = False
        self._threads = [threading.Thread(target=self._serve, args=(i,), daemon=True,
                                          name=f"dagster-gpu-{self.names[i]}") for i in range(len(self.replicas))]
        for t in self._threads:
            t.start()

    def map(self, items: Sequence[T]) -> _Job[U]:
        """Queue ``items`` (after every earlier call's); returns their job. Raises RuntimeError when closed."""
        if self._closed:
            raise RuntimeError("DeviceReplicas is closed")
        job: _Job[U] = _Job(len(items))
        for j, item in enumerate(items):
            self._q.put((job, j, item))
        return job

    def _serve(self, i: int) -> None:
        replica = self.replicas[i]
        with (self._setup(replica) if self._setup else nullcontext()):
            while True:
                task = self._q.get()
                if task is None:
                    return
                job, j, item = task
                try:
                    value = self._run(replica, item)
                except BaseException as e:  # noqa: BLE001 - handed to the job's waiter
                    job._put(j, error=e)
                else:
                    job._put(j, value)
                self.items_done[i] += 1

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop the threads (after the item each is running); fail the items still queued."""
        if self._closed:
            return
        self._closed = True
        while True:
            try:
                task = self._q.get_nowait()
            except queue.Empty:
                break
            if task is not None:
                task[0]._put(task[1], error=RuntimeError("device replicas closed before this batch ran"))
        for _ in self._threads:
            self._q.put(None)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout_s)
