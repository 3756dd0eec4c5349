"""Models by id from a Hugging Face cache (hub layout, no network), revisions, errors, the files hash.

The fixture copies the packaged MiniLM into the layout huggingface_hub reads offline
(``<cache>/models--<org>--<name>/snapshots/<commit>/`` and ``refs/<name>`` holding the commit:
huggingface_hub 2.x ``_snapshot_download`` with ``local_files_only=True``; the layout ``hf download`` writes).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from dagster_gpu.embedding import model as model_mod
from dagster_gpu.embedding.model import ModelNotFound, files_revision, hub_cache, load_model, resolve_model_path

C1, C2 = "1" * 40, "2" * 40


def _snapshot(cache: Path, repo: str, commit: str, refs: dict[str, str]) -> Path:
    src = resolve_model_path("all-MiniLM-L6-v2")
    base = cache / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / commit
    shutil.copytree(src, snap, ignore=shutil.ignore_patterns("model.safetensors", "__pycache__"))
    os.symlink(src / "model.safetensors", snap / "model.safetensors")  # the hub's snapshots link into blobs/
    (base / "refs").mkdir(exist_ok=True)
    for ref, c in refs.items():
        (base / "refs" / ref).write_text(c)
    return snap


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hf") / "hub"
    _snapshot(cache, "acme/mini", C1, {"v1": C1})
    s2 = _snapshot(cache, "acme/mini", C2, {"main": C2})
    (s2 / "sentence_bert_config.json").write_text('{"max_seq_length": 128, "do_lower_case": false}')
    return cache


def test_model_by_id_at_main_and_at_a_revision(cache):
    m = load_model("acme/mini", device="cpu", cache_folder=str(cache))
    assert (m.revision, m.path, m.max_seq_length) == (C2, str(cache / "models--acme--mini" / "snapshots" / C2), 128)
    old = load_model("acme/mini", device="cpu", cache_folder=cache, revision="v1")
    assert (old.revision, old.max_seq_length) == (C1, 256)
    assert load_model("acme/mini", device="cpu", cache_folder=cache, revision=C1).revision == C1
    a, b = (x.model.encode(["same weights"], normalize_embeddings=True) for x in (m, old))
    assert float((a * b).sum()) > 0.9999


def test_cache_from_the_environment(cache, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(cache.parent))
    assert hub_cache() == cache
    assert resolve_model_path("acme/mini") == cache / "models--acme--mini" / "snapshots" / C2
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HOME", "/nonexistent")
    assert hub_cache() == cache and hub_cache("/x") == Path("/x")


def test_missing_model_or_revision_names_id_revision_and_cache(cache, tmp_path):
    with pytest.raises(ModelNotFound, match=r"model 'acme/mini' at revision 'v2': not in the Hugging Face cache "
                                            rf"'{cache}'.*refs \['main', 'v1'\]"):
        load_model("acme/mini", device="cpu", cache_folder=cache, revision="v2")
    with pytest.raises(ModelNotFound, match=rf"model 'acme/other' at revision 'main'.*'{tmp_path}'.*no models--acme--other"):
        resolve_model_path("acme/other", cache_folder=tmp_path)
    with pytest.raises(ModelNotFound, match="not a Hugging Face model id"):
        resolve_model_path("no such/dir here")


def test_trust_remote_code_is_passed_and_off_by_default(cache, monkeypatch):
    import sentence_transformers

    seen = []
    real = sentence_transformers.SentenceTransformer

    def spy(*args, **kwargs):
        seen.append(kwargs.get("trust_remote_code"))
        return real(*args, **kwargs)

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", spy)
    load_model("acme/mini", device="cpu", cache_folder=cache)
    load_model("acme/mini", device="cpu", cache_folder=cache, trust_remote_code=True)
    assert seen == [False, True]


def test_local_directory_revision_is_a_files_hash_computed_once(tmp_path, monkeypatch):
    src = resolve_model_path("all-MiniLM-L6-v2")
    d = tmp_path / "m"
    shutil.copytree(src, d, ignore=shutil.ignore_patterns("__pycache__"))
    m = load_model(str(d), device="cpu")
    assert m.revision.startswith("sha256:") and len(m.revision) == 23 and m.path == str(d)
    assert load_model("all-MiniLM-L6-v2", device="cpu").revision == m.revision  # same files, same hash
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda f, *a, **k: (opened.append(f), real_open(f, *a, **k))[1])
    assert files_revision(d) == m.revision and opened == []  # cached: no file read again
    monkeypatch.undo()
    (d / "README.md").write_text("docs do not change vectors")
    assert files_revision(d) == m.revision
    (d / "1_Pooling" / "config.json").write_text((d / "1_Pooling" / "config.json").read_text().replace("true", "false"))
    assert files_revision(d) != m.revision
    assert len(model_mod._HASHES) >= 2
    assert np.isfinite(m.model.encode(["x"])).all()
