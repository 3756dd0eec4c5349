"""Backends by name: how each is built from its section of gpu_executor's config.

One table, :data:`BACKENDS`, none special: each backend's module exposes ``config_field() -> dagster.Field``
(its config section), ``configured(section | None) -> bool`` (whether gpu_executor's config makes it usable)
and ``build_backend(section, config, default_log_dir) -> Backend``. ``local`` is configured unless its
section disables it; ``slurm`` and ``kubernetes`` when their section is present. Selecting a backend whose
section is absent and required raises BackendNotConfigured with what to add.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from dagster_gpu.contracts import Backend, BackendNotConfigured
from dagster_gpu.k8s import backend as kubernetes_backend
from dagster_gpu.local import backend as local_backend
from dagster_gpu.slurm import backend as slurm_backend

#: Every backend's module by the name gpu_executor's config gives its section.
BACKENDS = {
    "local": local_backend,
    "slurm": slurm_backend,
    "kubernetes": kubernetes_backend,
}


def configured_backends(config: Mapping[str, Any]) -> list[str]:
    """Names of backends usable under ``config`` (``local`` unless disabled, plus each remote section given)."""
    return [n for n, module in BACKENDS.items() if module.configured(config.get(n))]


def build_backend(name: str, config: Mapping[str, Any], default_log_dir: Path) -> Backend:
    """Instantiate backend ``name``. Raises BackendNotConfigured naming the missing config section."""
    module = BACKENDS.get(name)
    if module is None:
        raise BackendNotConfigured(f"unknown backend {name!r}; expected local, slurm or kubernetes")
    section = config.get(name)
    if section is None and not module.configured(None):
        raise BackendNotConfigured(
            f"the {name} backend is not configured: add a `{name}:` section to gpu_executor's config "
            f"(execution: config: {name}: ...), see docs/reference/configuration.md"
        )
    return module.build_backend(None if section is None else dict(section), config, default_log_dir)
