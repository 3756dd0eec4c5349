"""backend: auto — live state gathering and the policy's choice over configured backends."""

from __future__ import annotations

import sys
import types

from dagster_gpu.billing.ratecard import RateCard
from dagster_gpu.corpus.listing import CorpusSource
from dagster_gpu.executor.auto import gather_snapshot, step_size
from dagster_gpu.local.backend import LocalBackend
from dagster_gpu.policy import choose_placement
from dagster_gpu.policy.snapshot import DeviceGroup, SlurmState
from dagster_gpu.core.request import TAG_CORPUS_URL, GpuRequest


class _Handler:
    """The two things auto placement reads from GpuStepHandler."""

    def __init__(self, backends):
        self._backends = backends
        self.rate_card = RateCard.load()

    def backend(self, name):
        b = self._backends[name]
        if isinstance(b, Exception):
            raise b
        return b


class _Slurm:
    def __init__(self, free):
        self.free = free

    def policy_state(self):
        return SlurmState(pools=(DeviceGroup("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", 80.0, free=self.free, total=4),))


class _NoDriverNvml(types.ModuleType):
    """A ``pynvml`` whose nvmlInit fails as on a host without an NVIDIA driver."""

    def __init__(self):
        super().__init__("pynvml")
        self.inits = 0

    def nvmlInit(self):
        self.inits += 1
        raise RuntimeError("NVML Shared Library Not Found")


def test_unreachable_backend_is_recorded_and_skipped(tmp_path, monkeypatch):
    # the fact "this host has no GPU" is injected (the local backend asks NVML through `import pynvml`)
    nvml = _NoDriverNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    handler = _Handler({"local": LocalBackend(tmp_path), "slurm": _Slurm(free=2), "kubernetes": ConnectionError("connection refused")})
    snap = gather_snapshot(handler, ["local", "slurm", "kubernetes"])
    assert nvml.inits == 1 and snap.local.pools == ()  # NVML was asked, and saw no GPU
    assert snap.kubernetes.reachable is False and "ConnectionError: connection refused" in snap.kubernetes.reason
    p = choose_placement(GpuRequest(count=1), 100_000, snap)
    assert (p.backend, p.device) == ("slurm", "NVIDIA A100-SXM4-80GB")
    notes = {a.backend: a for a in p.alternatives}
    assert notes["kubernetes"].feasible is False and "connection refused" in notes["kubernetes"].note
    assert notes["local"].feasible is False
    # cost = count x the rate card's Slurm A100 rate (1.20 USD/GPU-h) x estimated billed runtime / 3600
    chosen = p.chosen
    assert chosen.runtime_s > snap.slurm.billed_overhead_s  # runtime includes the billed start-up
    assert abs(chosen.cost_usd - 1.20 * chosen.runtime_s / 3600) < 1e-12


def test_step_size_reads_the_partition_files(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"x" * 1234)
    (tmp_path / "b.txt").write_bytes(b"x" * 66)
    assert step_size({TAG_CORPUS_URL: str(tmp_path)}, ["a.txt"]).bytes == 1234
    ranged = step_size({TAG_CORPUS_URL: str(tmp_path)}, ["a.txt", "b.txt"])
    assert ranged.bytes == 1300 and [p.bytes for p in ranged.partitions] == [1234, 66]  # a ranged step: each and the sum
    partial = step_size({TAG_CORPUS_URL: str(tmp_path)}, ["a.txt", "missing"])
    assert partial.bytes is None and [p.bytes for p in partial.partitions] == [1234, None]
    assert step_size({TAG_CORPUS_URL: str(tmp_path)}, ["missing"]).bytes is None
    assert step_size({}, ["a.txt"]).bytes is None
    assert CorpusSource(str(tmp_path)).file_for_key("a.txt").size_bytes == 1234
