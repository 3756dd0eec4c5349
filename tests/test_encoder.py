"""The Encoder (tokenizer threads, token-count order, OOM halving, dtype, CPU threads) with the real
packaged model (all-MiniLM-L6-v2) on CPU, against plain ``SentenceTransformer.encode``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dagster_gpu.embedding.cpus import CpuAllotment, CpuShare
from dagster_gpu.embedding.encoder import Encoder, EncoderOutOfMemory, default_tokenizer_threads
from dagster_gpu.embedding.model import DTYPES, load_model, resolve_dtype
from dagster_gpu.embedding.tokenize import FastTokenizer

# Lengths from 1 to > 256 tokens, out of order, with whitespace art, accents/CJK/emoji and duplicates.
TEXTS = [
    "A penny saved is a penny earned.",
    " ".join(["word"] * 300),  # 302 tokens: truncated
    "x",
    "   ____\n  / __ \\\n | |  | |\n | |__| |\n  \\____/   ASCII art with much whitespace and few tokens",
    "Café, naïve, 日本語のテキスト. 🙂",
    " ".join(["word"] * 254),  # 256 tokens exactly: not truncated
    "Two lines\n  of wisdom from the terminal.",
    " ".join(["word"] * 255),  # 257 tokens: truncated
    "The quick brown fox jumps over the lazy dog. " * 8,
    "A penny saved is a penny earned.",
    "supercalifragilisticexpialidocious " * 3,
    "Q: What's the difference?\nA: None, really.",
] * 3


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def model():
    return load_model("all-MiniLM-L6-v2", device="cpu")


@pytest.fixture(scope="module")
def reference(model):
    return model.model.encode(TEXTS, batch_size=8, normalize_embeddings=True, convert_to_numpy=True)


@pytest.fixture
def one_thread(tmp_path):
    """A CPU share of 1 thread in a private directory; torch's thread count is restored afterwards."""
    before = torch.get_num_threads()
    share = CpuShare(CpuAllotment(1, "test"), directory=tmp_path / "share")
    yield share
    share.close()
    torch.set_num_threads(before)


def test_fast_tokenizer_matches_preprocess(model):
    fast = FastTokenizer.for_model(model.model)
    assert fast is not None and fast.keys == ("input_ids", "attention_mask", "token_type_ids")
    batch = TEXTS[:12]
    tok = fast.encode(batch)
    mine = fast.pad(tok)
    theirs = model.model.preprocess(batch)
    for k in fast.keys:
        np.testing.assert_array_equal(mine[k], theirs[k].numpy())
    hf = model.model.tokenizer
    exact = [len(hf(t, add_special_tokens=True)["input_ids"]) for t in batch]
    assert tok.lengths.tolist() == [min(n, 256) for n in exact]
    assert tok.truncated.tolist() == [n > 256 for n in exact]
    assert exact[1] == 302 and exact[5] == 256 and exact[7] == 257
    # a model batch is some rows in another order (longest first): the same tensors as preprocess of them
    idx = np.array([7, 0, 11, 1, 4])
    part = tok.take(idx)
    assert part.lengths.tolist() == [tok.lengths[i] for i in idx] and part.truncated.tolist() == [True, False, False, True, False]
    mine = fast.pad(part)
    theirs = model.model.preprocess([batch[i] for i in idx])
    for k in fast.keys:
        np.testing.assert_array_equal(mine[k], theirs[k].numpy())


def test_vectors_match_encode_for_every_row(model, reference, one_thread):
    with Encoder(model.model, 8, tokenizer_threads=3, cpu_share=one_thread) as enc:
        assert enc.mode == "fast" and enc.tokenizer_threads == 3 and enc.dtype == "float32"
        assert torch.get_num_threads() == 1 and enc.torch_threads == 1
        r = enc.encode(TEXTS)
    assert r.vectors.shape == (len(TEXTS), 384) and r.vectors.dtype == np.float32
    cos = cosines(r.vectors, reference)
    assert float(cos.min()) >= 0.999, cos.argmin()
    assert r.truncated_rows == 6  # texts 1 and 7, three times
    assert r.tokens[2] == 3 and r.tokens[1] == 256 and r.tokens[5] == 256


def test_batches_are_cut_in_token_count_order(model, one_thread):
    with Encoder(model.model, 4, tokenizer_threads=2, cpu_share=one_thread) as enc:
        plan = enc._submit(list(TEXTS)).result()
    widths = [int(c["input_ids"].shape[1]) for c in plan.chunks]
    assert widths == sorted(widths, reverse=True)
    assert [len(c["input_ids"]) for c in plan.chunks] == [4] * 9
    lengths = np.concatenate([c["_lengths"] for c in plan.chunks])
    assert lengths.tolist() == sorted(plan.tokens.tolist(), reverse=True)
    assert sum(c["input_ids"].numel() for c in plan.chunks) == sum(w * 4 for w in widths)
    # Character order (encode's) pads the ASCII-art text (104 characters, 40 tokens) with the long ones.
    char_order = np.argsort([-len(t) for t in TEXTS], kind="stable")
    padded_char = sum(int(plan.tokens[char_order[a:a + 4]].max()) * 4 for a in range(0, len(TEXTS), 4))
    assert sum(widths) * 4 <= padded_char


def test_oom_halves_the_batch_and_retries_it(model, one_thread):
    """64 texts at the model's token limit; a simulated device that holds 16 x 256 tokens per forward pass."""
    texts = [" ".join([w] * 300) for w in ("alpha", "beta", "gamma", "delta") for _ in range(16)]
    texts = [f"{i} {t}" for i, t in enumerate(texts)]
    seen = []

    def small_device(module, args):
        ids = args[0]["input_ids"]
        seen.append(tuple(ids.shape))
        if ids.shape[0] * ids.shape[1] > 16 * 256:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 96.00 MiB (simulated)")

    ref = model.model.encode(texts, batch_size=16, normalize_embeddings=True, convert_to_numpy=True)
    hook = model.model.register_forward_pre_hook(small_device)
    try:
        with Encoder(model.model, 64, tokenizer_threads=1, cpu_share=one_thread) as enc:
            r = enc.encode(texts)
            assert (enc.batch_size_initial, enc.batch_size, enc.oom_retries) == (64, 16, 2)
            r2 = enc.encode(texts[:20])  # the reduced size carries over: no more failures
            assert enc.oom_retries == 2
    finally:
        hook.remove()
    assert seen[:2] == [(64, 256), (32, 256)]
    assert all(s == (16, 256) for s in seen[2:6]) and seen[6:] == [(16, 256), (4, 256)]
    assert float(cosines(r.vectors, ref).min()) >= 0.999
    assert float(cosines(r2.vectors, ref[:20]).min()) >= 0.999
    assert r.truncated_rows == 64


def test_oom_on_a_single_text_is_an_error(model, one_thread):
    def no_memory(module, args):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    hook = model.model.register_forward_pre_hook(no_memory)
    try:
        with Encoder(model.model, 4, tokenizer_threads=1, cpu_share=one_thread) as enc:
            with pytest.raises(EncoderOutOfMemory, match="single text of 5 tokens"):
                enc.encode(["one", "two words", "three words here", "four"])
            assert enc.batch_size == 1
    finally:
        hook.remove()


def test_other_errors_are_not_retried(model, one_thread):
    def broken(module, args):
        raise RuntimeError("not a memory problem")

    hook = model.model.register_forward_pre_hook(broken)
    try:
        with Encoder(model.model, 4, tokenizer_threads=1, cpu_share=one_thread) as enc:
            with pytest.raises(RuntimeError, match="not a memory problem"):
                enc.encode(["a", "b"])
            assert (enc.batch_size, enc.oom_retries) == (4, 0)
    finally:
        hook.remove()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_weights_stay_close_to_encode(reference, one_thread, dtype):
    # dtype applies on CUDA (load_model keeps CPU in float32); the numerics of half-precision weights go
    # through the same Encoder code path here on CPU (measured: min cosine 0.999999 fp16, 0.99991 bf16).
    lm = load_model("all-MiniLM-L6-v2", device="cpu")
    lm.model.to(dtype)
    with Encoder(lm.model, 8, tokenizer_threads=2, cpu_share=one_thread) as enc:
        assert enc.dtype == str(dtype).removeprefix("torch.")
        r = enc.encode(TEXTS)
    assert r.vectors.dtype == np.float32
    assert float(cosines(r.vectors, reference).min()) >= 0.999


def test_resolve_dtype():
    assert resolve_dtype(None, "cuda") == "float32"
    assert resolve_dtype("float16", "cuda:1") == "float16"
    assert resolve_dtype("bf16", "cuda") == "bfloat16"
    assert resolve_dtype("float16", "cpu") == "float32"  # CPU always runs float32
    assert DTYPES == ("float32", "float16", "bfloat16")
    with pytest.raises(ValueError, match="dtype 'int8'"):
        resolve_dtype("int8", "cuda")
    with pytest.raises(ValueError, match="dtype 'float8'"):
        load_model("all-MiniLM-L6-v2", device="cpu", dtype="float8")


def test_default_tokenizer_threads():
    assert default_tokenizer_threads("cuda", 16) == 15
    assert default_tokenizer_threads("cuda:0", 64) == 16
    assert default_tokenizer_threads("cuda", 1) == 1
    assert default_tokenizer_threads("cpu", 16) == 1


def test_preprocess_fallback_for_a_model_without_fast_tokenizer(model, reference, one_thread, monkeypatch):
    monkeypatch.setattr(FastTokenizer, "for_model", classmethod(lambda cls, st, prompt="": None))
    with Encoder(model.model, 8, tokenizer_threads=4, cpu_share=one_thread) as enc:
        assert enc.mode == "preprocess" and enc.tokenizer_threads == 1
        r = enc.encode(TEXTS)
    assert float(cosines(r.vectors, reference).min()) >= 0.999
    assert r.truncated_rows == 6
