"""Decision latency of the cost policy per step, planning a 1,000-partition backfill.

    .venv/bin/python bench/policy_latency.py [--partitions 1000]

The snapshot: Slurm with 10 A100 (throttle %10) and 3 other GPU types, Kubernetes with 10 A100, 8 H100
and MIG pools (1g.10gb, 2g.20gb, 3g.40gb) — 8 pools in all — and a local GPU host. Each partition
(sizes 10 MB-1 GB, deterministic) is decided on the snapshot left by the previous ones
(``after_submit``), so pending counts climb to ~1,000. Prints p50/p99/max per decision in ms and the p99
against the policy's budget (:data:`BUDGET_MS`, 10 ms per decision: a step's placement must not slow a
backfill's launches; the bound a unit test used to assert, here where load on the host cannot fail a test).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dagster_gpu.billing.ratecard import RateCard  # noqa: E402
from dagster_gpu.policy import (  # noqa: E402
    DeviceGroup, GpuRequest, KubernetesState, LocalState, RuntimeModel, SlurmState, Snapshot, StepSize,
    after_submit, decide,
)

A100, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
BUDGET_MS = 10.0  # per decision


def snapshot() -> Snapshot:
    slurm = SlurmState(pools=(DeviceGroup(A100, A100, 80, 10, 10), DeviceGroup(H100, H100, 80, 2, 8),
                              DeviceGroup("NVIDIA H200", "NVIDIA H200", 141, 0, 4),
                              DeviceGroup("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", 40, 4, 4)),
                       array_throttle=10)
    k8s = KubernetesState(pools=(DeviceGroup(A100, A100, 80, 10, 10), DeviceGroup(H100, H100, 80, 8, 8),
                                 DeviceGroup("mig-1g.10gb", A100, 10, 14, 14, mig_profile="1g.10gb"),
                                 DeviceGroup("mig-2g.20gb", A100, 20, 6, 6, mig_profile="2g.20gb"),
                                 DeviceGroup("mig-3g.40gb", A100, 40, 4, 4, mig_profile="3g.40gb")))
    local = LocalState(pools=(DeviceGroup(A100, A100, 80, 1, 1),))
    return Snapshot(rate_card=RateCard.load(), slurm=slurm, kubernetes=k8s, local=local)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=1000)
    a = ap.parse_args(argv)
    snap = snapshot()
    req = GpuRequest(count=1, memory_gib=2.0, mig_ok=True, deadline_s=4 * 3600)
    model = RuntimeModel(texts_per_second=2000.0, gpu_busy=0.3, n_history=20)
    times, cpu, backends = [], [], {}
    for i in range(a.partitions):
        size = StepSize(bytes=10_000_000 + (i * 7_919_000) % 1_000_000_000)
        t, c = time.perf_counter(), time.thread_time()
        p = decide(req, size, snap, model=model)
        times.append((time.perf_counter() - t) * 1000)
        cpu.append((time.thread_time() - c) * 1000)
        snap = after_submit(snap, p.backend, p.device, p.product)
        backends[f"{p.backend}/{p.device}"] = backends.get(f"{p.backend}/{p.device}", 0) + 1
    print(f"decisions: {len(times)}; pending at the end: {snap.slurm.pending + snap.kubernetes.pending}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for label, xs in (("wall", sorted(times)), ("CPU (thread time)", sorted(cpu))):
        q = lambda f: xs[min(len(xs) - 1, int(f * len(xs)))]  # noqa: E731
        print(f"  {label} ms per decision: mean {statistics.fmean(xs):.3f}, p50 {statistics.median(xs):.3f}, "
              f"p99 {q(0.99):.3f}, max {xs[-1]:.3f}; p99 / {BUDGET_MS:g} ms budget = {q(0.99) / BUDGET_MS:.3f}")
    print("placements:", dict(sorted(backends.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
