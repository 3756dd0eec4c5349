"""The settings framework: a backend's section of gpu_executor's config is one frozen dataclass, whose Dagster
config schema and parsing are generated from it (:mod:`dagster_gpu.settings.schema`)."""
