"""Deprecated import path: the source versions moved to :mod:`dagster_gpu.partitions.source_versions`.

Kept for code locations that import from here (``from dagster_gpu.instance.source_versions import corpus_source``);
each name read here warns with its new import.
"""

from __future__ import annotations

import warnings
from typing import Any

from dagster_gpu.partitions import source_versions as _moved


def __getattr__(name: str) -> Any:
    value = getattr(_moved, name)  # AttributeError, as for any module, for a name it never had
    new = "from dagster_gpu import corpus_source" if name == "corpus_source" else f"from {_moved.__name__} import {name}"
    warnings.warn(f"dagster_gpu.instance.source_versions is deprecated and goes in the next minor release: {new}",
                  DeprecationWarning, stacklevel=2)
    return value
