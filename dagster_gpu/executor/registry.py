"""Backends by name: how each is built from its section of gpu_executor's config.

``local`` is always available. ``slurm`` and ``kubernetes`` are the modules of :data:`REMOTE_BACKENDS`, each
exposing ``config_field() -> dagster.Field`` (its config section) and ``build_backend(section: dict, config)
-> Backend``. A backend whose section is absent from the executor config is not configured: selecting it
raises BackendNotConfigured with what to add.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from dagster_gpu.contracts import Backend, BackendNotConfigured
from dagster_gpu.k8s import backend as kubernetes_backend
from dagster_gpu.local.backend import LocalBackend, LocalSettings
from dagster_gpu.instance.settings import from_section
from dagster_gpu.slurm import backend as slurm_backend

#: The remote backends' modules by the name gpu_executor's config gives their sections.
REMOTE_BACKENDS = {
    "slurm": slurm_backend,
    "kubernetes": kubernetes_backend,
}


def configured_backends(config: Mapping[str, Any]) -> list[str]:
    """Names of backends usable under ``config``: ``local`` unless disabled, plus each remote section given."""
    names = ["local"] if from_section(LocalSettings, config.get("local") or {}).enabled else []
    names += [n for n in REMOTE_BACKENDS if config.get(n) is not None]
    return names


def build_backend(name: str, config: Mapping[str, Any], default_log_dir: Path) -> Backend:
    """Instantiate backend ``name``. Raises BackendNotConfigured naming the missing config section."""
    if name == "local":
        s = from_section(LocalSettings, config.get("local") or {})
        return LocalBackend(log_dir=s.log_dir or default_log_dir, cuda_visible_devices=s.cuda_visible_devices,
                            terminate_grace_s=s.terminate_grace_seconds, settle_wait_s=s.settle_wait_seconds)
    if name not in REMOTE_BACKENDS:
        raise BackendNotConfigured(f"unknown backend {name!r}; expected local, slurm or kubernetes")
    section = config.get(name)
    if section is None:
        raise BackendNotConfigured(
            f"the {name} backend is not configured: add a `{name}:` section to gpu_executor's config "
            f"(execution: config: {name}: ...), see README.md"
        )
    return REMOTE_BACKENDS[name].build_backend(dict(section), config)
