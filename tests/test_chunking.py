"""Chunking (chunking.TokenChunks) with the packaged MiniLM and prompted copies of it, on long texts that
Debian ships (/usr/share/common-licenses: the GFDL and Apache licence texts, thousands of tokens each).

The expected vector of a chunk is ``SentenceTransformer.encode`` of the chunk's own text
(``text[char_start:char_end]``) with the same prompt name (sentence-transformers 6.2, ``BaseModel._resolve_prompt``
and ``Transformer.preprocess``): windows start and end on word boundaries, so ``preprocess`` of that text gives
exactly the window's ids (checked row by row), and the vectors agree at cosine >= 0.9999.

Word boundaries are the pre-tokenizer's splits (``tokenizers.Encoding.word_ids``: ``PreTokenizedString::
into_encoding`` numbers each split, huggingface/tokenizers ``tokenizers/src/tokenizer/pre_tokenizer.rs``); for
MiniLM's ``BertPreTokenizer`` those are runs of letters/digits and each punctuation character, and WordPiece
continuations (``##``) never begin a word."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from dagster_gpu.embedding.chunking import TokenChunks, boundary_ends, windows, word_starts
from dagster_gpu.embedding.encoder import Encoder
from dagster_gpu.embedding.model import resolve_model_path
from prompt_models import make_prompt_model

LICENSES = Path("/usr/share/common-licenses")
LONG = [(LICENSES / "GFDL-1.3").read_text()[:4500], "A short record. It fits one window.",
        (LICENSES / "Apache-2.0").read_text()[:3000],
        # accents, CJK (one word per character for BERT), hyphens, apostrophes, numbers, long words
        " ".join(f"Paragraph {i}: the café's naïve déjà-vu, 日本語のテキスト, unbelievably "
                 f"antidisestablishmentarianism-like {i * 3.14159:.4f} results." for i in range(8))]


def cosines(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def minilm():
    return SentenceTransformer(str(resolve_model_path("all-MiniLM-L6-v2")), device="cpu")


@pytest.fixture(scope="module")
def prompted(tmp_path_factory):
    path = make_prompt_model(tmp_path_factory.mktemp("chunk-model") / "m", include_prompt=False)
    return SentenceTransformer(str(path), device="cpu")


@pytest.fixture(scope="module")
def prompted_inc(tmp_path_factory):
    path = make_prompt_model(tmp_path_factory.mktemp("chunk-model-inc") / "m", include_prompt=True)
    return SentenceTransformer(str(path), device="cpu")


def _token_span(enc, a: int, b: int) -> tuple[int, int]:
    """Token positions ``[i, j)`` of the whole record encoding ``enc`` covering characters ``[a, b)``."""
    starts = np.array([o[0] for o in enc.offsets])
    ends = np.array([o[1] for o in enc.offsets])
    i = int(np.searchsorted(starts, a, side="left"))
    j = int(np.searchsorted(ends, b, side="right"))
    assert starts[i] == a and ends[j - 1] == b, (a, b)
    return i, j


# (model fixture, prompt name encode is given, boundary): no prompt; a prompt left out of the pooling; a prompt
# pooled with the text
CASES = [("minilm", None, "token"), ("prompted", "document", "sentence"), ("prompted_inc", "document", "paragraph")]


@pytest.mark.parametrize("model,prompt_name,boundary", CASES)
def test_every_chunk_is_encode_of_its_own_text(request, model, prompt_name, boundary):
    st = request.getfixturevalue(model)
    prompt = st.prompts[prompt_name] if prompt_name else ""
    max_tokens, overlap = 64, 8
    spec = TokenChunks(max_tokens=max_tokens, overlap=overlap, boundary=boundary)
    with Encoder(st, 16, prompt=prompt, chunking=spec, tokenizer_threads=2, cpu_share=False) as enc:
        r = enc.encode(LONG)
        whole = [enc.fast.whole_tokenizer().encode(t, add_special_tokens=False) for t in LONG]
        tok, _ = enc._tokenize(LONG)
        head = 1 + len(enc.fast.prompt_ids)  # [CLS] + the prompt's ids
    fed = np.split(tok.flat, np.cumsum(tok.lengths)[:-1])
    assert head == (3 if prompt else 1) and [len(x) for x in fed] == r.tokens.tolist()
    assert r.truncated_rows == 0 and r.record_tokens.tolist() == [len(e.ids) for e in whole]
    assert r.record_tokens[0] > 800 and len(r.tokens) >= 30
    assert np.all(np.diff(r.record_index) >= 0) and sorted(set(r.record_index.tolist())) == [0, 1, 2, 3]
    assert int(r.tokens.max()) <= max_tokens

    # the chunk's own text re-tokenizes to exactly the ids the encoder fed, and encodes to the same vector
    texts = [LONG[i][a:b] for i, a, b in zip(r.record_index, r.char_start, r.char_end)]
    pre = st.preprocess(texts, prompt=prompt or None)
    for j, t in enumerate(texts):
        assert pre["input_ids"][j][pre["attention_mask"][j].bool()].tolist() == fed[j].tolist(), (j, t[:40], t[-40:])
    ref = st.encode(texts, prompt_name=prompt_name, normalize_embeddings=True, batch_size=16)
    cos = cosines(r.vectors, ref)
    assert float(cos.min()) >= 0.9999, (int(cos.argmin()), float(cos.min()))

    covered = 0
    for i, e in enumerate(whole):
        rows = np.flatnonzero(r.record_index == i)
        assert r.chunk_index[rows].tolist() == list(range(len(rows)))
        assert r.char_start[rows[0]] == e.offsets[0][0] and r.char_end[rows[-1]] == e.offsets[-1][1]
        words = np.asarray(e.word_ids)
        cuts = np.append(word_starts(e.word_ids), len(e.ids))  # word starts and the record's end
        spans = [_token_span(e, int(r.char_start[k]), int(r.char_end[k])) for k in rows]
        hit = np.zeros(len(e.ids), bool)
        for k, (a, b) in zip(rows, spans):
            hit[a:b] = True
            assert b - a == r.tokens[k] - head - 1  # the row is [CLS] + prompt + these tokens + [SEP]
            # a window starts and ends on a word boundary: never on (or before) a "##" continuation
            assert not e.tokens[a].startswith("##") and (a == 0 or words[a] != words[a - 1]), e.tokens[a - 2 : a + 2]
            assert b == len(e.ids) or (words[b] != words[b - 1] and not e.tokens[b].startswith("##"))
        covered += int(hit.sum())
        for k, ((a0, b0), (a1, b1)) in zip(rows, zip(spans, spans[1:])):
            # consecutive windows share whole words, at most ``overlap`` tokens: the text overlaps, and the
            # next window starts at the first word start at or after ``end - overlap``
            shared = b0 - a1
            assert 0 < shared <= overlap and r.char_start[k + 1] < r.char_end[k]
            assert a1 == cuts[np.searchsorted(cuts, max(b0 - overlap, a0 + 1))]
            # the window ends at the last word end that fits, or (sentence/paragraph) earlier at a preferred end
            next_word_end = cuts[np.searchsorted(cuts, b0, side="right")]
            full = next_word_end - a0 > max_tokens - head - 1
            if boundary == "token":
                assert full
            else:
                ch = int(r.char_end[k])
                at_end = LONG[i][ch - 1] in ".!?" or LONG[i][ch - 2 : ch] in ('."', ".)") or \
                    re.match(r"[^\S\n]*\n[^\S\n]*\n", LONG[i][ch:]) is not None
                assert at_end or full, LONG[i][ch - 20 : ch + 5]
    assert covered / r.record_tokens.sum() >= 0.99 and r.token_coverage >= 0.99


def test_overlap_is_shared_by_consecutive_windows(minilm):
    with Encoder(minilm, 16, chunking=TokenChunks(max_tokens=64, overlap=10), cpu_share=False) as enc:
        tok, layout = enc._tokenize(LONG[:1])
        e = enc.fast.whole_tokenizer().encode(LONG[0], add_special_tokens=False)
    rows = np.split(tok.flat, np.cumsum(tok.lengths)[:-1])
    starts = word_starts(e.word_ids).tolist() + [len(e.ids)]
    pos = 0  # the window's first record token in the whole encoding
    for a, b in zip(rows, rows[1:]):
        assert a[0] == b[0] == 101 and a[-1] == b[-1] == 102 and len(a) <= 64  # [CLS] + <= 62 tokens + [SEP]
        end = pos + len(a) - 2
        assert a[1:-1].tolist() == list(e.ids[pos:end]) and end in starts
        assert end + (min(s for s in starts if s > end) - end) - pos > 62  # the next word would not have fit
        nxt = min(s for s in starts if s >= end - 10)  # whole words of the last 10 tokens come again
        k = end - nxt
        assert 1 <= k <= 10 and a[-1 - k : -1].tolist() == b[1 : 1 + k].tolist()
        pos = nxt
    assert rows[-1][1:-1].tolist() == list(e.ids[pos:])
    assert layout.covered_tokens.tolist() == layout.record_tokens.tolist()


def test_a_word_longer_than_the_window_is_the_only_cut_inside_a_word(minilm):
    long_word = "supercalifragilistic" * 4  # 80 characters: WordPiece gives [UNK] past 100
    text = "Short words come first. " + long_word + " and then the short words again, to the end."
    with Encoder(minilm, 16, chunking=TokenChunks(max_tokens=16, overlap=3), cpu_share=False) as enc:
        r = enc.encode([text])
        e = enc.fast.whole_tokenizer().encode(text, add_special_tokens=False)
    w0 = text.index(long_word)
    w1 = w0 + len(long_word)
    n_long = sum(1 for o in e.offsets if w0 <= o[0] < w1)
    assert n_long > 14  # the word does not fit a window's 14 record tokens
    inside = [(a, b) for a, b in zip(r.char_start.tolist(), r.char_end.tolist()) if w0 < a < w1 or w0 < b < w1]
    assert len(inside) >= 2 and all(b - a <= len(long_word) for a, b in inside)
    for a, b, n in zip(r.char_start.tolist(), r.char_end.tolist(), r.tokens.tolist()):
        assert n <= 16
        if not (w0 < a < w1 or w0 < b < w1):  # every other window has a word boundary at both edges
            assert a == 0 or not text[a - 1].isalnum() or not text[a].isalnum()
            assert b == len(text) or not text[b].isalnum() or not text[b - 1].isalnum()
    # coverage stays whole: every token of the record is in some window
    hit = np.zeros(len(e.ids), bool)
    for a, b in zip(r.char_start.tolist(), r.char_end.tolist()):
        hit |= np.array([a <= o[0] and o[1] <= b for o in e.offsets])
    assert hit.all() and r.token_coverage == 1.0


def test_window_cutting_rules():
    # word starts: a window ends at the last one that fits and the next starts at the first at/after end - overlap
    assert windows(10, 4, 1, starts=np.array([0, 2, 3, 6, 8])) == [(0, 3), (2, 6), (6, 10)]
    # a word (1..8) longer than the room is cut inside, the windows after it snapped again once it ends
    assert windows(10, 3, 1, starts=np.array([0, 1, 8])) == [(0, 1), (1, 4), (4, 7), (7, 10)]
    # preferred ends count only at word starts; the overlap drops a word longer than it (5..8 is 3 > 2)
    assert windows(20, 10, 2, sentence_ends=np.array([7, 8, 15]), starts=np.array([0, 3, 5, 8, 9, 12, 15, 18])) == \
        [(0, 8), (8, 15), (15, 20)]
    assert windows(20, 10, 2, sentence_ends=np.array([7]), starts=np.array([0, 3, 5, 8, 9, 12, 15, 18])) == \
        [(0, 9), (8, 18), (18, 20)]
    assert word_starts([0, 1, 2, 2, 2, 3]).tolist() == [0, 1, 2, 5]
    assert word_starts([0, None, None, 1, 1]).tolist() == [0, 1, 2, 3] and word_starts([]).tolist() == []
    # without word starts every token is a word (the token rule)
    assert windows(10, 4, 1) == [(0, 4), (3, 7), (6, 10)]
    assert windows(0, 4, 1) == [(0, 0)]
    assert windows(3, 4, 0) == [(0, 3)]
    # a preferred end in the window's second half wins; one in the first half does not
    assert windows(20, 10, 2, sentence_ends=np.array([3, 8, 15])) == [(0, 8), (6, 15), (13, 20)]
    assert windows(20, 10, 0, sentence_ends=np.array([2])) == [(0, 10), (10, 20)]
    # paragraph ends beat sentence ends
    assert windows(20, 10, 0, np.array([9]), np.array([7])) == [(0, 7), (7, 17), (17, 20)]
    text = "One. Two!\n\nThree? \"Four.\" 3.14 five"
    offsets = np.array([(0, 3), (3, 4), (5, 8), (8, 9), (11, 16), (16, 17), (18, 19), (19, 23), (23, 24), (24, 25),
                        (26, 30), (31, 35)])
    sent, para = boundary_ends(text, offsets, "paragraph")
    assert sent.tolist() == [2, 4, 6, 10] and para.tolist() == [4]
    assert boundary_ends(text, offsets, "token")[0].tolist() == []


def test_sizes_that_leave_no_room_are_errors(prompted):
    with pytest.raises(ValueError, match="max_tokens=4 leaves no room for the record's tokens: the prompt and special tokens take 4"):
        Encoder(prompted, chunking=TokenChunks(max_tokens=4), prompt="passage: ", cpu_share=False)
    with pytest.raises(ValueError, match="overlap=6 must be below the 6 record tokens per window"):
        Encoder(prompted, chunking=TokenChunks(max_tokens=10, overlap=6), prompt="passage: ", cpu_share=False)
    with pytest.raises(ValueError, match="max_tokens=512 exceeds the model's max_seq_length=256"):
        Encoder(prompted, chunking=TokenChunks(max_tokens=512), cpu_share=False)
    with pytest.raises(ValueError, match="boundary 'word'"):
        TokenChunks(boundary="word")
    assert TokenChunks(max_tokens=128, overlap=16, boundary="sentence").describe() == \
        {"max_tokens": 128, "overlap": 16, "boundary": "sentence", "edges": "word"}
