"""One MIG slice rule for every backend (dagster_gpu.billing.mig): an A30 is cut into 4 compute slices, the
A100/H100 family into 7 (NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles"), so a 1g.6gb slice
of an A30 is 1/4 of a GPU on the rate card, in the cost policy, on Kubernetes and on Slurm alike."""

from __future__ import annotations

import pytest

from dagster_gpu.billing.ratecard import RateCard, RateCardError, mig_fraction, rate_from_table
from dagster_gpu.k8s.billing import pod_interval_metadata
from dagster_gpu.k8s.handle import PodHandle
from dagster_gpu.k8s import manifests as m
from dagster_gpu.policy.snapshot import DeviceGroup
from dagster_gpu.core.request import GpuRequest
from dagster_gpu.slurm import gpu_types

A30 = "NVIDIA A30"
A100 = "NVIDIA A100-SXM4-80GB"


@pytest.mark.parametrize("profile,parent,fraction", [
    ("mig-1g.6gb", None, 1 / 4), ("1g.6gb", A30, 1 / 4), ("mig-2g.12gb", A30, 2 / 4), ("4g.24gb", None, 1.0),
    ("1g.6gb+me", None, 1 / 4), ("1g.10gb", A100, 1 / 7), ("mig-3g.40gb", None, 3 / 7), ("1g.12gb", "NVIDIA H100 80GB HBM3", 1 / 7),
    ("1g.10gb+me", A100, 1 / 7),
])
def test_the_rate_card_and_slurm_agree_on_slices_per_parent(profile, parent, fraction):
    assert mig_fraction(profile, parent) == pytest.approx(fraction)
    assert gpu_types.mig_fraction(profile.removeprefix("mig-"), parent) == pytest.approx(fraction)


def test_an_a30_slice_is_priced_at_a_quarter_of_its_parent():
    table = {"default": 1.0, A30: 0.8}
    assert rate_from_table(table, "mig-1g.6gb", A30) == pytest.approx(0.2)
    assert RateCard({"kubernetes": table}).rate("kubernetes", "mig-2g.12gb", A30) == pytest.approx(0.4)
    # a Slurm GRES with media extensions (gpu:1g.10gb+me) is a MIG slice, not an unknown full GPU
    assert rate_from_table({"default": 7.0}, "mig-1g.10gb+me", A100) == pytest.approx(1.0)
    with pytest.raises(RateCardError, match="not a MIG profile"):
        mig_fraction("mig-1g")


def test_an_a30_slice_on_kubernetes_is_a_quarter_in_the_claim_the_bill_and_the_policy():
    choice = m.device_choice(GpuRequest(mig_ok=True, product=A30), "mig-1g.6gb", m.PodSettings(secret_env=()))
    assert (choice.device_type, choice.mig_profile, choice.device_fraction) == ("mig-1g.6gb", "1g.6gb", 0.25)
    handle = PodHandle(namespace="ns", pod="p", pod_uid="u", device_type=choice.device_type,
                       device_fraction=choice.device_fraction, product=choice.product)
    md = pod_interval_metadata(handle, 1000.0, 1040.0, "claim", [], {"default": 1.0, A30: 0.9})
    assert (md["billing/gpu_seconds"], md["billing/rate_usd_per_gpu_hour"]) == (10.0, 0.9)
    pool = DeviceGroup("mig-1g.6gb", A30, 6.0, free=4, total=4, mig_profile="1g.6gb")
    assert pool.fraction == 0.25
    # the default mig_profile's firstAvailable slice with no product named: the A30-only profile says 4
    fa = m.device_choice(GpuRequest(mig_ok=True), None, m.PodSettings(secret_env=(), mig_profile="1g.6gb"))
    assert fa.alternatives[0].device_fraction == 0.25
