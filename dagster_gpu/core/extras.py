"""The optional extras of the distribution, checked where their code starts: one line naming what to install.

The base install is the orchestrator's (no torch, no dagster-k8s, whose releases pin one dagster patch release);
``[embed]`` adds what a worker embeds with, ``[kubernetes]`` dagster-k8s for a pod's ``container_context``. A process that
needs an extra and lacks it fails with :class:`MissingExtra`, whose message is one line, e.g.
``the local backend needs the embed extra: pip install 'dagster-gpu[embed]' (not installed: torch)``.
"""

from __future__ import annotations

from importlib.util import find_spec

#: extra -> the top-level modules its requirements provide (pyproject.toml's [project.optional-dependencies])
EXTRA_MODULES = {
    "embed": ("torch", "sentence_transformers", "huggingface_hub"),
    "index": ("lancedb",),
    "kubernetes": ("dagster_k8s",),
    "report": ("matplotlib",),
}


class MissingExtra(ModuleNotFoundError):
    """An extra of dagster-gpu that this process needs is not installed (the message is one line)."""


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` (a key of :data:`EXTRA_MODULES`) that this interpreter cannot import."""
    return [m for m in EXTRA_MODULES[extra] if not _importable(m)]


def _importable(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except ImportError:  # a finder that refuses the name (as an import of it would fail)
        return False


def require_extra(extra: str, what: str) -> None:
    """Raise MissingExtra (one line: ``<what> needs the <extra> extra: pip install 'dagster-gpu[<extra>]'
    (not installed: <modules>)``) unless every module of ``extra`` is importable here."""
    missing = missing_modules(extra)
    if missing:
        raise MissingExtra(f"{what} needs the {extra} extra: pip install 'dagster-gpu[{extra}]' "
                           f"(not installed: {', '.join(missing)})", name=missing[0])
