"""Rate card and metering (pure)."""

from dagster_gpu.billing.metering import cost_usd, gpu_seconds
from dagster_gpu.billing.ratecard import RateCard, RateCardError, mig_fraction

__all__ = ["RateCard", "RateCardError", "cost_usd", "gpu_seconds", "mig_fraction"]
