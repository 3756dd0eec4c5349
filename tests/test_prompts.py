"""Prompts and output options against ``SentenceTransformer.encode`` (sentence-transformers 6.2), row by row,
on test models made from the packaged MiniLM (tests/prompt_models.py): a default "document" prompt, named
and explicit prompts, a Pooling with include_prompt=False; truncate_dim, normalize, float16 output.

How encode applies a prompt: ``BaseModel._resolve_prompt`` (``sentence_transformers/base/model.py``) picks it,
``Transformer.preprocess`` prepends it to each text and sets ``prompt_length`` from ``_get_prompt_length``
(``sentence_transformers/base/modules/transformer.py``), and ``Pooling.forward`` zeroes the first
``prompt_length`` positions of the attention mask when ``include_prompt`` is False
(``sentence_transformers/sentence_transformer/modules/pooling.py``); ``SentenceTransformer._inference``
(``sentence_transformers/sentence_transformer/model.py``) truncates to ``truncate_dim`` and then normalises.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer

from dagster_gpu.embedding.encoder import Encoder
from dagster_gpu.embedding.prompts import query_prompt, resolve_prompt
from dagster_gpu.embedding.tokenize import FastTokenizer
from prompt_models import make_prompt_model

TEXTS = [
    "A penny saved is a penny earned.",
    " ".join(["word"] * 300),  # truncated, with or without the prompt
    "x",
    "Café, naïve, 日本語のテキスト. 🙂",
    " ".join(["word"] * 252),  # 253 + prompt's 2 + [CLS]/[SEP]: 256 with "passage: ", not truncated
    "Two lines\n  of wisdom from the terminal.",
    "The quick brown fox jumps over the lazy dog. " * 8,
    "Q: What's the difference?\nA: None, really.",
]

#: encode's keyword arguments for each case: the default prompt, named prompts, explicit ones, the empty one.
CASES = [{}, {"prompt_name": "query"}, {"prompt_name": "document"}, {"prompt": "Represent this sentence: "},
         {"prompt": ""}]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompt-models")
    return {inc: SentenceTransformer(str(make_prompt_model(root / f"include-{inc}", include_prompt=inc)), device="cpu")
            for inc in (True, False)}


def test_resolve_prompt_follows_sentence_transformers(models):
    st = models[True]
    assert resolve_prompt(st) == ("passage: ", "document")
    assert resolve_prompt(st, prompt_name="query") == ("query: ", "query")
    assert resolve_prompt(st, prompt="") == ("", None)  # an explicit empty prompt switches the default off
    assert resolve_prompt(st, prompt_name="query", prompt="p: ") == ("p: ", None)  # prompt beats prompt_name
    for kw in CASES:  # the same text as sentence-transformers' own rule
        assert resolve_prompt(st, **kw)[0] == (st._resolve_prompt(kw.get("prompt"), kw.get("prompt_name")) or "")
    with pytest.raises(ValueError, match=r"prompt_name 'passage' is not one of the model's prompts \['document', 'query'\]"):
        resolve_prompt(st, prompt_name="passage")
    assert query_prompt(st) == "query: "


def _packaged() -> str:
    from dagster_gpu.embedding.model import resolve_model_path

    return str(resolve_model_path("all-MiniLM-L6-v2"))


def test_packaged_model_has_empty_prompts():
    st = SentenceTransformer(_packaged(), device="cpu")
    assert resolve_prompt(st) == ("", None) and query_prompt(st) == ""
    with pytest.raises(ValueError, match="default_prompt_name 'x'"):
        st.default_prompt_name = "x"
        resolve_prompt(st)


@pytest.mark.parametrize("include_prompt,case", [(True, c) for c in CASES] + [(False, CASES[0]), (False, CASES[3])],
                         ids=lambda c: (",".join(f"{k}={v!r}" for k, v in c.items()) or "default") if isinstance(c, dict) else f"include_prompt={c}")
def test_every_row_matches_encode(models, include_prompt, case):
    st = models[include_prompt]
    prompt, _ = resolve_prompt(st, **case)
    ref = st.encode(TEXTS, batch_size=4, normalize_embeddings=True, **case)
    with Encoder(st, 3, prompt=prompt, tokenizer_threads=2, cpu_share=False) as enc:
        assert enc.mode == "fast"  # the prompt keeps the fast tokenizer path
        assert enc.prompt_length == (st[0]._get_prompt_length(prompt) if prompt else None)
        r = enc.encode(TEXTS)
    cos = cosines(r.vectors, ref)
    assert float(cos.min()) >= 0.9999, (cos.argmin(), cos.min())
    n_prompt = len(st.tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert r.tokens[2] == 3 + n_prompt and r.tokens[1] == 256
    assert r.truncated_rows == (2 if n_prompt > 2 else 1)  # text 4 is cut only by the 4-token explicit prompt
    assert r.record_tokens[1] == 300 and r.record_tokens[4] == 252 and r.covered_tokens[1] == 254 - n_prompt
    assert r.char_end[1] == len(" ".join(["word"] * (254 - n_prompt))) and r.char_end[0] == len(TEXTS[0])


def test_the_prompt_changes_the_vectors(models):
    """Without the prompt (the behaviour this replaces) rows differ from encode: the tests above can fail."""
    st = models[True]
    ref = st.encode(TEXTS, normalize_embeddings=True)
    with Encoder(st, 8, cpu_share=False) as enc:
        assert float(cosines(enc.encode(TEXTS).vectors, ref).min()) < 0.99
    # include_prompt=False leaves the prompt's tokens out of the mean: other vectors than include_prompt=True
    with Encoder(models[False], 8, prompt="passage: ", cpu_share=False) as a, \
            Encoder(st, 8, prompt="passage: ", cpu_share=False) as b:
        assert float(cosines(a.encode(TEXTS).vectors, b.encode(TEXTS).vectors).min()) < 0.999


def test_fast_tokenizer_with_a_prompt_matches_preprocess(models):
    st = models[False]
    fast = FastTokenizer.for_model(st, "query: ")
    assert fast is not None and fast.prompt_length == 3 and fast.overhead == 4
    mine = fast.pad(fast.encode(TEXTS))
    theirs = st.preprocess(TEXTS, prompt="query: ")
    assert theirs["prompt_length"] == 3
    for k in fast.keys:
        np.testing.assert_array_equal(mine[k], theirs[k].numpy())


def test_preprocess_path_applies_the_prompt(models, monkeypatch):
    st = models[False]
    ref = st.encode(TEXTS, normalize_embeddings=True)
    monkeypatch.setattr(FastTokenizer, "for_model", classmethod(lambda cls, st, prompt="": None))
    with Encoder(st, 3, prompt="passage: ", cpu_share=False) as enc:
        assert enc.mode == "preprocess"
        r = enc.encode(TEXTS)
    assert float(cosines(r.vectors, ref).min()) >= 0.9999
    assert r.truncated_rows == 1 and r.record_tokens[1] == 300 and r.covered_tokens[1] == 252


@pytest.mark.parametrize("normalize", [True, False])
def test_truncate_dim_and_normalize_match_encode(models, normalize):
    st = models[True]
    ref = st.encode(TEXTS, normalize_embeddings=normalize, truncate_dim=128)
    with Encoder(st, 8, prompt="passage: ", truncate_dim=128, normalize=normalize, cpu_share=False) as enc:
        assert enc.dim == 128
        r = enc.encode(TEXTS)
    assert r.vectors.shape == (len(TEXTS), 128)
    assert float(cosines(r.vectors, ref).min()) >= 0.9999
    norms = np.linalg.norm(r.vectors, axis=1)
    np.testing.assert_allclose(norms, np.linalg.norm(ref, axis=1), rtol=1e-4)
    if normalize:
        np.testing.assert_allclose(norms, 1.0, rtol=1e-5)
    else:  # the model's Normalize module made the full vector unit length; its first 128 dims are shorter
        assert float(norms.max()) < 0.99


def test_float16_output(models):
    st = models[True]
    ref = st.encode(TEXTS, normalize_embeddings=True)
    with Encoder(st, 8, prompt="passage: ", output_dtype="float16", cpu_share=False) as enc:
        r = enc.encode(TEXTS)
        empty = enc.encode([])
    assert r.vectors.dtype == np.float16 and empty.vectors.dtype == np.float16 and empty.vectors.shape == (0, 384)
    assert float(cosines(r.vectors, ref).min()) >= 0.9999


def test_bad_output_options(models):
    st = models[True]
    with pytest.raises(ValueError, match="truncate_dim=385: must be between 1 and the model's dimension 384"):
        Encoder(st, truncate_dim=385, cpu_share=False)
    with pytest.raises(ValueError, match="output_dtype 'int8'"):
        Encoder(st, output_dtype="int8", cpu_share=False)
    # the model's own truncate_dim applies when none is given, as in encode
    st.truncate_dim = 64
    try:
        with Encoder(st, 8, cpu_share=False) as enc:
            assert enc.dim == 64 and enc.encode(TEXTS[:2]).vectors.shape == (2, 64)
    finally:
        st.truncate_dim = None
    assert torch.get_num_threads() >= 1
